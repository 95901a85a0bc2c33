"""flopwise.compress."""
