"""Shared test helpers (kernels, NumPy models) used by more than one test module."""
