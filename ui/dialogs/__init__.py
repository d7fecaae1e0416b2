"""ui/dialogs."""
