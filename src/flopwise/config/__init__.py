"""Torch-free run configuration: the schema, loading YAML + overrides, precision modes."""
