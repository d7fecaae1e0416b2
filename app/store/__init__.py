"""app/store."""
