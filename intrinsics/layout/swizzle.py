"""CuTe-style shared-memory swizzles as plain functions of a byte offset (PTX ISA 9.7.9.27.5,
"Tensor Swizzling Modes"; 9.7.15.5.1, "Shared Memory Matrix Layout").

The swizzle functions map a byte offset inside a tile to the offset where the data really lives;
they are the same functions TMA applies when it writes a box and wgmma / tcgen05 apply when they
read one.  ``Swizzle<B, M, S>`` (CuTe's notation) XORs the B bits at position M+S into the B bits
at position M.  Every mode TMA and wgmma accept keeps 16-byte chunks intact (M = 4 on byte
offsets) and repeats every 8 rows (S = 3):

    mode    bytes per row   Swizzle      chunk index ^= ...
    none    16              <0, 4, 3>    nothing
    32B     32              <1, 4, 3>    (row % 2)      when rows are 32 bytes apart
    64B     64              <2, 4, 3>    (row % 4) / 1  when rows are 64 bytes apart
    128B    128             <3, 4, 3>    (row % 8)      when rows are 128 bytes apart

The pattern is a function of the address bits, so a swizzled tile must start at an address
aligned to its repeat: 256 B for 32B, 512 B for 64B, 1024 B for 128B mode.

``intrinsics.smem`` compiles :func:`swizzle_host` and :func:`swizzle_offset_host` as the device
functions ``swizzle`` and ``swizzle_offset``: one source for the host and the kernels.
"""

__all__ = ["SWIZZLE_MODES", "swizzle_bits", "swizzle_host", "swizzle_offset_host"]

# mode (bytes) -> CuTe Swizzle<B, M, S> parameters on byte offsets.
SWIZZLE_MODES = {0: (0, 4, 3), 32: (1, 4, 3), 64: (2, 4, 3), 128: (3, 4, 3)}


def swizzle_host(offset, b, m, s):
    """CuTe ``Swizzle<b, m, s>`` applied to an integer offset (NumPy arrays welcome)."""
    mask = ((1 << b) - 1) << (m + s)
    return offset ^ ((offset & mask) >> s)


def swizzle_offset_host(byte_offset, mode):
    """Byte offset ``byte_offset`` of a tile in swizzle ``mode`` (0, 32, 64 or 128 bytes)."""
    if mode == 128:
        return byte_offset ^ ((byte_offset & 0x380) >> 3)
    if mode == 64:
        return byte_offset ^ ((byte_offset & 0x180) >> 3)
    if mode == 32:
        return byte_offset ^ ((byte_offset & 0x80) >> 3)
    return byte_offset


def swizzle_bits(mode):
    """The ``(B, M, S)`` of a swizzle mode given in bytes, or ValueError naming the valid modes."""
    if mode not in SWIZZLE_MODES:
        raise ValueError(f"swizzle mode must be one of {sorted(SWIZZLE_MODES)} bytes, got {mode!r}")
    return SWIZZLE_MODES[mode]
