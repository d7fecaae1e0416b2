"""ui/panes."""
