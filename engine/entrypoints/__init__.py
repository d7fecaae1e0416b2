"""What runs the engine from outside Python: the command line (cli/) and the OpenAI-compatible
HTTP server (openai/).
"""
