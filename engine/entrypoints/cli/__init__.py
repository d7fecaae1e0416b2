"""engine/entrypoints/cli."""
