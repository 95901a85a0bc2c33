"""Chat data (`data.mix`) through the trainer, one process: the first step's loss is the mean over
the answer tokens of each conversation run alone (labels, restarting positions and the per-document
mask together), labels sit exactly on the assistant's turns, weights are respected, and the loss is
token-weighted over the whole step, so grad accumulation equals one big batch.
The 2-process runs are in test_chat_training_distributed.py."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch

from flopwise.config.loading import load_config
from flopwise.errors import UserError
from flopwise.train.data.chat import IGNORE_INDEX
from tests.hf_fixtures import WORDS, write_pretrained


def conversations(tag: str, n: int, seed: int) -> list[dict]:
    """`n` records of varied length; every user turn names `tag` so the source of a document is visible."""
    rng = np.random.default_rng(seed)
    records = []
    for i in range(n):
        say = lambda k: " ".join(WORDS[j] for j in rng.integers(0, len(WORDS), k))  # noqa: E731
        messages = [{"role": "user", "content": f"{tag} {say(int(rng.integers(2, 6)))}"},
                    {"role": "assistant", "content": say(int(rng.integers(2, 8)))}]
        if i % 3 == 0:  # some conversations have two rounds, some a system line
            messages += [{"role": "user", "content": f"{tag} again {say(2)}"},
                         {"role": "assistant", "content": say(int(rng.integers(1, 5)))}]
        if i % 4 == 1:
            messages.insert(0, {"role": "system", "content": "answer briefly"})
        records.append({"messages": messages} if i % 2 else
                       {"prompt": messages[-2]["content"], "response": messages[-1]["content"]})
    return records


def write_chat(path, records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat")
    write_pretrained(root / "pretrained")
    write_chat(root / "alpha.jsonl", conversations("alpha", 60, seed=1))
    write_chat(root / "beta.jsonl", conversations("beta", 60, seed=2))
    return root


def overrides(folders, tmp_path, *extra: str) -> list[str]:
    return ["model.kind=hf", f"model.pretrained={folders / 'pretrained'}",
            f"data.mix=[{{path: {folders / 'alpha.jsonl'}, weight: 3}}, {{path: {folders / 'beta.jsonl'}, weight: 1}}]",
            "data.seq_len=128", "data.val_fraction=0.1", "precision.mode=fp32",
            "parallel.strategy=single", "parallel.nproc_per_node=1", "training.micro_batch_size=4",
            "training.optimizer=sgd", "training.lr=0.1", "training.warmup_steps=0", "training.eval_every=100",
            "training.eval_batches=1", f"logging.run_dir={tmp_path / 'run'}", "logging.progress=false", *extra]


def built(folders, tmp_path, *extra: str):
    from flopwise.train.data.prepare import prepare_data
    from flopwise.train.loop import build_state
    from flopwise.train.parallel.distributed import init_distributed

    cfg = load_config(None, overrides(folders, tmp_path, *extra))
    env = init_distributed(cfg.parallel)
    prepared = prepare_data(cfg.data)
    return cfg, env, prepared, build_state(cfg, env, prepared)


def documents(row_ids, targets, segments):
    """(input ids, targets) of each document of a packed row."""
    for number in range(int(segments.max()) + 1):
        where = segments == number
        yield row_ids[where], targets[where]


def answer_token_mean_alone(folders, loader, samples: int, rows: int, encoder) -> tuple[float, int]:
    """Mean loss over the answer tokens of every conversation in the step, each run alone through the
    untouched pretrained model with its own positions 0.. and the labels of its own encoding."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folders / "pretrained"), local_files_only=True).eval()
    encoded = {}
    for name in ("alpha", "beta"):
        for line in (folders / f"{name}.jsonl").read_text().splitlines():
            record = json.loads(line)
            messages = record.get("messages") or [{"role": "user", "content": record["prompt"]},
                                                  {"role": "assistant", "content": record["response"]}]
            example = encoder.encode(messages)
            encoded[tuple(example.input_ids)] = example.labels
    total, count = 0.0, 0
    arrays = loader._arrays
    for row in loader.row_ids(samples)[:rows]:
        for ids, _ in documents(arrays["input_ids"][row], arrays["targets"][row], arrays["segment_ids"][row]):
            labels = torch.tensor(encoded[tuple(int(t) for t in ids)])  # the document is one whole conversation
            with torch.no_grad():
                logits = model(input_ids=torch.as_tensor(ids)[None]).logits[0]
            total += torch.nn.functional.cross_entropy(logits[:-1], labels[1:], reduction="sum",
                                                       ignore_index=IGNORE_INDEX).item()
            count += int((labels[1:] != IGNORE_INDEX).sum())
    return total / count, count


# -- config ------------------------------------------------------------------------------------

def test_mix_refuses_the_built_in_decoder_and_other_engines(folders, tmp_path):
    with pytest.raises(UserError, match=r"data.mix: chat data trains a HuggingFace model"):
        load_config(None, [f"data.mix=[{{path: {folders / 'alpha.jsonl'}}}]"])
    with pytest.raises(UserError, match=r"data.mix: packed chat rows train with .* \(got deepspeed\)"):
        load_config(None, overrides(folders, tmp_path, "parallel.strategy=deepspeed"))


# -- rows --------------------------------------------------------------------------------------

def test_labels_sit_exactly_on_the_assistant_turns_and_positions_restart(folders, tmp_path):
    from flopwise.train.data.chat import load_chat_tokenizer

    cfg, _, prepared, state = built(folders, tmp_path)
    tokenizer = load_chat_tokenizer(folders / "pretrained")
    answers_by_prompt = {}
    for name in ("alpha", "beta"):
        for line in (folders / f"{name}.jsonl").read_text().splitlines():
            record = json.loads(line)
            messages = record.get("messages") or [{"role": "user", "content": record["prompt"]},
                                                  {"role": "assistant", "content": record["response"]}]
            text = "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages)
            answers_by_prompt[text] = "".join(f"<|assistant|>{m['content']}\n" for m in messages
                                              if m["role"] == "assistant") + "<|endoftext|>"
    batch = next(state.train_loader)
    checked = 0
    for row in range(batch.inputs.shape[0]):
        ids, targets = batch.inputs[row].numpy(), batch.targets[row].numpy()
        positions, segments = batch.position_ids[row].numpy(), batch.segment_ids[row].numpy()
        assert segments[0] == 0 and np.all(np.diff(segments[segments >= 0]) >= 0)
        assert np.all(targets[segments == -1] == IGNORE_INDEX) and np.all(positions[segments == -1] == 0)
        for number in range(int(segments.max()) + 1):
            where = np.flatnonzero(segments == number)
            assert positions[where].tolist() == list(range(len(where)))  # restart at 0 for each document
            assert targets[where[-1]] == IGNORE_INDEX  # a document's last token predicts nothing across
            text = tokenizer.decode(ids[where][:-1])  # the rendered conversation, then the end-of-text id
            labelled = tokenizer.decode(targets[where][targets[where] != IGNORE_INDEX])
            assert labelled == answers_by_prompt[text], (text, labelled)
            checked += 1
    assert checked > 4


def test_mixing_follows_the_weights_and_is_deterministic_per_seed(folders, tmp_path):
    from flopwise.train.data.chat import load_chat_tokenizer

    tokenizer = load_chat_tokenizer(folders / "pretrained")
    _, _, prepared, state = built(folders, tmp_path)
    sources = Counter()
    for row in prepared.train_rows:
        for ids, _ in documents(row.input_ids, row.targets, row.segment_ids):
            text = tokenizer.decode(ids)
            sources["alpha" if "alpha" in text else "beta"] += 1
    # 54 training conversations per file (every 10th held out), 108 draws at weights 3:1
    assert sum(sources.values()) == 108
    assert abs(sources["alpha"] - 81) <= 1 and abs(sources["beta"] - 27) <= 1
    again = built(folders, tmp_path)[3].train_loader
    other = built(folders, tmp_path, "training.seed=7")[3].train_loader
    first = [state.train_loader.row_ids(s) for s in range(0, 40, 4)]
    assert first == [again.row_ids(s) for s in range(0, 40, 4)]
    assert first != [other.row_ids(s) for s in range(0, 40, 4)]
    assert prepared.val_rows and prepared.sha256("val") != prepared.sha256("train")


def test_loader_state_resumes_at_the_same_row_and_refuses_other_data(folders, tmp_path):
    _, _, _, state = built(folders, tmp_path)
    loader = state.train_loader
    for _ in range(7):
        next(loader)
    saved = json.loads(json.dumps(loader.state_dict()))
    expected = next(loader)
    fresh = built(folders, tmp_path)[3].train_loader
    fresh.load_state_dict(saved)
    got = next(fresh)
    assert torch.equal(got.inputs, expected.inputs) and got.loss_weight == expected.loss_weight
    other = built(folders, tmp_path, "data.loss_on=all")[3].train_loader
    with pytest.raises(UserError, match="chat rows changed since the checkpoint"):
        other.load_state_dict(saved)


# -- the step ----------------------------------------------------------------------------------

def test_first_step_loss_is_the_answer_token_mean_of_each_conversation_alone(folders, tmp_path):
    from flopwise.train.data.chat import ChatEncoder, load_chat_tokenizer
    from flopwise.train.step import train_step

    cfg, env, _, state = built(folders, tmp_path)
    encoder = ChatEncoder(load_chat_tokenizer(folders / "pretrained"))
    expected, count = answer_token_mean_alone(folders, state.train_loader, 0, 4, encoder)
    assert count > 20
    rows = state.train_loader.row_ids(0)
    assert max(int(state.train_loader._arrays["segment_ids"][r].max()) for r in rows) >= 2  # packed rows
    loss = train_step(state, env, grad_accum=1).loss
    assert loss == pytest.approx(expected, rel=1e-5)

    # loss on every token is another number: the masking above is what made them agree
    cfg, env, _, state = built(folders, tmp_path, "data.loss_on=all")
    assert train_step(state, env, grad_accum=1).loss != pytest.approx(expected, rel=1e-3)


def test_accumulation_over_two_micro_batches_equals_one_batch_of_four(folders, tmp_path):
    from flopwise.train.step import train_step

    results = {}
    for micro in (4, 2):
        cfg, env, _, state = built(folders, tmp_path, f"training.micro_batch_size={micro}",
                                   "training.global_batch_size=4")
        grad_accum = 4 // micro
        assert state.train_loader.grad_accum == grad_accum
        if micro == 2:  # the mean of the two micro-batch means is not the step's token mean here
            counts = [int((b.targets != IGNORE_INDEX).sum()) for b in (state.train_loader.batch_at(0),
                                                                      state.train_loader.batch_at(2))]
            assert counts[0] != counts[1]
        loss = train_step(state, env, grad_accum).loss
        params = {n: p.detach().clone() for n, p in state.built.module.named_parameters()}
        results[micro] = loss, params
    (loss4, params4), (loss2, params2) = results[4], results[2]
    assert loss2 == pytest.approx(loss4, rel=1e-5)
    for name, value in params4.items():
        torch.testing.assert_close(params2[name], value, atol=1e-6, rtol=1e-5)
    moved = any(not torch.equal(params4[n], p) for n, p in built(folders, tmp_path)[3].built.module.named_parameters())
    assert moved  # the step changed the weights, so equal weights compare equal gradients


def test_validation_loss_is_the_token_mean_of_the_held_out_rows(folders, tmp_path):
    from flopwise.train.loop import evaluate

    cfg, env, prepared, state = built(folders, tmp_path)
    from flopwise.train.loop import make_loader
    from flopwise.config.resolve import resolve_run

    from flopwise.train.data.chat import ChatEncoder, load_chat_tokenizer

    val = make_loader(cfg, env, prepared, "val", resolve_run(cfg, processes=1))
    assert val.row_ids(0) == [0, 1, 2, 3] and val.num_rows == 7  # held-out rows in order (the 2nd batch wraps)
    encoder = ChatEncoder(load_chat_tokenizer(folders / "pretrained"))
    (mean0, count0), (mean1, count1) = (answer_token_mean_alone(folders, val, s, 4, encoder) for s in (0, 4))
    first = evaluate(state, val, 2)
    assert first == pytest.approx((mean0 * count0 + mean1 * count1) / (count0 + count1), rel=1e-5)
    assert first == evaluate(state, val, 2)


def test_a_bf16_autocast_step_builds_the_mask_in_the_scores_dtype(folders, tmp_path):
    from flopwise.train.step import train_step

    _, env, _, state = built(folders, tmp_path)
    fp32 = train_step(state, env, grad_accum=1).loss
    _, env, _, state = built(folders, tmp_path, "precision.mode=bf16")
    bf16 = train_step(state, env, grad_accum=1).loss
    assert bf16 == pytest.approx(fp32, rel=3e-2)


def test_activation_checkpointing_keeps_the_document_mask(folders, tmp_path):
    from flopwise.train.step import train_step

    _, env, _, state = built(folders, tmp_path)
    plain = train_step(state, env, grad_accum=1)
    _, env, _, state = built(folders, tmp_path, "training.gradient_checkpointing=true")
    recomputed = train_step(state, env, grad_accum=1)
    assert recomputed.loss == pytest.approx(plain.loss, rel=1e-6)
    assert recomputed.grad_norm == pytest.approx(plain.grad_norm, rel=1e-5)


def test_qlora_trains_on_chat_rows(folders, tmp_path):
    pytest.importorskip("peft")
    pytest.importorskip("torchao")
    from flopwise.train.step import train_step

    _, env, _, state = built(folders, tmp_path, "finetune.method=qlora", "finetune.rank=4", "training.optimizer=adamw",
                             "training.lr=1e-2")
    losses = [train_step(state, env, grad_accum=1).loss for _ in range(6)]
    assert all(np.isfinite(losses)) and min(losses[-2:]) < losses[0], losses
