"""engine/runner."""
