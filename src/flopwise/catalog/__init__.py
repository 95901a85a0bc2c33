"""Catalogs of hardware and models, loaded from `flopwise/specs/*.yaml`."""
