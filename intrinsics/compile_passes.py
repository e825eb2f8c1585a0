"""Faster equivalents of numba-cuda compiler passes that are quadratic in a function's length.

numbatc's kernels are long straight-line functions (an unrolled softmax of 64 values, a
wgmma accumulator of 128), and numba-cuda's SSA reconstruction walks the whole function once
per variable assigned more than once, twice: 7.2 of the 27.7 profiled seconds that
sm90_attention's head_dim 128 kernel takes numba to compile (111 such variables, 1.24 million
statement visits).  :func:`linear_ssa` runs the same algorithm (Choi et al., numba-cuda's
``numba.cuda.core.ssa``) with the same result, visiting only the blocks where a variable
occurs:

- numba renames a variable's definitions (``_fresh_vars``) and rewrites its uses
  (``_fix_ssa_vars``) by walking every statement of every block; a block in which the
  variable does not occur comes out of such a walk as a new block with the same statements,
  which is what it gets here without the walk;
- numba finds a statement's position in its block by a linear scan per use
  (``_FixSSAVars._stmt_index``): here by a dictionary of the block's positions.

Everything else -- the order in which violators are fixed, the fresh names, where phi nodes go
and their incoming values -- is numba's own code (its handler classes and helpers are called, not
copied), so the IR that comes out is the same, statement for statement:
tests/test_compile_passes.py compares the two on generated kernels, and the PTX of every
library kernel with and without it.

Patched only inside :func:`linear_ssa` (numbatc's compiles, intrinsics.launch.compile_kernel),
only where numba-cuda's ssa module has the source this was written from
(:data:`_KNOWN_SSA_SOURCES`); ``NUMBATC_NUMBA_SSA=1`` keeps numba's own.
"""

import contextlib
import functools
import hashlib
import inspect
import os
import threading

import numpy as np

__all__ = ["linear_ssa", "memo_call_types", "ssa_patchable"]

#: sha256[:16] of numba-cuda's ``numba.cuda.core.ssa`` module source that _run_ssa_linear
#: reproduces (numba-cuda 0.30.x).
_KNOWN_SSA_SOURCES = {"e4ef931257e4dcde"}

_SSA_PATCHABLE = None


def _ssa_source_hash():
    from numba.cuda.core import ssa

    return hashlib.sha256(inspect.getsource(ssa).encode()).hexdigest()[:16]


def ssa_patchable():
    """True when numba-cuda's ssa module is the one :func:`_run_ssa_linear` was written from
    (checked by its source text, so another numba-cuda version keeps its own)."""
    global _SSA_PATCHABLE
    if _SSA_PATCHABLE is None:
        try:
            _SSA_PATCHABLE = _ssa_source_hash() in _KNOWN_SSA_SOURCES
        except Exception:
            _SSA_PATCHABLE = False
    return _SSA_PATCHABLE


def _occurrences(blocks):
    """{variable name: set of block labels where it occurs} (defined or used, by any
    statement's ``list_vars``: a superset of the blocks that numba's walks change for it)."""
    where = {}
    for label, blk in blocks.items():
        for stmt in blk.body:
            for var in stmt.list_vars():
                where.setdefault(var.name, set()).add(label)
    return where


def _rewrite(blocks, states, handler, labels):
    """numba's ``_run_block_rewrite`` for the blocks in ``labels``; every other block becomes a
    new block holding the same statements (what numba's walk makes of a block in which the
    handler changes nothing)."""
    from numba.cuda.core import ir

    newblocks = {}
    assign_types = ir.assign_types
    for label, blk in blocks.items():
        newblk = ir.Block(scope=blk.scope, loc=blk.loc)
        if label in labels:
            states["label"] = label
            states["block"] = blk
            on_assign, on_other = handler.on_assign, handler.on_other
            newblk.body = [on_assign(states, stmt) if isinstance(stmt, assign_types)
                           else on_other(states, stmt) for stmt in blk.body]
        else:
            newblk.body = list(blk.body)
        newblocks[label] = newblk
    return newblocks


def _fix_handler(cache_list_vars):
    """A new handler of numba's ``_FixSSAVars`` kind for one walk (:func:`_fix_class`)."""
    return _fix_class()(cache_list_vars)


@functools.cache
def _fix_class():
    """numba's ``_FixSSAVars`` with ``_stmt_index`` by a dictionary of positions per block (made
    once: numba is imported on first use)."""
    from numba.cuda.core import ssa

    class _FixSSAVarsIndexed(ssa._FixSSAVars):
        def __init__(self, cache):
            super().__init__(cache)
            self._positions = {}  # id(block) -> {id(stmt): first position}; one walk only

        def _stmt_index(self, defstmt, block, stop=-1):
            body = block.body
            n = len(body)
            got = self._positions.get(id(block))
            if got is None or got[0] is not block:
                pos = {}
                for i, stmt in enumerate(body):
                    pos.setdefault(id(stmt), i)
                got = self._positions[id(block)] = (block, pos)
            i = got[1].get(id(defstmt))
            # numba: the first i in range(n)[:stop] with body[i] is defstmt, else n
            if i is not None and i in range(n)[:stop]:
                return i
            return n

    return _FixSSAVarsIndexed


def _run_ssa_linear(blocks):
    """numba-cuda's ``ssa._run_ssa`` with the same result (see the module docstring)."""
    from collections import defaultdict

    from numba.cuda.core import errors, ssa
    from numba.cuda.core.analysis import compute_cfg_from_blocks

    if not blocks:
        return {}
    cfg = compute_cfg_from_blocks(blocks)
    df_plus = ssa._iterated_domfronts(cfg)
    violators = ssa._find_defs_violators(blocks, cfg)
    cache_list_vars = ssa._CacheListVars()
    # Fixing one variable renames its own definitions and uses and adds phi nodes of its own
    # names only, so where the others occur does not change.
    where = _occurrences(blocks) if violators else {}
    for varname in violators:
        labels = where.get(varname, ())
        # numba's _fresh_vars
        states = ssa._make_states(blocks)
        states["varname"] = varname
        states["defmap"] = defmap = defaultdict(list)
        blocks = _rewrite(blocks, states, ssa._FreshVarHandler(), labels)
        # numba's _fix_ssa_vars
        states = ssa._make_states(blocks)
        states["varname"] = varname
        states["defmap"] = defmap
        states["phimap"] = phimap = defaultdict(list)
        states["cfg"] = cfg
        states["phi_locations"] = ssa._compute_phi_locations(df_plus, defmap)
        blocks = _rewrite(blocks, states, _fix_handler(cache_list_vars), labels)
        for label, philist in phimap.items():
            curblk = blocks[label]
            curblk.body = philist + curblk.body
    if compute_cfg_from_blocks(blocks) != cfg:
        raise errors.CompilerError("CFG mutated in SSA pass")
    return blocks


class _SharedPatch:
    """A patch that the first block to enter installs and the last to leave removes (a count
    under a lock), so that nested and concurrent compiles share one.  ``install()`` patches and
    returns the function that undoes it."""

    def __init__(self, install):
        self._install = install
        self._lock = threading.Lock()
        self._depth = 0
        self._undo = None

    @contextlib.contextmanager
    def active(self):
        with self._lock:
            if self._depth == 0:
                self._undo = self._install()
            self._depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    self._undo()
                    self._undo = None


def _install_linear_ssa():
    from numba.cuda.core import ssa

    original = ssa._run_ssa
    ssa._run_ssa = _run_ssa_linear

    def undo():
        ssa._run_ssa = original

    return undo


_LINEAR_SSA = _SharedPatch(_install_linear_ssa)


@contextlib.contextmanager
def linear_ssa():
    """Within the block, numba-cuda's SSA reconstruction is :func:`_run_ssa_linear` (where its
    ssa module is the known one); ``NUMBATC_NUMBA_SSA=1`` keeps numba's own."""
    if os.environ.get("NUMBATC_NUMBA_SSA") or not ssa_patchable():
        yield
        return
    with _LINEAR_SSA.active():
        yield


# ---------------------------------------------------------------------------------------------
# call types, resolved once per compile
# ---------------------------------------------------------------------------------------------

_MEMO = {}


_VALUE_MEMO = {}


#: values whose equality does not imply the same numba type: (1, 2) == (1.0, 2.0), and
#: np.float32(0) == 0 inside a tuple; typeof answers them at once anyway (no failure path)
_NOT_MEMOISED = (bool, int, float, complex, str, bytes, tuple, frozenset, np.generic)


def _memo_resolve_value_type(original):
    # the type of a global (an intrinsic, an operator, np.uint32, a device function, a module):
    # numba tries typeof first, whose failure formats a coloured error message, then its table
    # of globals.  Keyed by the value's type and the value; numbers, strings and tuples are not
    # memoised (see _NOT_MEMOISED), so equal keys are the same object or equal callables.
    def resolve_value_type(self, val):
        if isinstance(val, _NOT_MEMOISED):
            return original(self, val)
        try:
            key = (self, type(val), val)
            got = _VALUE_MEMO.get(key)
        except TypeError:
            return original(self, val)
        if got is None:
            got = original(self, val)
            _VALUE_MEMO[key] = got
        return got

    return resolve_value_type


def _memo_get_call_type(original):
    def get_call_type(self, context, args, kws):
        try:
            key = (self, context, tuple(args), tuple(sorted(kws.items())) if kws else ())
            hash(key)
        except TypeError:
            return original(self, context, args, kws)
        got = _MEMO.get(key)
        if got is None:
            got = original(self, context, args, kws)
            if got is not None:
                _MEMO[key] = got
        return got

    return get_call_type


def _undefined_omitted(original):
    # lower_binop tries the operator's static form with each operand's compile-time value,
    # ir.UNDEFINED for an operand that has none (nearly all of them), four times per binop; it
    # discards any try with an UNDEFINED operand, but first builds the try's types through
    # _lit_or_omitted, where types.literal(UNDEFINED) raises and formats a LiteralTypingError
    # that _lit_or_omitted catches to answer Omitted(UNDEFINED).  The same answer, without it.
    from numba.cuda import types
    from numba.cuda.core import ir

    def lit_or_omitted(value):
        if value is ir.UNDEFINED:
            return types.Omitted(value)
        return original(value)

    return lit_or_omitted


class _PlainErrorText:
    """numba's error-message colour scheme for errors made and caught inside a compile: the
    message as it is.  numba's own, where colorama is installed, wraps every message (the
    "no_color" theme too: bold, then a reset) in colorama's init / deinit, which rewrap
    sys.stdout and sys.stderr each time; a kernel's typing and lowering raise and catch a few
    thousand such errors (template searches, constant inference, literal types)."""

    def _same(self, msg):
        return msg

    code = errmsg = filename = indicate = highlight = reset = _same


def _plain_error_text():
    """Swap numba's (and numba-cuda's) error colour scheme for :class:`_PlainErrorText` where
    the configured theme is "no_color"; returns the undo."""
    from numba.core import config
    from numba.core import errors as core_errors
    from numba.cuda.core import errors as cuda_errors

    if getattr(config, "COLOR_SCHEME", "no_color") != "no_color":
        return lambda: None
    modules = [m for m in (core_errors, cuda_errors) if hasattr(m, "_termcolor_inst")]
    saved = [(m, m._termcolor_inst) for m in modules]
    for m in modules:
        m._termcolor_inst = _PlainErrorText()

    def undo():
        for m, inst in saved:
            m._termcolor_inst = inst

    return undo


def _nothing_to_inline(func_ir):
    """True where numba's InlineClosureCallPass has nothing to do in ``func_ir``: it inlines
    closures (a ``make_function``), ``reduce`` calls and list comprehensions that build arrays
    (a ``build_list``), and none of these occur."""
    from numba.cuda.core import ir

    for blk in func_ir.blocks.values():
        for stmt in blk.body:
            value = getattr(stmt, "value", None)
            if isinstance(value, ir.Expr):
                if value.op in ("make_function", "build_list"):
                    return False
                if value.op == "getattr" and value.attr == "reduce":
                    return False
            elif isinstance(value, (ir.Global, ir.FreeVar)):
                if value.name == "reduce" or value.value is functools.reduce:
                    return False
    return True


#: sha256[:16] of numba-cuda's InlineClosureLikes.run_pass and InlineClosureCallPass.run sources
#: that :func:`_lean_inline_closure_likes`' shortcut was checked against (numba-cuda 0.30.x)
_KNOWN_INLINE_SOURCES = {"f8a9b6156db234b3"}


def _inline_source_hash():
    from numba.cuda.core import inline_closurecall, untyped_passes

    src = (inspect.getsource(untyped_passes.InlineClosureLikes.run_pass)
           + inspect.getsource(inline_closurecall.InlineClosureCallPass.run))
    return hashlib.sha256(src.encode()).hexdigest()[:16]


def _lean_inline_closure_likes(original):
    # numba's InlineClosureLikes pass runs InlineClosureCallPass -- a full liveness analysis
    # with ir.Del statements inserted and removed again, and a walk over every statement and
    # loop -- then a second liveness analysis (PostProcessor) and fixup_var_define_in_scope.
    # numbatc's kernels have nothing it inlines (:func:`_nothing_to_inline`); for them the
    # pass is its second half, whose canonical CFG and lifetimes are what the first half
    # leaves too.
    from numba.cuda.core import postproc
    from numba.cuda.core.ir_utils import fixup_var_define_in_scope

    def run_pass(self, state):
        if not _nothing_to_inline(state.func_ir):
            return original(self, state)
        postproc.PostProcessor(state.func_ir).run()
        fixup_var_define_in_scope(state.func_ir.blocks)
        return True

    return run_pass


def _install_memos():
    from numba.core.types import functions
    from numba.cuda import lowering
    from numba.cuda.core import untyped_passes
    from numba.cuda.typing import context

    get_call_type = functions.BaseFunction.__dict__["get_call_type"]
    resolve = context.BaseContext.__dict__["resolve_value_type"]
    lit_or_omitted = lowering._lit_or_omitted
    functions.BaseFunction.get_call_type = _memo_get_call_type(get_call_type)
    context.BaseContext.resolve_value_type = _memo_resolve_value_type(resolve)
    lowering._lit_or_omitted = _undefined_omitted(lit_or_omitted)
    plain_undo = _plain_error_text()
    inline_pass = untyped_passes.InlineClosureLikes
    inline_run = inline_pass.__dict__["run_pass"]
    try:  # another numba-cuda's pass may do more than the shortcut knows: it keeps its own
        lean = _inline_source_hash() in _KNOWN_INLINE_SOURCES
    except Exception:
        lean = False
    if lean:
        inline_pass.run_pass = _lean_inline_closure_likes(inline_run)

    def undo():
        plain_undo()
        inline_pass.run_pass = inline_run
        functions.BaseFunction.get_call_type = get_call_type
        context.BaseContext.resolve_value_type = resolve
        lowering._lit_or_omitted = lit_or_omitted
        _MEMO.clear()
        _VALUE_MEMO.clear()

    return undo


_MEMOS = _SharedPatch(_install_memos)


@contextlib.contextmanager
def memo_call_types():
    """Within the block, numba's ``BaseFunction.get_call_type`` (the template search behind
    every operator, intrinsic and numpy function call a kernel makes) answers a repeated
    (function, typing context, argument types) from the first answer, and the typing context's
    ``resolve_value_type`` a repeated global or constant, lowering's static-operand types of a
    binop skip a raised error (:func:`_undefined_omitted`), the errors numba raises and
    catches while it compiles keep their text uncoloured (:class:`_PlainErrorText`), and the
    closure-inlining pass runs only its second half where nothing is to be inlined
    (:func:`_lean_inline_closure_likes`, for the numba-cuda source it was checked against);
    the memos are dropped when the last block leaves.  ``NUMBATC_NUMBA_MEMO=1`` turns them
    off."""
    if os.environ.get("NUMBATC_NUMBA_MEMO"):
        yield
        return
    with _MEMOS.active():
        yield
