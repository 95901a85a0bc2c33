"""Training techniques, one unit and one switch each: precision, checkpointing, compression."""
