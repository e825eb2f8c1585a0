"""numbatc.intrinsics: typed Numba intrinsics that emit the PTX of NVIDIA's tensor-core,
asynchronous-copy and synchronisation instructions."""
from intrinsics.mma import mma_sync, mma_specs  # noqa: F401
