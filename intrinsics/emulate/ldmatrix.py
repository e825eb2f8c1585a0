"""Emulation of ldmatrix / stmatrix / movmatrix: warp-collective, with the hardware's addressing
(lanes 8m..8m+7 name the rows of matrix m; row addresses 16-byte aligned) and the fragment table
of intrinsics.layout.fragments.ldmatrix_fragment."""

import numpy as np

from intrinsics.emulate import memory
from intrinsics.emulate.runtime import EmulationError, collective, current
from intrinsics.layout.fragments import ldmatrix_fragment


def _check_rows(op, addresses, num):
    for lane in range(8 * num):
        if addresses[lane] % 16:
            raise EmulationError(
                f"{current().where()}: {op}: lane {lane} gave row address {addresses[lane]}, "
                "which is not 16-byte aligned"
            )


def _pack(matrix, fmap):
    lo = matrix[fmap[:, 0, 0], fmap[:, 0, 1]].astype(np.uint32)
    hi = matrix[fmap[:, 1, 0], fmap[:, 1, 1]].astype(np.uint32)
    return lo | (hi << np.uint32(16))


def ldmatrix_op(num, trans=False):
    name = f"ldmatrix.sync.aligned.m8n8.x{num}{'.trans' if trans else ''}.shared.b16"
    fmap = ldmatrix_fragment(trans)

    def compute(lanes):
        _check_rows(name, lanes, num)
        regs = np.zeros((32, num), dtype=np.uint32)
        for m in range(num):
            rows = [memory.shared_bytes(lanes[8 * m + r], 16).view(np.uint16) for r in range(8)]
            regs[:, m] = _pack(np.stack(rows), fmap)
        return [tuple(np.uint32(x) for x in r) if num > 1 else np.uint32(r[0]) for r in regs]

    def ldmatrix(array, index):
        return collective("warp", name, memory.shared_address(array, index), compute)

    ldmatrix.__name__ = name
    return ldmatrix


def stmatrix_op(num, trans=False):
    name = f"stmatrix.sync.aligned.m8n8.x{num}{'.trans' if trans else ''}.shared.b16"
    fmap = ldmatrix_fragment(trans)

    def compute(lanes):
        addresses = [lanes[i][0] for i in range(32)]
        _check_rows(name, addresses, num)
        regs = np.array([[int(x) for x in (lanes[i][1] if num > 1 else (lanes[i][1],))]
                         for i in range(32)], dtype=np.uint32)
        for m in range(num):
            matrix = np.zeros((8, 8), dtype=np.uint16)
            matrix[fmap[:, 0, 0], fmap[:, 0, 1]] = regs[:, m] & 0xFFFF
            matrix[fmap[:, 1, 0], fmap[:, 1, 1]] = regs[:, m] >> 16
            for r in range(8):
                memory.shared_bytes(addresses[8 * m + r], 16).view(np.uint16)[:] = matrix[r]
        return [None] * 32

    def stmatrix(array, index, fragment):
        collective("warp", name, (memory.shared_address(array, index), fragment), compute)

    stmatrix.__name__ = name
    return stmatrix


_PLAIN = ldmatrix_fragment(False)


def movmatrix_trans(fragment):
    def compute(lanes):
        regs = np.array([int(lanes[i]) for i in range(32)], dtype=np.uint32)
        matrix = np.zeros((8, 8), dtype=np.uint16)
        matrix[_PLAIN[:, 0, 0], _PLAIN[:, 0, 1]] = regs & 0xFFFF
        matrix[_PLAIN[:, 1, 0], _PLAIN[:, 1, 1]] = regs >> 16
        return [np.uint32(x) for x in _pack(matrix.T.copy(), _PLAIN)]

    return collective("warp", "movmatrix.sync.aligned.m8n8.trans.b16", fragment, compute)


EMULATIONS = {"movmatrix_trans": movmatrix_trans}
EMULATIONS.update({f"ldmatrix_x{n}{'_trans' if t else ''}": ldmatrix_op(n, t)
                   for n in (1, 2, 4) for t in (False, True)})
EMULATIONS.update({f"stmatrix_x{n}{'_trans' if t else ''}": stmatrix_op(n, t)
                   for n in (1, 2, 4) for t in (False, True)})
FACTORIES = {"ldmatrix_op": ldmatrix_op, "stmatrix_op": stmatrix_op}
