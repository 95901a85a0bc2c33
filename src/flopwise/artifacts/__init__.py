"""Models out of a run: consolidated checkpoints, HF folders, sampling."""
