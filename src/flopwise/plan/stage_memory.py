"""Memory of every pipeline stage, and the busiest one: what `plan()` reports as the
per-device figure.

Stages are not alike: the first holds the embedding and the most in-flight micro-batches,
the last the output head and the logits (Narayanan et al. 2021; Korthikanti et al. 2022
§4.2.3). Averaging the embedding over all stages understates the first stage of a
large-vocabulary model, so each stage is planned with its own layers and parameters and
the worst one is the device figure. Formulas live in `plan/memory.py`; this module only
places them on stages.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from operator import attrgetter
from typing import NamedTuple

from flopwise.plan import activation_offload, finetune, recompute_modules
from flopwise.plan import memory as mem
from flopwise.plan import step_comm as sc
from flopwise.plan.fsdp_units import planned_blocks_per_unit
from flopwise.plan.band import memory_band
from flopwise.plan.params import ParamCount
from flopwise.plan.spec import RunSpec, local_seq_len
from flopwise.plan.stacks import find_stack
from flopwise.plan.stacks.conventions import FRAMEWORK_DEFAULTS, MemoryConventions, conventions, option_ladder
from flopwise.plan.timing import pipeline_split, split_layers


SAVED_LOSS_BYTES_PER_LOGIT = 4.0
"""What a loss keeps for backward per logit: the fp32 (log-)softmax (`F.cross_entropy` and
Megatron's vocab-parallel cross-entropy both save it); the logits themselves are not saved."""


TOKEN_ID_BYTES = 8.0
"""int64 token ids, which an embedding lookup keeps for its backward."""


class StageMemory(NamedTuple):
    """One pipeline stage's per-device bytes (one TP rank of one DP replica).

    A named tuple rather than a frozen dataclass: as immutable, and cheap enough to build
    for every stage of every layout a search tries."""

    stage: int
    layers: int
    params: float
    weights: float
    gradients: float
    optimizer_states: float
    master_weights: float
    activations: float
    logits: float
    comm_buffers: float
    fp8_buffers: float
    allocator_reserve: float
    cpu_offload_bytes: float
    inflight_layers: float
    total_bytes: float

    def to_dict(self) -> dict:
        """JSON-able fields."""
        return self._asdict()


_TOTAL_BYTES = attrgetter("total_bytes")


@lru_cache(maxsize=4096)
def stage_layers(n_layers: int, pp: int) -> tuple[int, ...]:
    """Layers per stage, by `timing.split_layers`' rule (the remainder on the middle stages
    first): 126 layers over 16 stages are 7 on the first and last stages, 8 on the 14 others."""
    return tuple(sum(chunks) for chunks in split_layers(n_layers, pp, 1))


def inflight_chunks(stage: int, pp: int, micro_batches: int, schedule: str, virtual: int,
                    variant: str = "1f1b") -> float:
    """Micro-batch chunks a stage holds at its peak, in units of the stage's layers.

    1F1B: min(p − i, m) micro-batches (warm-up depth). GPipe: all m. Interleaved (v chunks
    of L/(p·v) layers per device, counted in chunks and divided by v):
    - 1F1B (depth-first): Megatron's warm-up (p − i − 1)·2 + (v − 1)·p + 1 chunks, at most
      m·v; for the first stage this is Korthikanti et al.'s L·(1 + (p−1)/(p·v)).
    - looped BFS (breadth-first, Lamy-Poirier 2023): every forward of a chunk runs before
      the next chunk's, and all forwards before the backwards: all m·v chunks, as GPipe.
    - zero bubble (Qi et al. 2024; torch's `ScheduleInterleavedZeroBubble`): a chunk is held
      from its forward until its deferred weight-gradient pass, which keeps the autograd
      graph alive after the input-gradient pass; torch's order (warm-up (v − 1)·r + p − i − 1
      with r = m / max(1, m // p) micro-batches per round) holds (v − 1)·r + p chunks on every
      device. The last device also keeps its last chunk's graph for all m micro-batches:
      the schedule keeps each micro-batch's loss until the step ends, and the weight pass
      frees only the saved tensors it reads, so the rest stays reachable from the loss.
      That is m chunks plus the other chunks' (v − 1)/v share of the peak.
    """
    if pp == 1:
        return 1.0
    if schedule == "gpipe":
        return float(micro_batches)
    if schedule == "interleaved":
        most = micro_batches * virtual
        if variant == "looped-bfs":
            return float(micro_batches)
        if variant == "zero-bubble":
            per_round = micro_batches / max(1, micro_batches // pp)
            peak = (virtual - 1) * per_round + pp
            if stage == pp - 1:
                peak = micro_batches + peak * (virtual - 1) / virtual
            return min(peak, most) / virtual
        return min((pp - stage - 1) * 2 + (virtual - 1) * pp + 1, most) / virtual
    return float(min(pp - stage, micro_batches))


def held_loss_micro_batches(pp: int, micro_batches: int, schedule: str, variant: str = "1f1b") -> int:
    """Micro-batches whose head inputs and loss tensors the last stage holds at its peak.

    1F1B and interleaved 1F1B run the last stage's backward right after its forward: one.
    GPipe and looped BFS run every forward first, and zero bubble keeps each micro-batch's
    loss graph until the step ends (`inflight_chunks`): all m."""
    if pp == 1:
        return 1
    if schedule == "gpipe" or (schedule == "interleaved" and variant in ("looped-bfs", "zero-bubble")):
        return micro_batches
    return 1


@lru_cache(maxsize=4096)
def busiest_stage_candidates(layers: tuple[int, ...], dense: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """Stages that can be the busiest: the first (embedding, most micro-batches in flight),
    the last (head and logits) and, when it holds more layers than the first, the second
    (the first to get a remainder layer, the most in flight of the middle ones). Every other
    middle stage holds no more layers and no more micro-batches than the second (see
    `stage_layers` and `inflight_chunks`). With dense blocks (lighter than MoE ones; `dense`:
    how many each stage holds), every stage that holds one and the first that holds none are
    candidates too."""
    pp = len(layers)
    if pp > 2 and layers[1] > layers[0]:
        candidates = {0, 1, pp - 1}
    else:
        candidates = {0, pp - 1} if pp > 1 else {0}
    for i, held in enumerate(dense or (0,) * pp):
        candidates.add(i)
        if not held:  # the first all-MoE stage
            break
    return tuple(sorted(candidates))


@lru_cache(maxsize=4096)
def stage_layer_counts(split: tuple[tuple[int, ...], ...]) -> tuple[int, ...]:
    """Blocks each stage holds, all its chunks together (cached: the search asks per layout)."""
    return tuple(sum(chunks) for chunks in split)


@lru_cache(maxsize=4096)
def stage_blocks(split: tuple[tuple[int, ...], ...]) -> tuple[tuple[tuple[int, int], ...], ...]:
    """(first block, blocks) of each chunk every stage holds (`step_comm.device_chunks`): an
    interleaved stage's chunks are not contiguous, and which blocks it holds matters when some are dense."""
    return tuple(tuple(sc.device_chunks(split, stage)) for stage in range(len(split)))


def estimate_memory(spec: RunSpec, pc: ParamCount, warnings: list[str], every_stage: bool = True) -> mem.MemoryEstimate:
    """Per-stage memory and the busiest stage's figure with the fit verdict (appends warnings).

    Under a named stack (`spec.stack`, plan/stacks) its memory conventions apply and, when
    the layout does not fit at the stack's defaults, its memory-only options are tried in
    order (`stacks.conventions.option_ladder`); the first set that fits is the estimate, with
    `fits_with` naming it. `every_stage=False` plans only `busiest_stage_candidates` (the same
    busiest figure, fewer stages listed), for searches that call this many thousand times."""
    stack = None if spec.stack == "flopwise" else find_stack(spec.stack)
    if stack is None:
        return _estimate(spec, pc, warnings, every_stage, FRAMEWORK_DEFAULTS)
    precision = spec.workload.precision
    zero = spec.layout.zero_stage
    stated = spec.cluster.extra.get("grad_reduce")  # --grad-reduce: no ladder changes a stated dtype
    first = _estimate(spec, pc, warnings, every_stage, conventions(stack, precision, (), zero, stated))
    if first.fits:
        return first
    # the first option set that fits; else the first within the memory band (tight); else the defaults
    tight = first if first.may_fit else None
    for options in option_ladder(stack, precision):
        if stated and "bf16-grad-reduce" in options:
            options = tuple(o for o in options if o != "bf16-grad-reduce")
            if not options:
                continue
        tried = _estimate(spec, pc, [], every_stage, conventions(stack, precision, options, zero, stated))
        if tried.fits:
            return tried
        tight = tight or (tried if tried.may_fit else None)
    return tight or first


def amp_params(spec: RunSpec, stack_default: bool) -> bool:
    """Whether the spec trains AMP-style, fp32 parameters under autocast (`--fp32-params`, else
    `stack_default`, the stack's 16-bit training): a full 16-bit training under FSDP/DDP conventions."""
    stated = spec.workload.fp32_params
    return ((stack_default if stated is None else stated) and spec.workload.precision in ("bf16", "fp16")
            and spec.layout.framework == "fsdp" and spec.workload.finetune == "full")


def _estimate(spec: RunSpec, pc: ParamCount, warnings: list[str], every_stage: bool,
              conv: MemoryConventions) -> mem.MemoryEstimate:
    """`estimate_memory` under one set of memory conventions."""
    lay, work, cluster = spec.layout, spec.workload, spec.cluster
    model, hw = spec.model, cluster.hardware
    seq = local_seq_len(spec)  # context parallelism keeps a cp-th of each sequence on a rank
    framework = lay.framework
    sb = _state_bytes(work.precision, work.optimizer, framework, lay.zero_stage)
    # AMP (fp32 parameters under autocast): fp32 weights and gradients, no master; for a full training
    amp = amp_params(spec, conv.fp32_params)
    if amp:
        sb = mem.amp_state_bytes(work.optimizer)
    if conv.pure_states:  # fp8 GEMMs over pure-bf16 parameters (torchtune): no master, bf16 optimizer states
        sb = mem.state_bytes("bf16-true", work.optimizer)
    if conv.grad_bytes is not None or conv.weight_bytes is not None or conv.grad_partition_bytes is not None:
        sb = mem.StateBytes(sb.weight if conv.weight_bytes is None else conv.weight_bytes,
                            sb.grad if conv.grad_bytes is None else conv.grad_bytes,
                            sb.master, sb.optimizer,
                            sb.grad_partition if conv.grad_partition_bytes is None else conv.grad_partition_bytes)
    e = mem.activation_dtype_bytes(work.precision)
    cnn = model.arch == "cnn"
    if cnn:
        warnings.append("CNN activation memory is not modelled; memory covers model states only")
    if framework == "deepspeed" and lay.pp > 1 and lay.zero_stage >= 2:
        warnings.append("deepspeed: pipeline parallelism runs with ZeRO-0/1 only; planned as asked")
    # the split the step is timed on, the embedding or loss in a layer's slot where the stack counts them
    split = ((0,),) if cnn else pipeline_split(spec)
    layers = stage_layer_counts(split)
    blocks = stage_blocks(split)
    per_unit = planned_blocks_per_unit(lay, work, pc.per_layer, max(layers))  # FSDP2 units of grouped blocks
    largest = mem.largest_unit_params(pc, lay.tp, per_unit)
    gather_unit = largest
    if conv.zero3_gathers_modules and model.arch != "cnn":
        gather_unit = mem.largest_module_params(model, pc, lay.tp)
    buffers = mem.comm_buffer_bytes(pc, sb, lay.zero_stage, lay.shard_group, lay.tp, lay.offload, framework,
                                    gather_unit)
    terms = None if cnn else _activation_terms(model, seq, lay.micro_batch_size, e, work.dropout,
                                               lay.flash_attention, conv.gemm_input_bytes,
                                               conv.fused_norm or lay.compiled, conv.fused_swiglu or lay.compiled,
                                               conv.act_input_bytes, conv.norm_input_bytes)
    sharded = lay.sequence_parallel or conv.activations_sharded_over_tp  # SP, or GSPMD's model-axis sharding
    if terms is not None and terms.routed_copies and sharded and lay.expert_tp < lay.tp:
        # folded experts (etp < tp): a rank's dispatcher sends only its own sequence shard's tokens,
        # gathered over the etp ranks of its experts, not the whole tp group's
        terms = dataclasses.replace(terms, routed_copies=terms.routed_copies * lay.expert_tp / lay.tp)
    per_layer = 0.0 if cnn else mem.activation_bytes_per_layer(terms, lay.tp, sharded, lay.recompute)
    rebuilt = 0.0
    if not cnn and (lay.recompute == "full" or mem.recomputed_block_share(lay.recompute) is not None):
        # the layer being back-propagated is rebuilt whole for a moment
        rebuilt = mem.activation_bytes_per_layer(terms, lay.tp, sharded, "none")
    elif not cnn and recompute_modules.parse(lay.recompute) is not None:
        # the modules of the layer being back-propagated are rebuilt for a moment
        rebuilt = mem.activation_bytes_per_layer(terms, lay.tp, sharded, "none") - per_layer
    tuned = finetune.split_of(spec)  # LoRA / QLoRA: frozen base, adapters' states and paths
    if tuned is not None:
        adapter = finetune.block_activation_delta_bytes(spec, tuned, seq, e, conv.gemm_input_bytes, conv.fused_norm)
        per_layer += adapter * (1.0 - mem.recompute_forward_fraction(lay.recompute))
        rebuilt += adapter if rebuilt else 0.0
        buffers = finetune.comm_and_transient_bytes(tuned, spec, pc, lay.zero_stage, lay.shard_group, per_unit)
    # model states are linear in a stage's parameters: bytes per parameter, once
    unit = _states_per_param(sb, lay.zero_stage, lay.shard_group, lay.offload)
    if conv.master_unsharded and lay.offload == "none":
        # the stack keeps the whole fp32 master on every rank and steps a view of its partition
        unit = dataclasses.replace(unit, master_weights=sb.master)
    # expert parallelism: a rank holds 1/ep of the routed experts, whose states shard over dp x cp / ep
    experts_apart = lay.ep > 1 or lay.expert_tp != lay.tp  # the experts' own layout (ep, etp)
    expert_unit = unit if not experts_apart else _states_per_param(sb, lay.zero_stage, lay.expert_shard_group,
                                                                   lay.offload)
    if experts_apart and conv.master_unsharded and lay.offload == "none":
        expert_unit = dataclasses.replace(expert_unit, master_weights=sb.master)
    # FSDP2 inside a pipeline stage: torch's schedule turns off resharding after backward and
    # gradient sync for every micro-batch but the last (`PipelineStage.backward_maybe_with_nosync`),
    # so from the first backward until the pass's reduce-scatter the stage holds its whole
    # weights and unsharded gradients beside its shards. The shards are the resident model
    # states; the gathered copy is a buffer of the pass, in place of the two gathered units.
    stage_gathered = framework == "fsdp" and lay.zero_stage >= 3 and lay.pp > 1 and lay.offload != "params" \
        and tuned is None
    # With gradient sync off, FSDP2 keeps each gradient unsharded and, under a MixedPrecisionPolicy
    # whose reduce dtype (fp32, flopwise's and torchtitan's) differs from the 16-bit parameters,
    # upcasts it to fp32 to accumulate (`FSDPParam.to_accumulated_grad_if_needed`) until the synced
    # micro-batch reduce-scatters it: the pipeline schedule's micro-batches above, and flopwise's
    # own accumulation micro-steps (`train/parallel/strategy_torch.gradient_sync`; measured in
    # tests/train/parallel/test_accumulated_gradients.py).
    accumulated_grad = sb.grad if work.precision in ("bf16-true", "fp32", "tf32") else 4.0
    unsharded_accumulation = (framework == "fsdp" and spec.stack == "flopwise" and lay.pp == 1
                              and lay.grad_accum > 1 and lay.zero_stage >= 2 and lay.offload == "none"
                              and tuned is None and not lay.fsdp_sync_every_micro_step)
    # ZeRO-2 (FSDP2 without resharding after forward) inside a pipeline stage: the weights are
    # whole already, and the schedule's no-sync micro-batches leave each gradient unsharded in fp32
    # until the last one reduce-scatters it (torchtitan's default for PP, `reshard_after_forward=False`)
    unsharded_accumulation = unsharded_accumulation or (
        framework == "fsdp" and lay.pp > 1 and lay.zero_stage == 2 and lay.offload == "none" and tuned is None)
    # DTensor's embedding backward returns a replicated gradient for a row-wise sharded table
    # (torch's sharding rule for `embedding_dense_backward`): without FSDP's reduce-scatter the
    # first stage holds the whole table's gradient, not its 1/t shard
    whole_embedding_grad = framework == "fsdp" and lay.tp > 1 and lay.zero_stage < 2
    fraction = cluster.allocator_reserve
    rows = []  # plain tuples in StageMemory's field order: building dataclasses costs more than the sums
    # dense blocks each stage holds (the leading ones of DeepSeek-V3, every other one of Llama 4)
    dense = tuple(sum(pc.dense_blocks_in(first, n) for first, n in chunks) for chunks in blocks) \
        if pc.dense_layers else None
    for i in range(len(layers)) if every_stage else busiest_stage_candidates(layers, dense):
        n = layers[i]
        params = _stage_params(pc, blocks[i], i, model.tied_embeddings, lay.pp, n) / lay.tp
        experts = 0.0  # this device's share of the routed experts, under expert parallelism
        if experts_apart:  # 1/(ep x etp) of the stage's MoE blocks' experts, for the tp-th `params` counted
            routed = n - (dense[i] if dense else 0)
            experts = routed * pc.experts_per_layer / (lay.expert_tp * lay.ep)
            params += experts - routed * pc.experts_per_layer / lay.tp  # the parameters this device holds
        if cnn:
            activations = logits = inflight = 0.0
        else:
            activations, logits, inflight, loss_transient = _stage_activations(
                spec, e, terms, per_layer, rebuilt, i, n, conv.loss_bytes_per_logit, tuned is not None,
                not conv.fused_norm, conv.loss_chunks, conv.loss_keeps_logits)
            if tuned is not None:  # a fine-tune's transients are `other`, beside QLoRA's dequantised weight
                logits -= loss_transient
                # the loss's backward frees what the head's end keeps before the last block is
                # recomputed: the rebuilt block and those are never alive together
                activations -= min(rebuilt, logits)
        relief, host_activations = activation_offload.device_and_host_bytes(lay, per_layer, inflight, n)
        activations -= relief  # offloaded blocks' activations wait in host memory (plan/activation_offload.py)
        fp8 = mem.fp8_buffer_bytes(work.precision, framework, params, largest, lay.zero_stage)
        if conv.fp8_cache_bytes_per_param is not None and fp8:
            fp8 *= conv.fp8_cache_bytes_per_param / mem.FP8_CACHED_BYTES_PER_PARAM
        if amp and not cnn:  # autocast's 16-bit weight copies, saved for the backward (the fp8 copies' slot)
            fp8 += mem.autocast_copy_bytes(params, pc.per_layer / lay.tp, n,
                                           pc.embedding / lay.tp if i == 0 else 0.0, lay.recompute)
        weights, gradients = params * unit.weights, params * unit.gradients
        if unsharded_accumulation:
            gradients = params * accumulated_grad
        if whole_embedding_grad and i == 0:
            gradients += pc.embedding * (1 - 1 / lay.tp) * unit.gradients
        optimizer, master, cpu = params * unit.optimizer_states, params * unit.master_weights, params * unit.cpu_bytes
        if experts:  # the experts' states shard over their own, ep times smaller, group
            weights += experts * (expert_unit.weights - unit.weights)
            if not unsharded_accumulation:
                gradients += experts * (expert_unit.gradients - unit.gradients)
            optimizer += experts * (expert_unit.optimizer_states - unit.optimizer_states)
            master += experts * (expert_unit.master_weights - unit.master_weights)
            cpu += experts * (expert_unit.cpu_bytes - unit.cpu_bytes)
        if tuned is not None:
            weights, gradients, optimizer, master, cpu = finetune.stage_states(
                tuned, spec, params, n, sb, lay.zero_stage, lay.shard_group, lay.offload)
        cpu += host_activations
        gathered = params * (sb.weight + accumulated_grad) if stage_gathered else buffers
        if tuned is not None and not cnn:
            gathered += loss_transient
        allocated = weights + gradients + optimizer + master + activations + logits + gathered + fp8
        # mem.allocator_reserve_bytes: the slack of what is allocated and freed within a step
        reserve = (gradients + activations + logits + gathered + fp8) * fraction
        rows.append((i, n, params, weights, gradients, optimizer, master, activations, logits, gathered, fp8,
                     reserve, cpu, inflight, allocated + reserve))
    stages = tuple(map(StageMemory._make, rows))
    worst = max(stages, key=_TOTAL_BYTES)
    device_bytes = hw.memory_bytes or 0.0
    capacity = device_bytes - cluster.memory_reserve_gib * mem.GIB
    if not device_bytes:
        warnings.append(f"{hw.key} has no known memory size; the fit verdict assumes it does not fit")
    return mem.MemoryEstimate(
        worst.weights, worst.gradients, worst.optimizer_states, worst.master_weights,
        worst.activations, worst.logits, worst.comm_buffers, worst.total_bytes, capacity, device_bytes,
        worst.cpu_offload_bytes, per_layer, worst.inflight_layers,
        # the allocator frees its cached blocks and retries before it fails an allocation
        # (PyTorch "CUDA semantics — memory management"), so the fit is judged on allocated bytes
        bool(device_bytes) and worst.total_bytes - worst.allocator_reserve <= capacity,
        fp8_buffers=worst.fp8_buffers, allocator_reserve=worst.allocator_reserve, framework=framework,
        worst_stage=worst.stage, stages=stages, stack=spec.stack, fits_with=conv.options, band=memory_band(),
    )


def every_stage_memory(spec: RunSpec) -> tuple[StageMemory, ...]:
    """Every pipeline stage's memory, first to last (the plan itself keeps only the stages
    that can be the busiest)."""
    from flopwise.plan.params import count_params

    return estimate_memory(spec, count_params(spec.model), [], every_stage=True).stages


@lru_cache(maxsize=4096)
def _activation_terms(model, seq_len: int, micro_batch: int, e: float, dropout: bool, flash: bool,
                      gemm_input_bytes: float | None = None, fused_norm: bool = False, fused_swiglu: bool = False,
                      act_input_bytes: float | None = None,
                      norm_input_bytes: float | None = None) -> mem.ActivationTerms:
    """`activation_terms`, cached: a search tries many layouts with the same micro-batch."""
    return mem.activation_terms(model, seq_len, micro_batch, e, dropout, flash,
                                rmsnorm_saves_normalized=not fused_norm, gemm_input_bytes=gemm_input_bytes,
                                fused_swiglu=fused_swiglu, act_input_bytes=act_input_bytes,
                                norm_input_bytes=norm_input_bytes)


@lru_cache(maxsize=256)
def _state_bytes(precision: str, optimizer: str, framework: str, zero_stage: int) -> mem.StateBytes:
    """`framework_state_bytes`, cached: searches ask for the same few combinations."""
    return mem.framework_state_bytes(precision, optimizer, framework, zero_stage)


@lru_cache(maxsize=4096)
def _states_per_param(sb: mem.StateBytes, zero_stage: int, dp: int, offload: str) -> mem.ModelStates:
    """Model-state bytes per parameter (they are linear in the parameters), cached."""
    return mem.model_states(1.0, sb, zero_stage, dp, offload)


def _stage_params(pc: ParamCount, chunks: tuple[tuple[int, int], ...], stage: int, tied: bool, pp: int,
                  blocks: int) -> float:
    """Parameters held by one stage: its blocks (`chunks`: first block and count of each; DeepSeek's
    leading dense ones smaller), the embedding (and position/other terms) on the first, the head
    and final norm on the last, whether or not the stage holds any block. A tied head is a second
    copy of the embedding on the last stage when the pipeline splits them (Megatron keeps both)."""
    if pp == 1:
        return float(pc.total)
    if pc.dense_layers:
        params = float(sum(pc.blocks_held(first, count) for first, count in chunks))
    else:  # every block alike: the count (`blocks`) is enough (the search asks this many thousand times)
        params = float(pc.blocks_held(0, blocks))
    if stage == 0:
        params += pc.embedding + pc.other
    if stage == pp - 1:
        params += pc.final_norm + (pc.embedding if tied and not pc.output_head else pc.output_head)
    return params


def _stage_activations(spec: RunSpec, e: float, terms: mem.ActivationTerms, per_layer: float, rebuilt: float,
                       stage: int, layers: int, loss_bytes_per_logit: float | None = None,
                       frozen_base: bool = False, upcast_norms: bool = True,
                       loss_chunks: int = 1, keeps_logits: bool = False) -> tuple[float, float, float, float]:
    """(layer activations + embedding's token ids, head inputs + logits, in-flight layers, the part of
    the logits that is the loss's transient peak rather than kept for backward) of one stage.

    `frozen_base` (LoRA / QLoRA): the frozen embedding keeps no token ids, the first block's first
    norm nothing (`finetune.first_block_saving`), the head's end one copy of the last hidden state
    (`finetune.FROZEN_HEAD_INPUT_COPIES`), in fp32 for an upcasting RMSNorm (`upcast_norms`: not a
    stack's fused norm). `keeps_logits`: the step holds the e-byte logits themselves through the backward
    (litgpt), so they are kept beside what the loss saves."""
    model, lay, work = spec.model, spec.layout, spec.workload
    seq = local_seq_len(spec)
    chunks = inflight_chunks(stage, lay.pp, lay.grad_accum, lay.pipeline_schedule, lay.virtual_stages,
                             lay.interleaved_variant)
    inflight = layers * chunks
    activations = per_layer * inflight + rebuilt
    if stage == 0:
        # the embedding keeps its token ids (int64: `embedding_dense_backward` reads them) and, with
        # dropout, its output's mask (Korthikanti et al. 2022 §4.3); its output is the first block's
        # input, which the block's own activations already count
        tokens = float(seq) * lay.micro_batch_size
        ids = 0.0 if frozen_base else TOKEN_ID_BYTES
        per_mb = tokens * (ids + (model.hidden / (lay.tp if lay.sequence_parallel else 1)
                                  if work.dropout else 0.0))
        if frozen_base and lay.recompute == "none" and layers:
            per_mb -= finetune.first_block_saving(model, seq, lay.micro_batch_size, e, upcast_norms,
                                                  lay.tp if lay.sequence_parallel else 1)
        activations += per_mb * chunks
    logits = 0.0
    if stage == lay.pp - 1:
        # per held micro-batch: the head's saved inputs and the fp32 log-softmax the loss keeps for
        # backward; once, the rest of the loss's peak (the fp32 logits, a 16-bit copy), which is freed
        # before the next micro-batch
        per_element = mem.loss_logits_bytes_per_element(lay.framework, e)
        if loss_bytes_per_logit is not None:  # a named stack's loss (plan/stacks)
            per_element = e + loss_bytes_per_logit
        elements = seq * lay.micro_batch_size * model.vocab_size / lay.tp
        held = held_loss_micro_batches(lay.pp, lay.grad_accum, lay.pipeline_schedule, lay.interleaved_variant)
        kept = SAVED_LOSS_BYTES_PER_LOGIT
        if loss_bytes_per_logit is not None:  # an in-place fused loss keeps only the logits' own bytes
            kept = min(kept, loss_bytes_per_logit)
        if keeps_logits:  # the matmul output itself, held by the training step
            kept += e
        head_inputs = 2 * terms.layer_input
        if frozen_base:  # the frozen final norm's input alone, fp32 for an upcasting RMSNorm
            head_inputs = finetune.FROZEN_HEAD_INPUT_COPIES * terms.layer_input + (finetune.norm_upcast_bytes(
                model, seq, lay.micro_batch_size, e) if upcast_norms else 0.0)
        transient = (per_element - kept) * elements / loss_chunks  # a chunked loss: one chunk's at a time
        logits = held * (head_inputs + kept * elements) + transient
        return activations, logits, inflight, transient
    return activations, logits, inflight, 0.0
