"""app/models."""
