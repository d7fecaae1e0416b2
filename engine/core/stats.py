"""EngineStats: what `Engine.stats()` reports (the KV pool, the prefix cache,
speed, the queue), a plain record safe to hand to any thread."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class EngineStats:
    pages_total: int
    pages_used: int
    pages_cached: int  # evictable pages still holding reusable prefixes
    pages_free: int
    page_size: int
    # Prompt tokens run through the model, and those a request took from
    # pages already computed (the prefix cache, or another request's shared
    # prefill): each request counted once, from its first admission, so a
    # recompute after preemption is in neither.
    prompt_tokens_computed: int
    prompt_tokens_reused: int
    prefix_hit_rate: float  # reused / (reused + computed)
    generated_tokens: int
    decode_tokens_per_s: float  # over the recent steps that decoded
    preemptions: int
    running: int
    waiting: int
    recent_ttft_s: tuple[float, ...]  # time to first token of recent requests
    device: str  # "cpu", "cuda:0"
    dtype: str  # the products' input dtype: "bfloat16", "float16", "float32"
    # Tokens a conversation may hold: the model's trained context, or
    # EngineConfig.max_context where that is smaller.
    max_context: int
    # The KV pool's size, and how much of it holds memory: on the CPU pages
    # are committed as they are first used, on CUDA all at start.
    kv_bytes_total: int
    kv_bytes_committed: int
    # How the weights are held: "q4_1+q8_0 (kernel)" (run quantized),
    # "float32 (dequantized from q4_1+q8_0)", "bfloat16".
    weights: str

