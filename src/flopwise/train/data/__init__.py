"""The trainer's data: corpora and HF datasets into cached token shards, and the loader."""
