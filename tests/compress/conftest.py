"""Shared fixtures for the compress tests: tiny, quickly trained digits models."""

import pytest
import torch

from flopwise.compress.tasks import digits_task


@pytest.fixture(scope="session")
def cnn_task():
    """A small digits CNN trained for a few epochs (a real, if modest, accuracy)."""
    torch.set_num_threads(1)
    return digits_task("digits-cnn", {"channels": 8, "head": 32}, epochs=4)


@pytest.fixture(scope="session")
def mlp_task():
    """A small Linear-heavy digits MLP."""
    torch.set_num_threads(1)
    return digits_task("digits-mlp", {"width": 64, "ffn": 128, "n_blocks": 2}, epochs=4)
