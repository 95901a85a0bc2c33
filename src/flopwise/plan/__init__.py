"""flopwise.plan."""
