"""Chat data: labels only on the assistant's turns, packing that keeps documents apart, weighted mixing."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from flopwise.errors import UserError
from flopwise.train.data.chat import IGNORE_INDEX, PLAIN_CHAT_TEMPLATE, ChatEncoder, ChatExample, \
    load_chat_tokenizer, read_chat_records
from flopwise.train.data.mixing import mix, mix_order
from flopwise.train.data.packing import attention_inputs, cu_seqlens, pack_examples
from tests.hf_fixtures import write_pretrained

CONVERSATION = [
    {"role": "system", "content": "count the apples"},
    {"role": "user", "content": "how many apples"},
    {"role": "assistant", "content": "three apples and pears"},
    {"role": "user", "content": "and the model"},
    {"role": "assistant", "content": "the model learns"},
]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    return write_pretrained(tmp_path_factory.mktemp("tiny-llama"))


def _decoded_labels(tokenizer, example: ChatExample) -> str:
    return tokenizer.decode([t for t in example.labels if t != IGNORE_INDEX])


def test_only_assistant_turns_are_labelled(pretrained):
    tokenizer = load_chat_tokenizer(pretrained)
    example = ChatEncoder(tokenizer).encode(CONVERSATION)
    labelled = _decoded_labels(tokenizer, example)
    assert "three apples and pears" in labelled and "the model learns" in labelled
    assert "how many" not in labelled and "count the" not in labelled and "and the model" not in labelled
    masked = [t for t, label in zip(example.input_ids, example.labels) if label == IGNORE_INDEX]
    assert "how many apples" in tokenizer.decode(masked)
    assert example.labels[-1] == tokenizer.eos_token_id  # the answer's end is learned


def test_loss_on_all_labels_every_token(pretrained):
    tokenizer = load_chat_tokenizer(pretrained)
    example = ChatEncoder(tokenizer, loss_on="all").encode(CONVERSATION)
    assert example.labels == example.input_ids


def test_plain_template_when_the_tokenizer_has_none(tmp_path, pretrained):
    config = json.loads((pretrained / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_text((pretrained / "tokenizer.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = load_chat_tokenizer(folder)
    assert tokenizer.chat_template == PLAIN_CHAT_TEMPLATE
    labelled = _decoded_labels(tokenizer, ChatEncoder(tokenizer).encode(CONVERSATION))
    assert "three apples and pears" in labelled and "how many" not in labelled


def test_a_template_that_refuses_a_conversation_is_one_line(pretrained):
    tokenizer = load_chat_tokenizer(pretrained)
    tokenizer.chat_template = ("{% if messages[0]['role'] != 'user' %}{{ raise_exception('must start with user') }}"
                               "{% endif %}{% for m in messages %}{{ m['content'] }}{% endfor %}")
    with pytest.raises(UserError, match=r"refuses a conversation with roles \[system, user.*must start with user"):
        ChatEncoder(tokenizer).encode(CONVERSATION)


def test_prompt_response_records_and_bad_records(tmp_path):
    good = tmp_path / "sft.jsonl"
    good.write_text(json.dumps({"prompt": "p", "response": "r"}) + "\n\n")
    assert list(read_chat_records(good)) == [[{"role": "user", "content": "p"}, {"role": "assistant", "content": "r"}]]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "no chat"}) + "\n")
    with pytest.raises(UserError, match=r"bad.jsonl:1: no `messages`"):
        list(read_chat_records(bad))
    with pytest.raises(UserError, match="does not exist"):
        list(read_chat_records(tmp_path / "missing.jsonl"))


def test_packing_restarts_positions_and_never_predicts_across_documents():
    docs = [ChatExample([1, 2, 3], [IGNORE_INDEX, 2, 3]), ChatExample([4, 5], [4, 5]), ChatExample([6, 7, 8, 9], [6, 7, 8, 9])]
    rows = list(pack_examples(docs, seq_len=6, pad_id=0))
    assert len(rows) == 2
    first = rows[0]
    assert first.input_ids.tolist() == [1, 2, 3, 4, 5, 0]
    assert first.position_ids.tolist() == [0, 1, 2, 0, 1, 0]
    assert first.segment_ids.tolist() == [0, 0, 0, 1, 1, -1]
    # token 3 ends document 0: it must not be trained to predict 4, the next document's first token
    assert first.targets.tolist() == [2, 3, IGNORE_INDEX, 5, IGNORE_INDEX, IGNORE_INDEX]
    assert cu_seqlens(first.segment_ids).tolist() == [0, 3, 5]


def test_packed_row_logits_equal_each_document_alone(pretrained):
    """Attention does not leak across documents: each document's logits in the packed row
    are those of the document run on its own (fails with a plain causal mask or running positions)."""
    import torch
    from transformers import AutoModelForCausalLM

    tokenizer = load_chat_tokenizer(pretrained)
    encoder = ChatEncoder(tokenizer)
    docs = [encoder.encode(CONVERSATION[:3]), encoder.encode(CONVERSATION[1:]),
            encoder.encode([{"role": "user", "content": "pears"}, {"role": "assistant", "content": "apples"}])]
    total = sum(len(d.input_ids) for d in docs)
    row = next(pack_examples(docs, seq_len=total + 3, pad_id=0))
    assert row.segment_ids.max() == 2
    model = AutoModelForCausalLM.from_pretrained(str(pretrained), local_files_only=True).eval()
    with torch.no_grad():
        packed = model(input_ids=torch.as_tensor(row.input_ids)[None],
                       **attention_inputs(row.segment_ids, row.position_ids)).logits[0]
        plain = model(input_ids=torch.as_tensor(row.input_ids)[None]).logits[0]
        start = 0
        for doc in docs:
            alone = model(input_ids=torch.tensor([doc.input_ids])).logits[0]
            part = packed[start:start + len(doc.input_ids)]
            torch.testing.assert_close(part, alone, atol=1e-4, rtol=1e-4)
            if start:  # the unmasked row lets later documents see earlier ones
                assert not torch.allclose(plain[start:start + len(doc.input_ids)], alone, atol=1e-3)
            start += len(doc.input_ids)
    # the packed loss is the per-document losses, token for token
    targets = torch.as_tensor(row.targets)
    packed_loss = torch.nn.functional.cross_entropy(packed, targets, reduction="sum", ignore_index=IGNORE_INDEX)
    separate = 0.0
    for doc in docs:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([doc.input_ids])).logits[0]
        separate += torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(doc.labels[1:]), reduction="sum",
                                                      ignore_index=IGNORE_INDEX)
    torch.testing.assert_close(packed_loss, separate, atol=1e-3, rtol=1e-4)


def test_mixture_follows_the_weights():
    order = mix_order([3.0, 1.0])
    counts = Counter(next(order) for _ in range(400))
    assert counts == {0: 300, 1: 100}
    drawn = mix([["a"] * 5, ["b"] * 50, ["c"] * 2], [0.5, 0.25, 0.25], count=1000, seed=1)
    shares = Counter(drawn)
    assert abs(shares["a"] - 500) <= 1 and abs(shares["b"] - 250) <= 1 and abs(shares["c"] - 250) <= 1
    with pytest.raises(UserError, match="weight must be > 0"):
        mix([["a"]], [0.0], count=1)


def test_chat_rows_from_config(tmp_path, pretrained):
    from flopwise.config.schema import DataConfig
    from flopwise.train.data.chat_rows import chat_rows

    a = tmp_path / "a.jsonl"
    a.write_text("".join(json.dumps({"messages": CONVERSATION[1:3]}) + "\n" for _ in range(3)))
    b = tmp_path / "b.jsonl"
    b.write_text(json.dumps({"prompt": "pears", "response": "apples"}) + "\n")
    cfg = DataConfig(mix=[{"path": a, "weight": 1}, {"path": b, "weight": 3}], seq_len=64)
    rows = chat_rows(cfg, pretrained, examples=8)
    documents = sum(int(r.segment_ids.max()) + 1 for r in rows)
    assert documents == 8
    assert all(r.input_ids.shape == (64,) for r in rows)
    assert all(np.all(r.position_ids[r.segment_ids == -1] == 0) for r in rows)


def test_mix_stands_alone_in_the_config(tmp_path):
    from flopwise.config.loading import load_config

    with pytest.raises(UserError, match="data.mix: chat files are mixed on their own"):
        load_config(None, [f"data.mix=[{{path: {tmp_path / 'a.jsonl'}, weight: 2}}]", f"data.paths=[{tmp_path}]"])
    cfg = load_config(None, [f"data.mix=[{{path: {tmp_path / 'a.jsonl'}, weight: 2}}]", "data.loss_on=all",
                             "model.kind=hf", "parallel.strategy=ddp"])
    assert cfg.data.mix[0].weight == 2 and cfg.data.loss_on == "all"
    with pytest.raises(UserError, match="loss_on"):
        load_config(None, ["data.loss_on=prompt"])
