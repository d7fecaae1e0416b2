"""The model as plain tensors: ModelConfig, the Llama-family forward (llama), attention over the paged
KV cache (attention, kv_cache), float and block-quantized products (linear, quant), the sampler and
the tokenizer with its chat template.
"""
