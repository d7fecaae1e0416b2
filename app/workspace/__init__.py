"""app/workspace."""
