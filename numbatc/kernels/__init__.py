"""Kernels named by architecture and job (sm80_gemm, sm90_gemm ...) and the dispatcher that
picks one for a problem."""
