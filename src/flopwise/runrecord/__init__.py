"""Torch-free run record: what a run directory holds and the one shape of each file."""
