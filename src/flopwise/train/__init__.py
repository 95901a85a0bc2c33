"""flopwise.train."""
