"""engine/entrypoints/openai."""
