"""Which collectives one optimizer step runs on a rank, and how many bytes each moves.

The one count that the step time (`timing.py`: seconds of each collective) and the
predicted traffic (`CommEstimate.*_bytes`, compared with what a run meters in
`train/parallel/comm_volume.py`) both read, so time and bytes cannot disagree on how many
gathers happen. Bytes are what one rank sends on the ring model of `comm.py`.

Conventions, per framework (what the trainer and the frameworks it is compared with do):

- ZeRO-3 / FSDP2 (`framework="fsdp"`): every unit is all-gathered before each micro-batch's
  forward and again before its backward (`reshard_after_forward=True`), except the root
  unit, which is not resharded after forward (backward needs it at once; torchtitan, and
  `train/parallelize.apply_fsdp`): it is gathered once per micro-batch. Gradients are
  reduce-scattered once per step (no sync on accumulation micro-batches). Under a
  pipeline, torch's schedule keeps a stage unsharded from its first backward to the last
  (`PipelineStage.backward_maybe_with_nosync`) and the trainer does not reshard a stage
  after forward (torchtitan's default under PP): one gather per step, one reduce-scatter
  at the last micro-batch.
- DeepSpeed ZeRO-3: every layer gathered for forward and for backward, gradients reduced
  every micro-batch.
- HSDP (`dp_replicate > 1`): gathers and reduce-scatters run over the shard group
  (dp / dp_replicate ranks); the reduced shard is then all-reduced across the replicas
  (Zhao et al. 2023, PyTorch FSDP §3.2.1).
- The busiest rank: a pipeline's figures are those of the device that sends the most in
  that dimension (a run reports its largest rank per dimension the same way).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from flopwise.catalog.models import is_mla, norm_tensors
from flopwise.plan import comm as cm
from flopwise.plan.params import ParamCount

FSDP_MIN_UNIT_PARAMS = 100_000
"""The trainer's `parallel.fsdp_min_params` default: a non-block child (embedding, head)
below it stays in FSDP2's root unit (`train/parallelize.apply_fsdp`)."""
DEEPSPEED_PREFETCH_BUCKET_PARAMS = 5e7
"""DeepSpeed ZeRO-3's `stage3_prefetch_bucket_size` default (50M parameters,
`deepspeed/runtime/zero/config.py`): how far ahead of the running module it gathers. A layer
larger than that is prefetched only in part; the rest of its gathers wait on the wire."""
DEEPSPEED_REDUCE_BUCKET_PARAMS = 5e8
"""DeepSpeed's `reduce_bucket_size` default (500M elements, `deepspeed/runtime/zero/config.py`):
ZeRO-3 reduce-scatters gradients a bucket at a time, each one ring collective."""
VOCAB_PARALLEL_LOSS_ALL_REDUCES = 3
"""Megatron's vocab-parallel cross entropy: all-reduces of the per-token max, target logit
and sum of exponentials, fp32 each (`megatron/core/tensor_parallel/cross_entropy.py`)."""


@dataclass(frozen=True)
class DpCollectives:
    """ZeRO-3 collectives of one step on a rank, counted in full-weight (or full-gradient) buffers."""

    forward_gathers: int  # all-gathers of the rank's weights before a forward
    backward_gathers: int  # all-gathers before a backward
    backward_share: float  # share of the weights a backward gather fetches (the root stays gathered)
    reductions: int  # gradient reduce-scatters (then, under HSDP, all-reduces across replicas)
    reduce_each_micro_batch: bool


def zero3_collectives(framework: str, pp: int, micro_batches: int, root_share: float,
                      reduce_each_micro_batch: bool = False) -> DpCollectives:
    """How often a ZeRO-3 rank gathers its weights and reduces its gradients per step (module docstring).
    `reduce_each_micro_batch`: FSDP with gradient sync on every micro-step (flopwise's
    `parallel.fsdp_grad_sync=every_micro_step`, torchtitan's accumulation)."""
    m = micro_batches
    if framework == "deepspeed":
        return DpCollectives(m, m, 1.0, m, True)
    if pp > 1 and framework == "fsdp":
        return DpCollectives(1, 0, 1.0, 1, False)
    share = 1.0 - root_share if framework == "fsdp" else 1.0
    if reduce_each_micro_batch:
        return DpCollectives(m, m, share, m, True)
    return DpCollectives(m, m, share, 1, False)


def fsdp_root_params(pc: ParamCount, vocab: int, hidden: int, tied: bool) -> float:
    """Parameters FSDP2 keeps in the root unit: the final norm and other small terms, and the
    embedding and head when they are shared (tied) or below the unit threshold."""
    token = vocab * hidden
    positions = pc.embedding - token  # learned positions / token types: another child
    root = pc.final_norm + pc.other
    if tied or token < FSDP_MIN_UNIT_PARAMS:
        root += token
    if 0 < positions < FSDP_MIN_UNIT_PARAMS:
        root += positions
    if 0 < pc.output_head < FSDP_MIN_UNIT_PARAMS:
        root += pc.output_head
    return float(root)


def layer_tensors(model) -> int:
    """Parameter tensors of one transformer block: the attention's fused QKV and output
    projections, the MLP's input (gate and up fused) and output projections, their biases,
    and each norm's weight (and bias for LayerNorm). Multi-head latent attention has its own
    (`mla_tensors`) in place of QKV and output."""
    attention = mla_tensors(model) if is_mla(model) else 2 + 2 * int(bool(model.attn_bias))
    mlp = 2 + 2 * int(bool(model.mlp_bias))
    norms = model.norms_per_layer * norm_tensors(model) + 2 * int(bool(getattr(model, "qk_norm", False)))
    return attention + mlp + norms


def mla_tensors(model) -> int:
    """MLA's parameter tensors (transformers' `DeepseekV3Attention`): q_a, its norm and q_b (or
    one q), kv_a, its norm and kv_b, o; with `attn_bias`, biases on q_a, kv_a and o."""
    query = 3 if model.q_lora_rank else 1
    biases = (2 + int(bool(model.q_lora_rank))) if model.attn_bias else 0
    return query + 3 + 1 + biases


def zero3_messages_per_gather(framework: str, model) -> int:
    """Collectives one layer's ZeRO-3 gather issues: DeepSpeed gathers each parameter tensor
    with its own all-gather (`partition_parameters.py`, `_all_gather` of a module's params);
    FSDP2 one all-gather per wrapped block; Megatron's distributed optimizer gathers buckets."""
    return layer_tensors(model) if framework == "deepspeed" else 1


def zero3_reductions_per_step(framework: str, params: float, units: int) -> int:
    """Reduce-scatter collectives one gradient reduction issues: DeepSpeed's buckets of
    `DEEPSPEED_REDUCE_BUCKET_PARAMS`; FSDP2 one per wrapped unit."""
    if framework == "deepspeed":
        return max(1, math.ceil(params / DEEPSPEED_REDUCE_BUCKET_PARAMS))
    return max(1, units)


def prefetch_share(framework: str, layer_params: float) -> float:
    """Share of a layer's gather that prefetch can start while the previous layer computes:
    all of it for FSDP2 (one unit ahead) and Megatron; for DeepSpeed the prefetch bucket's
    worth (`DEEPSPEED_PREFETCH_BUCKET_PARAMS`)."""
    if framework != "deepspeed" or layer_params <= 0:
        return 1.0
    return min(1.0, DEEPSPEED_PREFETCH_BUCKET_PARAMS / layer_params)


def zero3_bytes(plan: DpCollectives, shard: int, replicate: int, weight_bytes: float, grad_bytes: float) -> float:
    """Bytes one rank sends for a step's ZeRO-3 collectives (weight and gradient buffers of the rank)."""
    gathers = plan.forward_gathers + plan.backward_gathers * plan.backward_share
    per_reduction = (cm.ring_all_gather_bytes(shard, grad_bytes)
                     + cm.ring_all_reduce_bytes(replicate, grad_bytes / shard))
    return cm.ring_all_gather_bytes(shard, weight_bytes) * gathers + per_reduction * plan.reductions


def device_chunks(split: tuple[tuple[int, ...], ...], device: int) -> list[tuple[int, int]]:
    """(first block, blocks) of each chunk a pipeline device runs: chunk c of p·v sits on device
    c mod p (`timing.split_layers`), so its first block follows every earlier chunk's."""
    pp = len(split)
    sizes = [split[c % pp][c // pp] for c in range(pp * len(split[0]))]
    return [(sum(sizes[:c]), sizes[c]) for c in range(device, len(sizes), pp)]


def device_params(pc: ParamCount, split: tuple[tuple[int, ...], ...], device: int, tied: bool,
                  ep: int = 1) -> float:
    """Parameters one pipeline device holds (before TP): its blocks, the embedding on the
    first, the final norm and head (a second copy of a tied embedding) on the last; under
    expert parallelism 1/ep of its blocks' routed experts."""
    pp = len(split)
    if pp == 1:
        return float(pc.total) - pc.moe_layers * pc.experts_elsewhere_per_layer(ep)
    if pc.dense_layers:  # which blocks a device runs matters only when some blocks are dense
        params = sum(pc.blocks_held(first, count, ep) for first, count in device_chunks(split, device))
    else:
        params = sum(split[device]) * (pc.per_layer - pc.experts_elsewhere_per_layer(ep))
    if device == 0:
        params += pc.embedding + pc.other
    if device == pp - 1:
        params += pc.final_norm + (pc.embedding if tied and not pc.output_head else pc.output_head)
    return params


@dataclass(frozen=True)
class TpEnds:
    """Tensor-parallel collectives of the embedding (first device) and head + loss (last
    device) per micro-batch: (kind, full-buffer bytes) pairs, kind "all_reduce" or "all_gather"
    (a reduce-scatter moves what an all-gather does)."""

    embedding: tuple[tuple[str, float], ...]
    head: tuple[tuple[str, float], ...]


def tp_ends(framework: str, sequence_parallel: bool, message: float, logits: float, tokens: float) -> TpEnds:
    """The end collectives (`message`: one s·b·h activation; `logits`: s·b·vocab).

    The embedding is vocabulary-sharded: its output is all-reduced (flopwise's plan keeps it
    replicated and slices it for sequence parallelism, whose backward all-gathers; Megatron
    reduce-scatters it into the sequence shard). The head is column-parallel: its input
    gradient is all-reduced, or with sequence parallelism its input all-gathered and the
    gradient reduce-scattered. flopwise's head returns replicated logits (all-gathered,
    `train/parallel/tensor_parallel.py`); Megatron's vocab-parallel loss all-reduces three floats a token.
    """
    if sequence_parallel:
        first = ("all_reduce" if framework == "fsdp" else "all_gather", message)
        embedding = (first, ("all_gather", message))
        head = [("all_gather", message), ("all_gather", message)]
    else:
        embedding = (("all_reduce", message),)
        head = [("all_reduce", message)]
    if framework == "fsdp":
        head.append(("all_gather", logits))
    else:
        head.extend([("all_reduce", 4.0 * tokens)] * VOCAB_PARALLEL_LOSS_ALL_REDUCES)
    return TpEnds(embedding, tuple(head))


def tp_collective_bytes(tp: int, collectives) -> float:
    """Bytes one rank sends for (kind, full-buffer bytes) collectives over `tp` ranks."""
    return sum(cm.ring_all_reduce_bytes(tp, n) if kind == "all_reduce" else cm.ring_all_gather_bytes(tp, n)
               for kind, n in collectives)


def pipeline_sends(pp: int, virtual: int) -> int:
    """Activations and gradients the busiest device sends per micro-batch: each of its chunks
    sends forward unless it is the last and backward unless it is the first; a middle
    device sends both ways for all its chunks, with two devices each holds an end chunk."""
    if pp == 1:
        return 0
    return 2 * virtual - 1 if pp == 2 else 2 * virtual
