"""engine/kernels."""
