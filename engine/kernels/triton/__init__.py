"""Triton kernels for CUDA: paged attention (attention) and the weight-only quantized product (quant).
"""
