"""Shared test fixtures."""

import os

# Two cores on CI: keep every process to one intra-op thread unless a test says otherwise.
os.environ.setdefault("OMP_NUM_THREADS", "1")
