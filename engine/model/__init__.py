"""engine/model."""
