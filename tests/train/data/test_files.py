"""prepare_data and TokenLoader on real files: every format, the cache, rank splits, resume."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from flopwise.errors import UserError
from flopwise.config.schema import DataConfig
from flopwise.train.data.files import TokenLoader
from flopwise.train.data.prepare import prepare_data

VOCAB = 300  # 256 bytes + a few merges: tokenizer training on tiny corpora stays instant


def _doc(i: int) -> str:
    return f"def function_{i}(x):\n    return x * {i} + sum(range({i}))  # document {i}\n" * (3 + i % 5)


def _config(tmp_path: Path, paths: list[str], **overrides) -> DataConfig:
    values = dict(paths=paths, cache_dir=tmp_path / "cache", vocab_size=VOCAB, val_fraction=0.1)
    values.update(overrides)
    return DataConfig(**values)


@pytest.fixture
def text_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "corpus"
    (folder / "sub").mkdir(parents=True)
    for i in range(20):
        where = folder / "sub" if i % 2 else folder
        (where / f"doc_{i:02d}.txt").write_text(_doc(i))
    (folder / ".hidden").write_text("never read")
    return folder


def _decoded_stream(prepared, split: str) -> str:
    tokens = np.concatenate([np.fromfile(p, dtype=prepared.token_dtype) for p in prepared.shards(split)])
    return prepared.tokenizer.decode(tokens.tolist(), skip_special_tokens=False)


def test_text_file_round_trips_through_tokenizer(tmp_path):
    path = tmp_path / "one.md"
    text = "".join(_doc(i) for i in range(30)) + "ünïcödé ✓\n"
    path.write_text(text)
    prepared = prepare_data(_config(tmp_path, [str(path)]))
    assert prepared.tokenizer.decode(prepared.tokenizer.encode(text).ids) == text
    assert prepared.vocab_size <= VOCAB and prepared.token_dtype == "uint16"
    # One document: the validation part is the tail of the token stream.
    assert prepared.train_tokens > 0 and prepared.val_tokens > 0
    joined = _decoded_stream(prepared, "train") + _decoded_stream(prepared, "val")
    assert joined == text + "<|endoftext|>"


def test_folder_reads_every_file_sorted_and_holds_out_whole_documents(tmp_path, text_folder):
    prepared = prepare_data(_config(tmp_path, [str(text_folder)]))
    assert prepared.input_files == 20  # the hidden file is skipped
    assert prepared.meta["documents"] == {"train": 18, "val": 2}
    train, val = _decoded_stream(prepared, "train"), _decoded_stream(prepared, "val")
    val_docs = [d for d in val.split("<|endoftext|>") if d]
    assert len(val_docs) == 2
    for doc in val_docs:
        assert doc not in train
    # Sorted order: doc_00.txt, doc_02.txt, ... then sub/doc_01.txt ...; every 10th is held out.
    assert val_docs == [_doc(18), _doc(19)]


def test_glob_selects_matching_files_only(tmp_path, text_folder):
    prepared = prepare_data(_config(tmp_path, [str(text_folder / "**" / "doc_1*.txt")]))
    assert prepared.input_files == 10


def test_jsonl_uses_text_field(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps({"body": _doc(i), "id": i}) + "\n" for i in range(20)))
    prepared = prepare_data(_config(tmp_path, [str(path)], text_field="body"))
    assert prepared.meta["documents"] == {"train": 18, "val": 2}
    assert _decoded_stream(prepared, "val") == _doc(9) + "<|endoftext|>" + _doc(19) + "<|endoftext|>"


def test_jsonl_line_without_field_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"other": "x"}) + "\n")
    with pytest.raises(UserError, match=r"bad\.jsonl:2: no field 'text'"):
        prepare_data(_config(tmp_path, [str(path)]))


def test_tfrecord_bytes_feature(tmp_path):
    from tfrecord import TFRecordWriter

    path = tmp_path / "data.tfrecord"
    writer = TFRecordWriter(str(path))
    for i in range(20):
        writer.write({"text": (_doc(i).encode(), "byte"), "label": (i, "int")})
    writer.close()
    prepared = prepare_data(_config(tmp_path, [str(path)]))
    assert prepared.meta["documents"] == {"train": 18, "val": 2}
    assert _decoded_stream(prepared, "train").startswith(_doc(0) + "<|endoftext|>" + _doc(1))
    with pytest.raises(UserError, match=r"data\.tfrecord: record 1 has no feature 'body'"):
        prepare_data(_config(tmp_path, [str(path)], text_field="body"))


def test_uint16_bin_tokens_are_copied_without_a_tokenizer(tmp_path):
    ids = (np.arange(10_000) % 1000).astype(np.uint16)
    path = tmp_path / "tokens.bin"
    ids.tofile(path)
    prepared = prepare_data(_config(tmp_path, [str(path)], vocab_size=1000, token_dtype="uint16"))
    assert prepared.tokenizer is None and prepared.vocab_size == 1000
    assert (prepared.train_tokens, prepared.val_tokens) == (9000, 1000)
    stream = np.concatenate([np.fromfile(p, dtype=np.uint16) for p in prepared.train_shards + prepared.val_shards])
    assert np.array_equal(stream, ids)


def test_uint32_npy_tokens_keep_large_ids(tmp_path):
    ids = np.arange(70_000, 75_000, dtype=np.uint32)
    np.save(tmp_path / "tokens.npy", ids)
    prepared = prepare_data(_config(tmp_path, [str(tmp_path / "tokens.npy")], vocab_size=80_000))
    assert prepared.token_dtype == "uint32"
    loader = TokenLoader(prepared, "train", seq_len=16, micro_batch_size=2, seed=0, prefetch=0)
    inputs, targets = next(loader)
    assert inputs.dtype == torch.int64 and int(inputs.min()) >= 70_000
    assert torch.equal(targets, inputs + 1)  # consecutive ids: targets are the next token


def test_token_ids_beyond_vocab_are_refused(tmp_path):
    path = tmp_path / "tokens.bin"
    np.array([1, 2, 5000], dtype=np.uint16).tofile(path)
    with pytest.raises(UserError, match=r"tokens\.bin holds token id 5000.*vocab_size is 4096"):
        prepare_data(_config(tmp_path, [str(path)], vocab_size=4096))


def test_second_call_loads_the_cache_without_rebuilding(tmp_path, text_folder):
    cfg = _config(tmp_path, [str(text_folder)])
    first = prepare_data(cfg)
    stamps = {p: p.stat().st_mtime_ns for p in first.train_shards + [first.tokenizer_path]}
    second = prepare_data(cfg)
    assert not first.cache_hit and second.cache_hit
    assert second.path == first.path
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [first.path.name]  # no staging left
    # A changed input is a different entry.
    (text_folder / "doc_00.txt").write_text("changed\n" * 50)
    assert prepare_data(cfg).path != first.path


def test_loaded_tokenizer_is_used_instead_of_training(tmp_path, text_folder):
    trained = prepare_data(_config(tmp_path, [str(text_folder)]))
    cfg = _config(tmp_path, [str(text_folder)], tokenizer=trained.tokenizer_path, val_fraction=0.2)
    loaded = prepare_data(cfg)
    assert loaded.path != trained.path
    assert loaded.tokenizer.get_vocab() == trained.tokenizer.get_vocab()


def test_concurrent_processes_publish_one_complete_entry(tmp_path, text_folder):
    script = (
        "import sys; from flopwise.config.schema import DataConfig; "
        "from flopwise.train.data.prepare import prepare_data; "
        f"p = prepare_data(DataConfig(paths=[{str(text_folder)!r}], cache_dir={str(tmp_path / 'cache')!r}, "
        f"vocab_size={VOCAB}, val_fraction=0.1)); print(p.path, p.train_tokens)"
    )
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [proc.communicate(timeout=120)[0].strip() for proc in procs]
    assert all(proc.returncode == 0 for proc in procs)
    assert outputs[0] == outputs[1]
    assert len(list((tmp_path / "cache").iterdir())) == 1


def test_standard_library_corpus_with_small_cap(tmp_path):
    prepared = prepare_data(DataConfig(cache_dir=tmp_path / "cache", max_bytes=300_000, vocab_size=512))
    assert prepared.truncated and prepared.input_bytes <= 300_000
    assert prepared.input_files > 100
    assert "def " in _decoded_stream(prepared, "train")


@pytest.mark.parametrize(
    ("paths", "message"),
    [
        (["missing.txt"], r"missing\.txt does not exist"),
        (["empty_dir"], r"empty_dir contains no files"),
        (["*.nothing"], r"\*\.nothing' matches no files"),
        (["latin1.txt"], r"latin1\.txt is not UTF-8"),
        (["empty.txt"], r"empty\.txt\) holds no text"),
        (["odd.bin"], r"odd\.bin is 3 bytes"),
    ],
)
def test_bad_inputs_name_the_path(tmp_path, monkeypatch, paths, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty_dir").mkdir()
    (tmp_path / "latin1.txt").write_bytes("café\n".encode("latin-1"))
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "odd.bin").write_bytes(b"abc")
    with pytest.raises(UserError, match=message):
        prepare_data(_config(tmp_path, paths))


# ----------------------------------------------------------------------------- loader


@pytest.fixture
def counting_tokens(tmp_path: Path):
    """A token stream 0, 1, 2, ... so every window's content names its position."""
    path = tmp_path / "count.bin"
    np.arange(4001, dtype=np.uint16).tofile(path)
    return prepare_data(_config(tmp_path, [str(path)], vocab_size=5000, val_fraction=0.05))


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
    config = _config(tmp_path, [str(path)], vocab_size=5000, val_fraction=0.05)
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
