"""Hand-written kernels: native/ (C for the CPU, built per CPU variant on first use) and triton/
(attention and quantized products for CUDA).
"""
