"""flopwise.report."""
