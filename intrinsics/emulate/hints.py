"""Emulation of intrinsics.hints: the value itself (the asm emits no instruction)."""

from intrinsics.emulate.runtime import EmulationError

_KINDS = (int, float)


def opaque(value):
    items = value if isinstance(value, tuple) else (value,)
    for item in items:
        if not isinstance(item, _KINDS) and not hasattr(item, "dtype"):
            raise EmulationError(f"opaque takes a number or a tuple of numbers, got {value!r}")
    return value


EMULATIONS = {"opaque": opaque}
