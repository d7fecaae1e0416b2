"""engine/kernels/triton."""
