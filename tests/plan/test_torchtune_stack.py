"""`--stack torchtune`: pure bf16 by default, its LoRA defaults, and its chunked linear cross-entropy."""

from __future__ import annotations

import dataclasses

import pytest

from flopwise.plan import finetune as ft
from flopwise.plan import stage_memory
from flopwise.plan.planner import build_runspec, plan
from flopwise.plan.stacks import get_stack


def test_torchtune_plans_pure_bf16_unless_told_otherwise_and_says_so():
    spec = build_runspec(model="llama3-8b", hardware="rtx4090", gpus=2, finetune="lora", stack="torchtune")
    assert spec.workload.precision == "bf16-true"
    assert any("pure bf16" in note for note in spec.cluster.extra["defaults"])
    assert any("no fp32 master copy" in w for w in plan(spec).warnings)  # the trade-off, stated
    assert build_runspec(model="llama3-8b", stack="torchtune", precision="bf16").workload.precision == "bf16-true"
    assert build_runspec(model="llama3-8b", stack="torchtune", precision="fp32").workload.precision == "fp32"
    assert build_runspec(model="llama3-8b", precision="bf16").workload.precision == "bf16"  # flopwise keeps AMP


def test_torchtune_lora_defaults_are_its_recipes_and_stated_ones_win():
    spec = build_runspec(model="llama3-8b", hardware="rtx4090", gpus=1, finetune="lora", stack="torchtune")
    assert (spec.workload.lora_rank, spec.workload.lora_targets) == (8, "q,v,o,gate,up,down")
    notes = spec.cluster.extra["defaults"]
    assert any("lora rank 8" in n for n in notes) and any("lora targets q,v,o,gate,up,down" in n for n in notes)
    # 8B_lora.yaml on Llama 3.1 8B: per layer q, o 8·(4096+4096), v 8·(4096+1024), gate, up, down 8·(4096+14336)
    per_layer = 2 * 8 * 8192 + 8 * 5120 + 3 * 8 * 18432
    assert ft.split_of(spec).trainable_params == 32 * per_layer
    stated = build_runspec(model="llama3-8b", finetune="lora", stack="torchtune", lora_rank=16, lora_targets="all-linear")
    assert (stated.workload.lora_rank, stated.workload.lora_targets) == (16, "all-linear")


def test_a_chunked_loss_holds_one_chunks_transient():
    """torchtune's loss runs 8 chunks: every chunk's fp32 log-softmax is kept for the backward (as
    unchunked), but only one chunk's logits and fp32 copy exist at a time."""
    base = build_runspec(model="llama3-8b", hardware="rtx4090", gpus=1, finetune="lora", seq_len=4096, micro_batch=1,
                         global_batch=8, stack="torchtune")
    chunked = plan(base).memory
    whole = plan(dataclasses.replace(base, stack="torchtitan")).memory  # F.cross_entropy(logits.float()) whole
    elements = 4096 * 128256
    assert get_stack("torchtune").loss_chunks == 8
    assert whole.total_bytes - chunked.total_bytes == pytest.approx(6 * elements * (1 - 1 / 8), rel=0.05)


def test_chunked_cross_entropy_keeps_four_bytes_per_logit_measured():
    """torchtune's LinearCrossEntropyLoss pattern run for real: per chunk, the output projection and
    F.cross_entropy(logits.float()). Autograd keeps the fp32 log-softmax of every chunk, 4 bytes a
    logit, and neither the 16-bit logits nor their fp32 copy: what the planner keeps."""
    torch = pytest.importorskip("torch")
    from tests.plan.saved_tensors import saved_storage_bytes

    tokens, hidden, vocab, chunks = 256, 32, 1000, 8
    weight = torch.randn(vocab, hidden, dtype=torch.bfloat16, requires_grad=True)
    x = torch.randn(tokens, hidden, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, vocab, (tokens,))
    with saved_storage_bytes({weight.untyped_storage().data_ptr(), x.untyped_storage().data_ptr()}) as storages:
        loss = sum(torch.nn.functional.cross_entropy(torch.nn.functional.linear(h, weight).float(), t, reduction="sum")
                   for h, t in zip(x.chunk(chunks), targets.chunk(chunks)))
    large = sum(n for n in storages.values() if n >= tokens // chunks * vocab)  # the per-logit tensors
    assert large == stage_memory.SAVED_LOSS_BYTES_PER_LOGIT * tokens * vocab
    loss.backward()


def test_torchtune_fp8_keeps_its_pure_bf16_states():
    """torchtune's fp8 swaps the linears of a model whose parameters are bf16: no fp32 master and bf16
    AdamW states (8 bytes a parameter, not 16), with the trade-off stated; torchtitan's fp8 keeps both."""
    def states(stack):
        spec = build_runspec(model="llama3-8b", hardware="h100-sxm", gpus=8, stack=stack, precision="fp8", zero=3)
        memory = plan(spec).memory
        return memory.weights + memory.gradients + memory.optimizer_states + memory.master_weights, plan(spec)

    tune, tune_plan = states("torchtune")
    titan, _ = states("torchtitan")
    assert tune == pytest.approx(titan / 2, rel=0.02)
    assert tune_plan.memory.master_weights == 0
    assert any("no fp32 master copy" in w for w in tune_plan.warnings)
