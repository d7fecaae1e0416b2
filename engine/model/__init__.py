"""The model as plain tensors: ModelConfig and the families it reads (config, families), the
decoder every family runs on (decoder), attention over the paged KV cache (attention, kv_cache), float and block-quantized products (linear, quant), the sampler and
the tokenizer with its chat template.
"""
