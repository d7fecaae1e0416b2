"""app/remote."""
