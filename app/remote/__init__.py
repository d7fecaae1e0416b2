"""Beyond this process: the client for remote OpenAI-compatible servers, a pane backed by one, and the
local server that serves the window's loaded engines.
"""
