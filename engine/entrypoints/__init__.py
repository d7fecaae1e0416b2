"""engine/entrypoints."""
