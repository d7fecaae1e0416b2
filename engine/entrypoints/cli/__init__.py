"""`python -m engine generate | chat | serve`: main (parser, dispatch), options (flags from
engine.config and engine.params), loading (progress on stderr, open_engine), generate, chat, serve.
"""
