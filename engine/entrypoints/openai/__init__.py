"""The OpenAI-compatible HTTP server; its public names are in
`engine.entrypoints.openai.server`, which also maps the modules here."""
