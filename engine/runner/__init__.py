"""Turning a scheduled step into one forward pass: the CPU runner (cpu), the CUDA runner with Triton
attention and CUDA graphs (cuda, cuda_attention, cuda_graphs), the CPU thread policy (threads), and
every sizing rule (memory: KV page bytes, the default pool, the GPU's KV budget).
"""
