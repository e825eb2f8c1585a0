"""Kernels named by architecture and job (sm80_gemm, sm90_gemm ...), the machinery they share
(build: generated-source loading and the disk cache; epilogue: the GEMM variant, fused epilogue,
split-K and launch; pipeline: the shared-memory ring) and the dispatcher that picks one for a
problem."""
