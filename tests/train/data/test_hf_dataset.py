"""`data.hf_dataset`: offline `datasets` sources become the same cached token shards as any corpus."""

from __future__ import annotations

import json

import numpy as np
import pytest

from flopwise.errors import UserError
from flopwise.config.loading import load_config
from flopwise.train.data.files import open_shard
from flopwise.train.data.loader import TokenLoader
from flopwise.train.data.prepare import prepare_data
from tests.hf_fixtures import corpus_lines, write_jsonl, write_pretrained

N = 120


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """The same records as JSONL, CSV, parquet, a folder of JSONL files and a save_to_disk folder."""
    import datasets

    root = tmp_path_factory.mktemp("hfdata")
    write_jsonl(root / "data.jsonl", N)
    records = datasets.Dataset.from_list([{"text": line, "id": i} for i, line in enumerate(corpus_lines(N))])
    records.to_csv(str(root / "data.csv"))
    records.to_parquet(str(root / "data.parquet"))
    records.save_to_disk(str(root / "saved"))
    (root / "folder").mkdir()
    lines = (root / "data.jsonl").read_text().splitlines(keepends=True)
    (root / "folder" / "a.jsonl").write_text("".join(lines[: N // 2]))
    (root / "folder" / "b.jsonl").write_text("".join(lines[N // 2:]))
    chats = [{"messages": [{"role": "user", "content": f"how many apples, {i}?"},
                           {"role": "assistant", "content": f"{i % 7} apples"}]} for i in range(N)]
    (root / "chat.jsonl").write_text("".join(json.dumps(c) + "\n" for c in chats))
    write_pretrained(root / "model")
    return root


def prepared_tokens(sources, *overrides):
    cfg = load_config(None, [f"data.tokenizer={sources / 'model' / 'tokenizer.json'}",
                             f"data.cache_dir={sources / 'cache'}", "data.val_fraction=0.1", *overrides])
    prepared = prepare_data(cfg.data)
    train = np.concatenate([np.asarray(open_shard(p, prepared.token_dtype)) for p in prepared.train_shards])
    val = np.concatenate([np.asarray(open_shard(p, prepared.token_dtype)) for p in prepared.val_shards])
    return prepared, train, val


@pytest.mark.parametrize("source", ["data.csv", "data.parquet", "saved", "folder"])
def test_every_offline_source_gives_the_tokens_of_the_jsonl(sources, source):
    _, train, val = prepared_tokens(sources, f"data.hf_dataset={sources / 'data.jsonl'}")
    _, other_train, other_val = prepared_tokens(sources, f"data.hf_dataset={sources / source}")
    assert np.array_equal(train, other_train) and np.array_equal(val, other_val)


def test_streaming_reads_the_same_records_and_hits_the_same_cache(sources):
    first, train, _ = prepared_tokens(sources, f"data.hf_dataset={sources / 'data.jsonl'}")
    streamed, streamed_train, _ = prepared_tokens(
        sources, f"data.hf_dataset.path={sources / 'data.jsonl'}", "data.hf_dataset.streaming=true")
    assert streamed.path == first.path and streamed.cache_hit
    assert np.array_equal(train, streamed_train)


def test_streaming_builds_the_same_shards_from_scratch(sources, tmp_path):
    _, train, val = prepared_tokens(sources, f"data.hf_dataset={sources / 'data.jsonl'}")
    cfg = load_config(None, [f"data.tokenizer={sources / 'model' / 'tokenizer.json'}", f"data.cache_dir={tmp_path}",
                             "data.val_fraction=0.1", f"data.hf_dataset.path={sources / 'data.jsonl'}",
                             "data.hf_dataset.streaming=true"])
    prepared = prepare_data(cfg.data)
    assert not prepared.cache_hit
    streamed = np.concatenate([np.asarray(open_shard(p, prepared.token_dtype)) for p in prepared.train_shards])
    assert np.array_equal(train, streamed)


def test_documents_are_the_text_field_separated_by_end_of_text(sources):
    from tokenizers import Tokenizer

    prepared, train, val = prepared_tokens(sources, f"data.hf_dataset={sources / 'data.jsonl'}")
    tokenizer = Tokenizer.from_file(str(sources / "model" / "tokenizer.json"))
    documents = [d for i, d in enumerate(corpus_lines(N)) if i % 10 != 9]  # val_fraction 0.1: every 10th held out
    assert tokenizer.decode(train.tolist(), skip_special_tokens=False).split("<|endoftext|>")[:-1] == documents
    assert prepared.meta["documents"] == {"train": N - N // 10, "val": N // 10}


def test_chat_records_render_with_the_chat_template(sources):
    from tokenizers import Tokenizer

    _, train, _ = prepared_tokens(sources, f"data.hf_dataset.path={sources / 'chat.jsonl'}",
                                  "data.hf_dataset.messages_field=messages")
    text = Tokenizer.from_file(str(sources / "model" / "tokenizer.json")).decode(train.tolist(), skip_special_tokens=False)
    assert text.startswith("<|user|>how many apples, 0?\n<|assistant|>0 apples\n<|endoftext|>")


def test_resume_position_is_exact_for_a_dataset_source(sources):
    prepared, _, _ = prepared_tokens(sources, f"data.hf_dataset={sources / 'data.jsonl'}")
    loader = TokenLoader(prepared, "train", 16, 2, seed=5, prefetch=0)
    for _ in range(3):
        next(loader)
    state = loader.state_dict()
    expected = next(loader)
    resumed = TokenLoader(prepared, "train", 16, 2, seed=0, prefetch=0)
    resumed.load_state_dict(state)
    got = next(resumed)
    assert all((a == b).all() for a, b in zip(expected, got))


@pytest.mark.parametrize("overrides,message", [
    (["data.hf_dataset.path=/no/such/file.jsonl"], "data.hf_dataset.path: /no/such/file.jsonl does not exist"),
    (["data.hf_dataset.path={root}/data.jsonl", "data.hf_dataset.text_field=body"],
     "data.hf_dataset.text_field: 'body' is not a column"),
    (["data.hf_dataset.path={root}/data.jsonl", "data.hf_dataset.messages_field=text"],
     "is not a list of {role, content} messages"),
    (["data.hf_dataset.path={root}/model/config.json", "data.hf_dataset.format=csv"], "data.hf_dataset"),
])
def test_bad_sources_are_one_line_errors(sources, tmp_path, overrides, message):
    overrides = [o.format(root=sources) for o in overrides]
    cfg = load_config(None, [f"data.tokenizer={sources / 'model' / 'tokenizer.json'}", f"data.cache_dir={tmp_path}",
                             *overrides])
    with pytest.raises(UserError, match=message.replace("{", r"\{").replace("}", r"\}").replace(".", r"\.")) as err:
        prepare_data(cfg.data)
    assert "\n" not in str(err.value)
    assert not [p for p in tmp_path.iterdir() if p.name != "hf-datasets"]  # nothing half-built left behind


def test_paths_and_hf_dataset_together_are_rejected(sources):
    with pytest.raises(UserError, match="set either data.hf_dataset or data.paths"):
        load_config(None, [f"data.hf_dataset={sources / 'data.jsonl'}", f"data.paths=[{sources / 'data.jsonl'}]"])
