"""flopwise: plan, train, compress and diagnose large-model training."""

__version__ = "0.1.0"
