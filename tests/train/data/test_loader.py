"""TokenLoader on real shards: windows, rank splits, epochs, resume with another world size."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from flopwise.errors import UserError
from flopwise.config.schema import DataConfig
from flopwise.train.data.loader import TokenLoader
from flopwise.train.data.prepare import prepare_data


def _count_config(tmp_path: Path, path: Path) -> DataConfig:
    return DataConfig(paths=[str(path)], cache_dir=tmp_path / "cache", vocab_size=5000, val_fraction=0.05)


@pytest.fixture
def counting_tokens(tmp_path: Path):
    """A token stream 0, 1, 2, ... so every window's content names its position."""
    path = tmp_path / "count.bin"
    np.arange(4001, dtype=np.uint16).tofile(path)
    return prepare_data(_count_config(tmp_path, path))


def test_batches_are_contiguous_windows_with_shifted_targets(counting_tokens):
    loader = TokenLoader(counting_tokens, "train", seq_len=8, micro_batch_size=4, seed=3, prefetch=2)
    inputs, targets = next(loader)
    assert inputs.shape == targets.shape == (4, 8)
    assert loader.tokens_per_batch == 32
    for row, window in zip(inputs, loader.window_ids(0)):
        assert row.tolist() == list(range(window * 8, window * 8 + 8))
    assert torch.equal(targets, inputs + 1)
    loader.close()


def test_ranks_are_disjoint_and_cover_each_epoch_once(counting_tokens):
    world, batch, seq_len = 3, 5, 8
    loaders = [
        TokenLoader(counting_tokens, "train", seq_len, batch, rank=r, world_size=world, seed=7, prefetch=0)
        for r in range(world)
    ]
    windows = loaders[0].num_windows  # (3801 - 1) // 8 = 475
    steps = -(-2 * windows // (world * batch))  # a bit more than two epochs
    seen = []
    for _ in range(steps):
        for loader in loaders:
            inputs, _ = next(loader)
            seen.extend(int(row[0]) // seq_len for row in inputs)
    first, second = seen[:windows], seen[windows : 2 * windows]
    assert sorted(first) == list(range(windows)) == sorted(second)
    assert first != second  # a new permutation per epoch


def test_resume_gives_the_same_next_batches_with_prefetch(counting_tokens):
    reference = TokenLoader(counting_tokens, "train", 8, 4, rank=1, world_size=2, seed=11, prefetch=3)
    for _ in range(70):  # 560 samples: past the end of the first epoch (475 windows)
        next(reference)
    state = json.loads(json.dumps(reference.state_dict()))
    expected = [next(reference) for _ in range(10)]
    resumed = TokenLoader(counting_tokens, "train", 8, 4, rank=1, world_size=2, seed=0, prefetch=3)
    next(resumed)  # its prefetch thread is running ahead when the state arrives
    resumed.load_state_dict(state)
    assert state["epoch"] == 1
    for want, got in zip(expected, (next(resumed) for _ in range(10))):
        assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])
    reference.close()
    resumed.close()


def test_resume_with_another_world_size_reads_each_sample_once(counting_tokens):
    seq_len = 8
    before = [TokenLoader(counting_tokens, "train", seq_len, 3, rank=r, world_size=2, seed=5, prefetch=2) for r in range(2)]
    windows = before[0].num_windows
    seen = []
    for _ in range(25):
        for loader in before:
            seen.extend(int(row[0]) // seq_len for row in next(loader)[0])
    state = before[0].state_dict()
    assert state == before[1].state_dict()
    after = [TokenLoader(counting_tokens, "train", seq_len, 2, rank=r, world_size=3, seed=5, prefetch=2) for r in range(3)]
    for loader in after:
        loader.load_state_dict(state)
    while len(seen) < windows:
        for loader in after:
            seen.extend(int(row[0]) // seq_len for row in next(loader)[0])
    assert sorted(seen[:windows]) == list(range(windows))
    uninterrupted = TokenLoader(counting_tokens, "train", seq_len, 1, seed=5, prefetch=0)
    assert seen[:windows] == [int(next(uninterrupted)[0][0, 0]) // seq_len for _ in range(windows)]


def test_val_is_the_same_fixed_sequence_every_time(counting_tokens):
    loader = TokenLoader(counting_tokens, "val", 8, 2, seed=1, prefetch=2)
    first = [b[0] for b in loader.val_batches(4)]
    again = [b[0] for b in loader.val_batches(4)]
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert int(first[0][0, 0]) == 3801  # val is the tail of this token file, read in order
    assert int(first[1][0, 0]) == 3801 + 2 * 8


def test_loader_refuses_mismatched_state_and_short_splits(counting_tokens):
    loader = TokenLoader(counting_tokens, "train", 8, 2, prefetch=0)
    state = loader.state_dict()
    other = TokenLoader(counting_tokens, "train", 16, 2, prefetch=0)
    with pytest.raises(UserError, match="seq_len 8"):
        other.load_state_dict(state)
    with pytest.raises(UserError, match="val split has 200 tokens, fewer than seq_len"):
        TokenLoader(counting_tokens, "val", 256, 2)
    with pytest.raises(UserError, match="allowed: train, val"):
        TokenLoader(counting_tokens, "test", 8, 2)


def test_data_with_reordered_windows_is_refused_on_resume(tmp_path):
    """Same size, same number of windows, other order: only the fingerprint tells them apart."""
    path = tmp_path / "count.bin"
    tokens = np.arange(4001, dtype=np.uint16)
    tokens.tofile(path)
    config = _count_config(tmp_path, path)
    before = prepare_data(config)
    meta = json.loads((before.path / "meta.json").read_text())
    assert meta["sha256"]["train"] == before.sha256("train")  # stored when the entry was built
    loader = TokenLoader(before, "train", 8, 2, prefetch=0)
    next(loader)
    state = loader.state_dict()
    assert state["sha256"] == meta["sha256"]["train"]

    windows = tokens[:4000].reshape(-1, 8)
    np.concatenate([windows[::-1].ravel(), tokens[4000:]]).tofile(path)  # windows reversed, same size
    after = prepare_data(config)
    resumed = TokenLoader(after, "train", 8, 2, prefetch=0)
    assert resumed.num_windows == loader.num_windows
    with pytest.raises(UserError) as err:
        resumed.load_state_dict(state)
    assert "\n" not in str(err.value) and "the train data changed since the checkpoint" in str(err.value)
    del state["sha256"]  # a checkpoint written before the fingerprint existed still resumes
    resumed.load_state_dict(state)
