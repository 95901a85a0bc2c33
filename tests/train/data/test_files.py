"""prepare_data on real files: every format, the cache, concurrent builders."""

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
from flopwise.train.data.loader import TokenLoader
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
