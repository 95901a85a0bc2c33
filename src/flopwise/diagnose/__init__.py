"""flopwise.diagnose."""
