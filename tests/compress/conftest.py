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


@pytest.fixture(autouse=True, scope="session")
def _artifact_key_home(tmp_path_factory):
    """Sign compressed folders with a key of the test session, not the user's own (~/.config/flopwise)."""
    import os

    previous = os.environ.get("XDG_CONFIG_HOME")
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path_factory.mktemp("config-home"))
    yield
    if previous is None:
        os.environ.pop("XDG_CONFIG_HOME", None)
    else:
        os.environ["XDG_CONFIG_HOME"] = previous
