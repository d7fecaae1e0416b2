"""The engine's loop and its bookkeeping: EngineCore (the engine thread), the scheduler (continuous
batching), the page pool (KV pages and the prefix cache), sequences, the incremental detokenizer,
batch handles and EngineStats.
"""
