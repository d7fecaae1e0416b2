"""ui/window."""
