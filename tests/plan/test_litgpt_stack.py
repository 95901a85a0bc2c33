"""`--stack litgpt`: its fine-tune recipes' pure bf16, LoRA defaults, multi-device sharding and recompute,
what it refuses, and the logits its training step holds."""

from __future__ import annotations

import dataclasses

import pytest

from flopwise.errors import UserError
from flopwise.plan import finetune as ft
from flopwise.plan.planner import build_runspec, plan
from flopwise.plan.search import search_layouts


def lora(**options):
    return build_runspec(**{"model": "llama3.1-8b", "hardware": "rtx4090", "finetune": "lora", "stack": "litgpt",
                            "seq_len": 512, "micro_batch": 1, "global_batch": 8, **options})


def test_litgpt_lora_is_its_recipes_pure_bf16_rank_8_q_v_with_dropout():
    spec = lora(gpus=1)
    work = spec.workload
    assert (work.precision, work.lora_rank, work.lora_targets, work.lora_dropout) == ("bf16-true", 8, "q,v", 0.05)
    notes = " | ".join(spec.cluster.extra["defaults"])
    assert "pure bf16" in notes and "lora dropout 0.05" in notes and "lora rank 8" in notes
    # per layer q 8·(4096+4096) and v 8·(4096+1024)
    assert ft.split_of(spec).trainable_params == 32 * (8 * 8192 + 8 * 5120)
    assert spec.layout.recompute == "none"  # one device: no checkpoint_wrapper


def test_a_mixed_precision_name_stays_amp_and_keeps_the_base_in_fp32():
    """Lightning's bf16-mixed casts no module: litgpt's frozen base stays fp32, twice the bf16 base,
    and does not fit a 24 GB card for an 8B model (its docs: mixed precision saves little memory)."""
    mixed = lora(gpus=1, precision="bf16-mixed", recompute="full")
    assert mixed.workload.precision == "bf16"
    true = lora(gpus=1, recompute="full")
    base = ft.split_of(true).frozen_params
    assert ft.split_of(mixed).frozen_bytes == pytest.approx(2 * ft.split_of(true).frozen_bytes, rel=0.01)
    assert ft.split_of(mixed).frozen_bytes == pytest.approx(4 * base, rel=0.01)
    assert not plan(mixed).memory.fits and plan(true).memory.fits
    assert build_runspec(model="llama3.1-8b", stack="litgpt").workload.precision == "bf16"  # pretraining: bf16-mixed


def test_litgpt_shards_and_checkpoints_every_multi_device_lora():
    spec = lora(gpus=2)
    assert (spec.layout.zero_stage, spec.layout.recompute) == (3, "full")
    notes = " | ".join(spec.cluster.extra["defaults"])
    assert "zero 3" in notes and "recompute full" in notes
    assert lora(gpus=2, recompute="none", zero=2).layout.recompute == "none"  # stated wins


@pytest.mark.parametrize(("options", "says"), [
    ({"finetune": "qlora", "gpus": 2}, "QLoRA on 1 device only"),
    ({"finetune": "qlora", "gpus": 1, "precision": "bf16-mixed"}, "--precision bf16-true"),
    ({"precision": "fp8", "gpus": 1}, "no fp8 training recipe"),
    ({"tp": 2, "gpus": 2}, "data parallelism only"),
])
def test_what_litgpt_refuses_is_one_line(options, says):
    with pytest.raises(UserError) as err:
        lora(**options)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_litgpt_search_keeps_to_its_recipes():
    spec = build_runspec(model="llama3.1-8b", hardware="h100-sxm", gpus=16, stack="litgpt", seq_len=4096)
    result = search_layouts(spec, top=20)
    layouts = [p.spec.layout for p in result.ranked]
    assert layouts
    assert {(lay.tp, lay.pp, lay.zero_stage, lay.offload) for lay in layouts} == {(1, 1, 3, "none")}
    assert {lay.recompute for lay in layouts} <= {"none", "full"}


def _logits_part(spec):
    return plan(spec).memory.logits


def test_the_logits_litgpt_holds_per_logit_follow_its_precision():
    """Planned bytes per logit: bf16-true keeps the bf16 logits and a bf16 log-softmax (4); bf16-mixed the
    bf16 logits and autocast's fp32 log-softmax (6). The test below measures both."""
    base = lora(gpus=1, recompute="full")
    for precision, kept in (("bf16-true", 4.0), ("bf16-mixed", 6.0)):
        spec = lora(gpus=1, recompute="full", precision=precision)
        wider = dataclasses.replace(spec, model=dataclasses.replace(spec.model, vocab_size=spec.model.vocab_size * 2))
        per_logit = (_logits_part(wider) - _logits_part(spec)) / (512 * spec.model.vocab_size)
        assert per_logit == pytest.approx(kept, rel=0.02), precision
    assert base.workload.precision == "bf16-true"


@pytest.mark.parametrize(("autocast", "kept"), [(False, 4), (True, 6)])
def test_litgpt_chunked_head_and_loss_keep_what_the_planner_keeps_measured(autocast, kept):
    """litgpt's fit() run for real on a CPU: `model(input_ids, lm_head_chunk_size=128)` returns a list of
    128-token logit chunks that stays referenced through the backward, and `chunked_cross_entropy` runs
    F.cross_entropy per chunk. Pure bf16: the bf16 logits and bf16 log-softmax, 4 bytes a logit; under
    bf16 autocast (fp32 weights): the bf16 logits and the fp32 log-softmax, 6."""
    torch = pytest.importorskip("torch")
    from tests.plan.saved_tensors import saved_storage_bytes

    tokens, hidden, vocab, chunk = 512, 32, 1000, 128
    dtype = torch.float32 if autocast else torch.bfloat16
    weight = torch.randn(vocab, hidden, dtype=dtype)  # the frozen head
    x = torch.randn(1, tokens, hidden, dtype=torch.bfloat16 if not autocast else torch.float32, requires_grad=True)
    targets = torch.randint(0, vocab, (1, tokens))
    context = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else torch.autocast("cpu", enabled=False)
    with saved_storage_bytes({weight.untyped_storage().data_ptr(), x.untyped_storage().data_ptr()}) as storages:
        with context:
            logits = [torch.nn.functional.linear(x_i, weight) for x_i in x.split(chunk, dim=1)]
            loss = torch.cat([torch.nn.functional.cross_entropy(c.reshape(-1, vocab), t.reshape(-1), reduction="none")
                              for c, t in zip(logits, targets.split(chunk, dim=1))]).sum()
    held = {c.untyped_storage().data_ptr(): c.untyped_storage().nbytes() for c in logits}
    large = {ptr: n for ptr, n in {**storages, **held}.items() if n >= chunk * vocab}  # the per-logit tensors
    assert sum(large.values()) == kept * tokens * vocab
    loss.backward()
