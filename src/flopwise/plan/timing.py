"""Step time from the operator model, the pipeline schedule and communication as scheduled.

Per micro-batch, each pipeline device runs its layers (`ops.layer_times`: forward,
backward, recompute), the embedding if it holds the first layer and the head + loss if
it holds the last; tensor-parallel collectives sit inside every layer. Then:

- pipeline (p stages, m micro-batches, v chunks per device; t_i a device's time per
  micro-batch): step = m·max t_i + (Σ t_i − max t_i)/v. Uniform stages give the familiar
  bubble (p−1)/(m·v) (Narayanan et al. 2021 §2.2); uneven splits (126 layers over 16
  stages) and the embedding/head on the end stages make the slowest stage set the pace.
  A Megatron stack with one or two chunks more than layers counts the loss, then the
  embedding, as a layer (`end_slots`): its end chunk holds it alone.
  GPipe and 1F1B have the same bubble (v = 1); they differ in memory only.
- tensor parallel: 2 collectives forward and 2 backward per layer (all-reduce, or
  all-gather + reduce-scatter with sequence parallelism), 2 more with full recompute.
  Forward ones are exposed; in the backward the input-gradient collective overlaps the
  weight-gradient GEMM (Megatron's async TP all-reduce). With `tp_comm_overlap` both
  directions hide behind the GEMMs they are chunked with (Transformer Engine userbuffers).
  A LoRA under Megatron-Core adds its adapters' own collectives, exposed
  (`finetune.adapter_tp_collectives`); its frozen base has only the adapters' small
  weight-gradient GEMMs to hide a backward collective behind.
- data parallel: gradients are reduced in buckets while the last micro-batch's backward
  runs; what is exposed is what does not fit in that backward, and at least the last
  bucket (`last_bucket_share`: 25 MB for DDP/FSDP, Megatron's bucket or its embedding),
  all of it where the stack does not overlap (`stack_dp_overlap`). ZeRO-1/2 also all-gather
  the updated weights after the optimizer step (exposed);
  ZeRO-3 gathers weights before forwards and backwards, prefetched behind compute one
  unit ahead (the first unit's gather is exposed), and reduces gradients once per step or
  every micro-batch: how often is `step_comm.zero3_collectives` (FSDP2's root once a
  micro-batch, a pipeline stage once a step, DeepSpeed every micro-batch), the one count
  the predicted bytes read too. HSDP gathers within its shard group and all-reduces the
  reduced shard across replicas. ZeRO-1/2's weight all-gather
  after the step hides behind the next forward (FSDP, Megatron --overlap-param-gather)
  except under DeepSpeed, which runs it at the end of the step.
- pipeline point-to-point: an activation forward and a gradient backward per micro-batch
  and chunk boundary, on the critical path; the bytes are the busiest device's sends.
- tensor parallel at the ends (`step_comm.tp_ends`): the embedding's output all-reduce, the
  head's input collectives and (flopwise's trainer) the logits' all-gather, on the end devices.
- optimizer step: memory-bound over the parameters this rank owns (1/dp of them with ZeRO).
- expert parallel (MoE): each layer's token dispatch and combine, forward and backward, as the
  dispatcher runs them (`expert_comm`: Megatron-Core's all-to-all or DeepEP); with the shared expert
  overlapped, what runs beside its GEMMs is hidden.
- hidden communication is not free: compute slows by OVERLAP_SLOWDOWN × the hidden time
  (NCCL's thread blocks occupy SMs while they run).
- on a CPU, collectives run on the cores the compute needs: no DP overlap is credited;
  with a measured profile each collective call is charged its measured time on this
  machine (gloo), unit by unit for FSDP, bucket by bucket for DDP (`comm.measured_dp_seconds`).

MFU = model FLOPs per second / (devices × peak) (Chowdhery et al. 2022, App. B).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from flopwise.catalog.models import kv_heads, query_key_head_dim, value_head_dim
from flopwise.plan import comm as cm
from flopwise.plan import activation_offload, expert_comm
from flopwise.plan import finetune
from flopwise.plan import ops
from flopwise.plan import step_comm as sc
from flopwise.plan.comm import CommEstimate, Links
from flopwise.plan.fsdp_units import planned_blocks_per_unit, unit_count
from flopwise.plan.gemm import DeviceRates
from flopwise.plan.params import count_params
from flopwise.plan.spec import local_seq_len
from flopwise.plan.stacks import find_stack

DDP_BUCKET_BYTES = 25 * 2**20
"""PyTorch DDP's default gradient bucket (bucket_cap_mb=25)."""
OVERLAP_SLOWDOWN = 0.4
"""Compute time lost per second of communication hidden behind it. Measured: overlapping GPT and
LLaMA layers' compute with collectives on 4 A100 / H100 slows the compute by 18.9 % on average and
up to 40 % (Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed Deep
Learning, arXiv 2507.03114): NCCL's 16-32 channels take 12-25 % of an A100's 108 or an H100's 132
SMs (NCCL_MIN/MAX_NCHANNELS), a GEMM sized for all SMs then runs an extra partial wave, and the
collective shares memory bandwidth. FSDP/ZeRO-3 keeps large all-gathers and reduce-scatters in
flight through the whole step; the value is the top of the measured range, chosen on the
throughput rows of published.md."""
MEGATRON_MIN_BUCKET_PARAMS = 40_000_000
"""Megatron-Core DDP's default gradient bucket: max(40M, 1M × dp) parameters
(megatron/core/distributed/distributed_data_parallel.py, `bucket_size`, at the tree of its H100
table, commit f2e5db40, lines 51-53); buckets close at parameter boundaries
(param_and_grad_buffer.py), so the bucket holding the embedding is at least the embedding."""
HOST_ADAM_PARAMS_PER_S = 1e9
"""CPU Adam (DeepSpeed's vectorised kernel) parameters per second per device when the
optimizer is offloaded (assumption; ZeRO-Offload, Ren et al. 2021, reports ~1 s per
step for 10B parameters on one DGX-2 host)."""


@dataclass(frozen=True)
class TimeEstimate:
    """Seconds per step and for the whole job; throughput, utilisation and where time goes."""

    peak_flops: float
    efficiency: float
    efficiency_source: str
    efficiency_confidence: str
    compute_seconds: float
    bubble_fraction: float
    exposed_comm_seconds: float
    step_seconds: float
    tokens_per_step: float
    tokens_per_second: float
    tokens_per_second_per_device: float
    mfu: float
    hfu: float
    steps: float
    total_seconds: float
    device_hours: float
    gemm_seconds: float = 0.0
    attention_seconds: float = 0.0
    memory_bound_seconds: float = 0.0
    optimizer_seconds: float = 0.0
    bubble_seconds: float = 0.0
    tp_exposed_seconds: float = 0.0
    dp_exposed_seconds: float = 0.0
    pp_exposed_seconds: float = 0.0
    offload_seconds: float = 0.0
    exposed_comm_share: float = 0.0
    stage_layers: str = ""
    model: str = "operator"
    cp_exposed_seconds: float = 0.0  # context parallelism's K/V ring, beyond the attention it overlaps
    ep_exposed_seconds: float = 0.0  # expert parallelism's token dispatch and combine, less what the shared expert hides
    # fp8: the same MFU over the device's dense 16-bit peak, torchtitan's denominator for every precision
    # (Composer's SpeedMonitor divides by the fp8 peak, as `mfu` does); None for other precisions
    mfu_16bit_peak: float | None = None

    def to_dict(self) -> dict:
        """JSON-able fields (infinities become None)."""
        out = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            out[name] = None if isinstance(value, float) and value in (float("inf"), float("-inf")) else value
        return out


def bubble_fraction(pp: int, micro_batches: int, schedule: str, virtual: int) -> float:
    """Idle share of uniform pipeline stages: (p−1)/(m·v); v = 1 unless interleaved."""
    if pp == 1:
        return 0.0
    return (pp - 1) / (micro_batches * (virtual if schedule == "interleaved" else 1))


@lru_cache(maxsize=4096)
def split_layers(n_layers: int, pp: int, virtual: int, embedding_slot: bool = False,
                 loss_slot: bool = False) -> tuple[tuple[int, ...], ...]:
    """Layers of each chunk per device: chunk c of p·v runs on device c mod p.

    Layers are spread evenly; the remainder goes to the middle chunks first, then the last,
    then the first: the first chunk carries the embedding and (1F1B) the most micro-batches
    in flight, the last the head. The one split rule for time, memory (`stage_memory.py`)
    and the trainer's pipeline stages.

    `embedding_slot` / `loss_slot` (Megatron-Core's account_for_embedding_in_pipeline_split /
    account_for_loss_in_pipeline_split): the embedding (the loss) counts as one more layer, and
    the first (last) chunk builds one decoder layer fewer, none at all allowed
    (megatron/core/transformer/transformer_block.py, `get_num_layers_to_build`)."""
    chunks = pp * virtual
    base, extra = divmod(n_layers + int(embedding_slot) + int(loss_slot), chunks)
    counts = [base] * chunks
    order = list(range(1, chunks - 1)) + [chunks - 1, 0] if chunks > 2 else list(range(chunks))[::-1]
    for c in order[:extra]:
        counts[c] += 1
    counts[0] -= int(embedding_slot)
    counts[-1] -= int(loss_slot)
    return tuple(tuple(counts[c] for c in range(dev, chunks, pp)) for dev in range(pp))


def stack_switch(stack_name: str, field: str) -> bool:
    """A yes/no field of the named stack (`plan/stacks/base.Stack`); False for a name no stack module describes."""
    stack = find_stack(stack_name)
    return bool(stack is not None and getattr(stack, field))


def stack_ends_in_split(stack_name: str) -> bool:
    """Whether the stack can count the embedding and the loss as pipeline layers (`Stack.ends_in_pipeline_split`)."""
    return stack_switch(stack_name, "ends_in_pipeline_split")


@lru_cache(maxsize=4096)
def end_slots(n_layers: int, pp: int, virtual: int, stack_name: str) -> tuple[bool, bool]:
    """(embedding, loss): which ends take a decoder layer's slot in the split (`split_layers`).

    Neither while the p·v chunks are no more than the layers. Under a stack that counts them
    (`stack_ends_in_split`: Megatron-Core), the loss when the chunks are one more than the
    layers, both when two more: every chunk then holds one slot, and the last (first) holds the
    loss (embedding) alone. More chunks than that, neither (`planner.validate` refuses the layout).
    The loss first: NeMo's one recipe with a chunk more than layers (DeepSeek-V3 SFT, 61 layers in
    pp 31 × vp 2) sets account_for_loss_in_pipeline_split and not the embedding's
    (scripts/performance/llm/finetune_deepseek_v3.py), and the head's GEMMs outweigh a block's
    (DeepSeek-V3: 0.93B parameters against a block's 0.59B active), where the embedding is a lookup."""
    extra = pp * virtual - n_layers
    if extra not in (1, 2) or not stack_ends_in_split(stack_name):
        return False, False
    return extra == 2, True


def pipeline_split(spec) -> tuple[tuple[int, ...], ...]:
    """The spec's layers per chunk and device (`split_layers`), its ends counted as `end_slots` says."""
    lay = spec.layout
    v = lay.virtual_stages if lay.pipeline_schedule == "interleaved" else 1
    return split_layers(spec.model.n_layers, lay.pp, v, *end_slots(spec.model.n_layers, lay.pp, v, spec.stack))


def end_slots_note(n_layers: int, pp: int, virtual: int, stack_name: str) -> str | None:
    """What a plan assumes when an end takes a layer's slot (`end_slots`), for its defaults; else None."""
    embedding, loss = end_slots(n_layers, pp, virtual, stack_name)
    if not loss:
        return None
    chunks = f"{pp} × {virtual} chunks" if virtual > 1 else f"{pp} stages"
    if embedding:
        return (f"the embedding and the loss take the first and last pipeline chunks' layer slots ({n_layers} "
                f"layers in {chunks}; Megatron-Core account_for_embedding_in_pipeline_split and "
                "account_for_loss_in_pipeline_split)")
    return (f"the loss takes the last pipeline chunk's layer slot ({n_layers} layers in {chunks}, the output layer and "
            "loss alone in the last; Megatron-Core account_for_loss_in_pipeline_split)")


@lru_cache(maxsize=4096)
def describe_split(split: tuple[tuple[int, ...], ...]) -> str:
    """'8,8,...' per device (chunks joined by '+' when interleaved)."""
    return ",".join("+".join(str(n) for n in dev) for dev in split)


@dataclass(frozen=True)
class StepInputs:
    """What the step model needs beyond the RunSpec: sizes, rates, links and conventions."""

    params_per_rank: float  # parameters on one tp × pp rank
    grad_bytes: float
    weight_bytes: float
    activation_bytes: float  # bytes per activation element (2 for 16-bit)
    hardware_flops_per_token: float
    model_flops_per_token: float
    framework: str = "fsdp"
    frozen_gather_bytes: float = 0.0  # a fine-tune's frozen base on one rank, which ZeRO-3 gathers too
    trainable_fraction: float = 1.0  # trainable share of a device's parameters (a fine-tune's adapters)
    saved_bytes_per_layer: float = 0.0  # one block's saved activations, one micro-batch (what activation offload moves)
    # host <-> device copies (offloaded states and activations): `activation_offload.host_bytes_per_second`
    host_bytes_per_second: float = activation_offload.FALLBACK_HOST_BYTES_PER_S


def step_time(spec, inputs: StepInputs, rates: DeviceRates, links: Links, total_units: float, peak: float,
              source: str, confidence: str) -> tuple[TimeEstimate, CommEstimate]:
    """Time one optimizer step of a transformer RunSpec on its layout; `peak` is the dense
    peak of the training dtype (what MFU divides by)."""
    model, lay, work = spec.model, spec.layout, spec.workload
    # data parallelism's gradient group: the cp ranks of a replica hold the same weights too
    tp, pp, dp, m = lay.tp, lay.pp, lay.gradient_group, lay.grad_accum
    v = lay.virtual_stages if lay.pipeline_schedule == "interleaved" else 1
    cp = lay.cp
    # under context parallelism a rank computes a cp-th of each sequence's tokens, its queries
    # against the whole sequence's keys
    s, b, e = local_seq_len(spec), lay.micro_batch_size, inputs.activation_bytes
    sp = lay.sequence_parallel and tp > 1
    layer = finetune.layer_times(ops.layer_times(model, s, b, tp, sp, lay.flash_attention, work.dropout,
                                                 lay.recompute, work.precision, rates,
                                                 work.seq_len if cp > 1 else None, lay.ep, lay.expert_tp,
                                                 stack_switch(spec.stack, "recompute_early_stop")),
                                 spec, rates)
    ends = finetune.end_times(ops.end_times(model, s, b, tp, sp, work.precision, rates, stack_cross_entropy(spec)),
                              spec, rates)
    per_node = links.devices_per_node

    # tensor parallel, per layer and micro-batch
    message = float(s * b * model.hidden * e)
    one, n_coll, tp_wire, tp_layer = tp_layer_seconds(lay, layer, links, message, model)
    # a fine-tune's adapters add their own collectives, none hidden (`finetune.adapter_tp_collectives`)
    adapter_fwd, adapter_bwd = finetune.adapter_tp_collectives(spec, e)
    rerun = ops.full_recompute_share(lay.recompute)
    adapter_tp = ((1.0 + rerun) * _collective_seconds(links, tp, adapter_fwd)
                  + _collective_seconds(links, tp, adapter_bwd))
    tp_wire += adapter_tp
    tp_layer += adapter_tp

    # context parallelism's ring: each rank passes its K/V chunk cp - 1 times in the forward and K/V
    # and their gradients in the backward, overlapped with the attention blocks it computes meanwhile
    cp_wire, cp_layer = cp_layer_seconds(lay, layer, links, model, s * b, e)
    # expert parallelism's token dispatch and combine, on the critical path but what the shared expert hides
    ep_wire, ep_layer = ep_layer_seconds(lay, layer, links, model, s * b, e)
    split = pipeline_split(spec)
    per_layer = layer.total + tp_layer + cp_layer + ep_layer
    # the embedding's and head's tensor-parallel collectives (`step_comm.tp_ends`), per micro-batch
    pc = count_params(model)
    ends_comm = sc.tp_ends(inputs.framework, sp, message, s * b * model.vocab_size * e, s * b)
    embedding_tp = _collective_seconds(links, tp, ends_comm.embedding)
    head_tp = _collective_seconds(links, tp, ends_comm.head)
    device_mb = []
    for dev, chunks in enumerate(split):
        t = sum(chunks) * per_layer
        if dev == 0:
            t += ends.embedding + embedding_tp
        if dev == pp - 1:
            t += ends.head + head_tp
        device_mb.append(t)
    t_max = max(device_mb)
    pipeline = m * t_max + (sum(device_mb) - t_max) / v
    busiest = device_mb.index(t_max)
    layers_busiest = sum(split[busiest])

    # tensor-parallel bytes of the device that sends the most: its layers and ends, and with
    # sequence parallelism the all-reduce of the norms' weight gradients (replicated over tp;
    # DTensor reduces them every backward, Megatron once per step)
    tp_bytes = 0.0
    if tp > 1:
        norm_reductions = m if inputs.framework == "fsdp" else 1
        adapter_sent = ((1.0 + rerun) * sc.tp_collective_bytes(tp, adapter_fwd)
                        + sc.tp_collective_bytes(tp, adapter_bwd))
        for dev, chunks in enumerate(split):
            sent = m * sum(chunks) * (n_coll * cm.ring_all_reduce_bytes(tp, message) + adapter_sent)
            norms = sum(chunks) * pc.norms_per_layer
            if dev == 0:
                sent += m * sc.tp_collective_bytes(tp, ends_comm.embedding)
            if dev == pp - 1:
                sent += m * sc.tp_collective_bytes(tp, ends_comm.head)
                norms += pc.final_norm
            if sp:
                sent += norm_reductions * cm.ring_all_reduce_bytes(tp, norms * inputs.grad_bytes)
            tp_bytes = max(tp_bytes, sent)

    # pipeline point-to-point: the busiest device's sends (`step_comm.pipeline_sends`)
    pp_bytes = pp_wire = pp_exposed = 0.0
    p2p_overlap = pp > 1 and stack_p2p_overlap(spec.stack)
    if pp > 1:
        p2p_message = message / (tp if sp else 1)
        t_p2p = cm.p2p_seconds(links, tp * dp >= per_node, p2p_message)
        sends = m * sc.pipeline_sends(pp, v)
        pp_bytes = sends * p2p_message
        pp_wire = sends * t_p2p
        pp_exposed = pipeline_p2p_exposed(lay, links, message, p2p_overlap)

    # data parallel: the device whose weights are the largest (under a pipeline, an end stage)
    zero = lay.zero_stage
    psi = inputs.params_per_rank
    if pp > 1:
        # the experts a device holds are an (ep x etp)-th of its blocks', not an ep x tp-th
        folded = pc.experts_per_layer / lay.ep * (1.0 / lay.expert_tp - 1.0 / tp)
        psi = max(sc.device_params(pc, split, dev, model.tied_embeddings, lay.ep) / tp
                  + (sum(count - pc.dense_blocks_in(first, count) for first, count in sc.device_chunks(split, dev))
                     * folded if folded else 0.0) for dev in range(pp))
        psi *= inputs.trainable_fraction
    grads = psi * inputs.grad_bytes
    weights = psi * inputs.weight_bytes
    backward_window = layers_busiest * (layer.backward + layer.recompute)
    forward_window = layers_busiest * layer.forward
    if rates.curve.family == "cpu":
        # on a CPU the collectives (gloo) run on the same cores as the compute: nothing hides
        backward_window = forward_window = 0.0
    dp_exposed = dp_wire = dp_bytes = 0.0
    per_unit = planned_blocks_per_unit(lay, spec.workload, pc.per_layer, layers_busiest)  # blocks per FSDP2 unit
    if dp > 1:
        if zero >= 3:
            shard = lay.shard_group
            replicate = max(1, dp // shard)
            root = sc.fsdp_root_params(pc, model.vocab_size, model.hidden, model.tied_embeddings) / tp
            gathers = sc.zero3_collectives(inputs.framework, pp, m, min(1.0, root / psi) if psi else 0.0,
                                           # torchtitan's loop never turns gradient sync off
                                           lay.fsdp_sync_every_micro_step or spec.stack == "torchtitan")
            units = unit_count(layers_busiest, per_unit)
            weights += inputs.frozen_gather_bytes  # a fine-tune's frozen base is gathered like any weight
            # alpha-beta: the ring's bandwidth time plus its latency for every message a
            # layer's gather issues (DeepSpeed: one per parameter tensor)
            messages = units * sc.zero3_messages_per_gather(inputs.framework, model)
            gather = (cm.reduce_scatter_seconds(links, shard, tp, weights)
                      + messages * cm.ring_latency_seconds(links, shard, tp))
            reduce = (cm.reduce_scatter_seconds(links, shard, tp, grads)
                      + sc.zero3_reductions_per_step(inputs.framework, psi, units)
                      * cm.ring_latency_seconds(links, shard, tp)
                      + cm.all_reduce_seconds(links, replicate, tp * shard, grads / shard))
            # prefetch hides a gather behind the previous layer's compute only as far as it reaches
            hidden = sc.prefetch_share(inputs.framework, pc.per_layer / tp)
            forward_window *= hidden
            backward_window *= hidden
            per_fwd = gather
            per_bwd = gather * gathers.backward_share + (reduce if gathers.reduce_each_micro_batch else 0.0)
            dp_exposed = (gathers.forward_gathers * max(per_fwd - forward_window, per_fwd / units)
                          + gathers.backward_gathers * max(per_bwd - backward_window, per_bwd / units))
            if not gathers.reduce_each_micro_batch:
                dp_exposed += max(reduce - backward_window, reduce / units)
            dp_wire = ((gathers.forward_gathers + gathers.backward_gathers * gathers.backward_share) * gather
                       + gathers.reductions * reduce)
            dp_bytes = sc.zero3_bytes(gathers, shard, replicate, weights, grads)
        else:
            if zero == 0:
                reduce = cm.all_reduce_seconds(links, dp, tp, grads)
                gather = 0.0
                dp_bytes = cm.ring_all_reduce_bytes(dp, grads)
            else:
                reduce = cm.reduce_scatter_seconds(links, dp, tp, grads)
                gather = cm.reduce_scatter_seconds(links, dp, tp, weights)
                dp_bytes = cm.ring_all_gather_bytes(dp, grads) + cm.ring_all_gather_bytes(dp, weights)
            embedding = pc.embedding / tp if busiest == 0 else 0.0
            tail = last_bucket_share(inputs.framework, psi, grads, dp, embedding)
            overlap_reduce, overlap_gather = stack_dp_overlap(spec.stack)
            dp_exposed = max(reduce - backward_window, reduce * tail) if overlap_reduce else reduce
            if gather:
                # the updated weights' all-gather: behind the next forward for FSDP (SHARD_GRAD_OP
                # gathers with prefetch) and Megatron (--overlap-param-gather); DeepSpeed runs it
                # synchronously at the end of the step
                overlapped = inputs.framework != "deepspeed" and overlap_gather
                dp_exposed += max(gather - forward_window, gather * tail) if overlapped else gather
            dp_wire = reduce + gather

    measured = ops.measured_cpu(rates, "collective_seconds")
    if dp > 1 and measured is not None:
        zero3 = gathers if zero >= 3 else None
        timed = cm.measured_dp_seconds(measured, dp, zero, grads, weights,
                                       fsdp_units(model, layers_busiest, busiest, pp, tp, psi, per_unit), zero3,
                                       DDP_BUCKET_BYTES, getattr(rates.profile, "fsdp_unit_cost", None))
        if timed is not None:
            dp_exposed = dp_wire = timed

    # optimizer step and offload
    optimizer, offload_seconds = optimizer_and_offload(lay, work.optimizer, inputs, rates)
    if lay.offload_activations and rates.curve.family != "cpu":  # the busiest stage's copies to and from the host
        offload_seconds += activation_offload.exposed_seconds(
            lay, layers_busiest, inputs.saved_bytes_per_layer, layer.forward, layer.backward + layer.recompute,
            inputs.host_bytes_per_second, stack_switch(spec.stack, "activation_offload_stream"))

    # communication hidden behind compute still slows it (NCCL's thread blocks take SMs)
    tp_hidden = m * layers_busiest * max(0.0, tp_wire - tp_layer)
    cp_hidden = m * layers_busiest * max(0.0, cp_wire - cp_layer)
    ep_hidden = m * layers_busiest * max(0.0, ep_wire - ep_layer)  # behind the shared expert (`ep_layer_seconds`)
    # sends overlapped with compute (an interleaved schedule of a stack that overlaps them) take SMs too
    pp_hidden = max(0.0, pp_wire - pp_exposed) if v > 1 and p2p_overlap else 0.0
    contention = OVERLAP_SLOWDOWN * (max(0.0, dp_wire - dp_exposed) + tp_hidden + cp_hidden + pp_hidden + ep_hidden)
    step = pipeline + pp_exposed + dp_exposed + optimizer + offload_seconds + contention
    compute = m * layers_busiest * layer.total + optimizer
    if busiest == 0:
        compute += m * ends.embedding
    if busiest == pp - 1:
        compute += m * ends.head
    ends_tp = m * ((embedding_tp if busiest == 0 else 0.0) + (head_tp if busiest == pp - 1 else 0.0))
    tp_exposed = m * layers_busiest * tp_layer + ends_tp
    cp_exposed = m * layers_busiest * cp_layer
    ep_exposed = m * layers_busiest * ep_layer
    exposed = tp_exposed + pp_exposed + dp_exposed + cp_exposed + ep_exposed
    bubble_seconds = pipeline - m * t_max
    units_per_step = float(lay.global_batch_size) * work.seq_len  # whole sequences, whatever cp splits
    per_second = units_per_step / step
    devices = lay.devices
    mfu = inputs.model_flops_per_token * per_second / (devices * peak)
    hfu = inputs.hardware_flops_per_token * per_second / (devices * peak)
    hardware_per_device_step = inputs.hardware_flops_per_token * units_per_step / devices
    if rates.efficiency is not None:
        efficiency = rates.efficiency
    else:
        efficiency = hardware_per_device_step / (compute * peak) if compute else 0.0
    steps = total_units / units_per_step if units_per_step else 0.0
    total = total_units / per_second if per_second else math.inf
    mb_layers = m * layers_busiest
    time = TimeEstimate(
        peak, efficiency, source, confidence, compute, pipeline / (m * t_max) - 1.0, exposed, step,
        units_per_step, per_second, per_second / devices, mfu, hfu, steps, total, total * devices / 3600.0,
        gemm_seconds=mb_layers * layer.gemm, attention_seconds=mb_layers * layer.attention,
        memory_bound_seconds=mb_layers * layer.memory_bound, optimizer_seconds=optimizer,
        bubble_seconds=bubble_seconds, tp_exposed_seconds=tp_exposed, dp_exposed_seconds=dp_exposed,
        pp_exposed_seconds=pp_exposed, offload_seconds=offload_seconds,
        exposed_comm_share=exposed / step if step else 0.0, stage_layers=describe_split(split),
        cp_exposed_seconds=cp_exposed, ep_exposed_seconds=ep_exposed,
    )
    comm = CommEstimate(
        dp_bytes, tp_bytes, pp_bytes,
        dp_wire, (n_coll * one + adapter_tp) * mb_layers + ends_tp, pp_wire,
        cm.link_name(links, dp, tp), cm.link_name(links, tp, 1), cm.link_name(links, pp, tp * dp),
        cm.LINK_EFFICIENCY,
    )
    return time, comm


def tp_collectives_per_layer(model) -> tuple[int, int]:
    """(forward, backward) tensor-parallel collectives of one layer, in all-reduce equivalents.

    Sequential block: each of attention and MLP reduces its output in the forward and its input
    gradient in the backward (Shoeybi et al. 2019): 2 and 2. Parallel block (attention and MLP
    on the same input, summed): the two outputs are added first and reduced once (GPT-NeoX
    megatron/model/transformer.py, `gpt_j_residual`: "we can do a single allreduce after we add
    mlp / attn outputs"; PaLM sec. 2, "Parallel Layers", its input matmuls fused); the backward
    reduces one input gradient per norm feeding the branches (GPT-NeoX-20B keeps two untied norms,
    each branch its own copy to the model-parallel region; PaLM one shared norm). A hybrid Mamba-2
    stack's layer is one mixer, a column-parallel linear in and a row-parallel one out whatever its
    kind (Megatron-Core `MambaMixer` in_proj / out_proj, attention's linear_qkv / linear_proj, the MLP's
    linear_fc1 / linear_fc2): 1 and 1."""
    if getattr(model, "hybrid_pattern", ""):
        return 1, 1
    if getattr(model, "parallel_block", False):
        return 1, max(1, min(2, model.norms_per_layer))
    return 2, 2


def cp_layer_seconds(lay, layer, links: Links, model, tokens: float, e: float) -> tuple[float, float]:
    """(wire seconds, exposed seconds) of context parallelism's ring per layer and micro-batch.

    Ring attention (Megatron-Core `attention.py` with TE's `AttnFuncWithCPAndKVP2P`, torch's
    `context_parallel`): each of the cp ranks sends its K and V chunk (its `tokens` × kv heads ×
    head dim / tp) to the next cp - 1 times in the forward, and K, V and their gradients in the
    backward: 3 (cp - 1) sends, each overlapped with the attention block being computed. What the
    attention core (forward, backward, recompute) does not cover is exposed. The cp ranks sit next
    to the tensor-parallel ones (Megatron's tp-cp-dp-pp order): in one node while tp × cp fits.
    Multi-head latent attention is assumed to send its K and V expanded to every head (a·d_qk and
    a·d_v), as TE's ring does for any attention, not its compressed latent."""
    cp = lay.cp
    if cp <= 1:
        return 0.0, 0.0
    kv_dim = kv_heads(model) * (query_key_head_dim(model) + value_head_dim(model))  # K and V
    chunk = tokens * kv_dim / lay.tp * e
    wire = 3 * (cp - 1) * cm.p2p_seconds(links, lay.tp * cp > links.devices_per_node, chunk)
    return wire, max(0.0, wire - layer.attention)


def ep_layer_seconds(lay, layer, links: Links, model, tokens: float, e: float) -> tuple[float, float]:
    """(wire seconds, exposed seconds) of expert parallelism's token transfers per layer and micro-batch.

    A dispatch and a combine in the forward, their gradients (a combine and a dispatch) in the
    backward, both again in a recomputed forward, each as the layout's dispatcher runs it
    (`expert_comm.token_passes`: Megatron-Core's all-to-all or DeepEP). With the shared expert
    overlapped (`Layout.moe_shared_expert_overlap`) the part that runs beside its GEMMs is hidden
    (`expert_comm.shared_expert_hidden`); the rest waits on the critical path."""
    if lay.ep <= 1 or model.n_experts <= 1:
        return 0.0, 0.0
    passes = expert_comm.token_passes(lay, links, model, tokens, e)
    rerun = ops.expert_passes_rerun(lay.recompute)
    wire = (2.0 + rerun) * passes.dispatch_seconds + (2.0 + rerun) * passes.combine_seconds
    if not lay.moe_shared_expert_overlap:
        return wire, wire
    return wire, wire - expert_comm.shared_expert_hidden(layer, passes, rerun)


def tp_layer_seconds(lay, layer, links: Links, message: float, model=None) -> tuple[float, int, float, float]:
    """(one collective, collectives per layer, their wire seconds, the exposed seconds) of the
    tensor-parallel collectives of one layer and micro-batch (module docstring)."""
    tp = lay.tp
    one = cm.all_reduce_seconds(links, tp, 1, message)  # AR = RS + AG, the same volume with SP
    fwd, bwd = tp_collectives_per_layer(model)
    n_coll = fwd + bwd + ops.tp_collectives_rerun(lay.recompute, model, fwd)
    tp_wire = n_coll * one
    if tp == 1:
        return one, n_coll, tp_wire, 0.0
    if getattr(lay, "tp_comm_overlap", False):
        fwd_hidden = min(fwd * one, layer.forward_gemm)
        bwd_hidden = min(bwd * one, layer.wgrad + layer.forward_gemm)
        return one, n_coll, tp_wire, tp_wire - fwd_hidden - bwd_hidden
    return one, n_coll, tp_wire, tp_wire - min(one, layer.wgrad)


def stack_dp_overlap(stack_name: str) -> tuple[bool, bool]:
    """(gradient reduction overlapped with the backward, weight all-gather with the next forward)
    as the stack runs them (`Stack.overlap_grad_reduce`, `overlap_param_gather`): Megatron-LM
    2021 all-reduces after the whole forward-backward (`allreduce_gradients` in train_step),
    DeepSpeed's pipeline engine reduces after the step's last micro-batch. A name no stack
    module describes overlaps both, as PyTorch DDP and FSDP do."""
    stack = find_stack(stack_name)
    if stack is None:
        return True, True
    return stack.overlap_grad_reduce, stack.overlap_param_gather


def last_bucket_share(framework: str, params: float, grad_bytes: float, dp: int, embedding_params: float) -> float:
    """Share of a rank's gradients in the bucket reduced last, which no backward hides (and, for
    ZeRO-1/2, in the weights' bucket gathered first, before the forward can start).

    PyTorch DDP / FSDP: 25 MB buckets (`DDP_BUCKET_BYTES`). Megatron: buckets of
    `MEGATRON_MIN_BUCKET_PARAMS` or 1M × dp parameters, and the embedding's gradient, ready only
    at the end of the backward, closes the last one whole (its weights open the forward)."""
    if params <= 0:
        return 1.0
    if framework == "megatron":
        bucket = max(MEGATRON_MIN_BUCKET_PARAMS, 1e6 * dp, embedding_params)
        return min(1.0, bucket / params)
    return 1.0 / max(1, math.ceil(params * grad_bytes / DDP_BUCKET_BYTES))


def pipeline_p2p_exposed(lay, links: Links, message: float, overlapped: bool = False) -> float:
    """Seconds of pipeline sends on the critical path: 2·(m·v + p − 1) transfers of one
    activation (/t with sequence parallelism), over the network when a stage spans a node.
    `overlapped` (Megatron-Core's interleaved schedule with `overlap_p2p_comm`, `Stack.overlap_p2p_comm`):
    each chunk's receive is posted before the chunk before it computes, so only the fill and the
    drain, 2·(p − 1) transfers, wait on the wire."""
    if lay.pp == 1:
        return 0.0
    v = lay.virtual_stages if lay.pipeline_schedule == "interleaved" else 1
    sp = lay.sequence_parallel and lay.tp > 1
    t_p2p = cm.p2p_seconds(links, lay.tp * lay.gradient_group >= links.devices_per_node,
                           message / (lay.tp if sp else 1))
    if overlapped and v > 1:
        return 2.0 * (lay.pp - 1) * t_p2p
    return 2.0 * (lay.grad_accum * v + lay.pp - 1) * t_p2p


def stack_cross_entropy(spec) -> str:
    """How the stack runs the loss (`Stack.cross_entropy`), compiled when the stack compiles its
    loss under `--compile` (`Stack.compiles_loss`); eager PyTorch for a name no stack module describes."""
    stack = find_stack(spec.stack)
    if stack is None:
        return "eager"
    if stack.compiles_loss and spec.layout.compiled:
        return "compiled"
    return stack.cross_entropy


def stack_p2p_overlap(stack_name: str) -> bool:
    """Whether the stack overlaps an interleaved pipeline's sends with compute (`Stack.overlap_p2p_comm`)."""
    return stack_switch(stack_name, "overlap_p2p_comm")


def fsdp_units(model, layers: int, stage: int, pp: int, tp: int, params: float,
               per_unit: int = 1) -> tuple[float, ...]:
    """Shares of a rank's weights in each unit that FSDP wraps and gathers on its own: one per
    `per_unit` consecutive transformer layers (`fsdp_units.planned_blocks_per_unit`; the last
    unit may hold fewer), the embedding on the first stage and the output head on the last
    (the trainer's `fully_shard` of each group of blocks, embedding and head)."""
    ends = []
    end_params = model.vocab_size * model.hidden / tp
    if stage == 0:
        ends.append(end_params)
    if stage == pp - 1 and not (model.tied_embeddings and pp == 1):
        ends.append(end_params)
    layer_params = max(0.0, params - sum(ends)) / max(1, layers)
    total = sum(ends) + layer_params * layers
    if total <= 0:
        return (1.0,)
    full, rest = divmod(layers, max(1, per_unit))
    groups = (per_unit,) * full + ((rest,) if rest else ())
    return tuple(p / total for p in ends) + tuple(n * layer_params / total for n in groups)


def _collective_seconds(links: Links, tp: int, collectives) -> float:
    """Seconds of (kind, full-buffer bytes) collectives over the tensor-parallel group."""
    return sum((cm.all_reduce_seconds if kind == "all_reduce" else cm.reduce_scatter_seconds)(links, tp, 1, n)
               for kind, n in collectives)


def optimizer_and_offload(lay, optimizer_name: str, inputs: StepInputs, rates: DeviceRates) -> tuple[float, float]:
    """(optimizer step, host <-> device copies) seconds per step on one rank."""
    psi, dp = inputs.params_per_rank, lay.gradient_group
    owned = psi / dp if (lay.zero_stage >= 1 and dp > 1) else psi
    if lay.offload not in ("optimizer", "params"):
        return ops.optimizer_seconds(owned, inputs.grad_bytes, inputs.weight_bytes, optimizer_name, rates,
                                     fused=inputs.framework != "fsdp",
                                     fsdp_sharded=inputs.framework == "fsdp" and lay.zero_stage >= 3 and dp > 1), 0.0
    link = inputs.host_bytes_per_second
    copies = owned * (inputs.grad_bytes + inputs.weight_bytes) / link
    if lay.offload == "params":
        copies += 2 * lay.grad_accum * (psi * inputs.weight_bytes + inputs.frozen_gather_bytes) / max(1, dp) / link
    return owned / HOST_ADAM_PARAMS_PER_S, copies


def step_lower_bound(spec, rates: DeviceRates, inputs: StepInputs | None = None, links: Links | None = None) -> float:
    """A time no layout's step can beat: the average stage's compute (embedding and head
    included) per micro-batch plus the bubble of the smallest chunks (a lower bound of
    `step_time`; for layout searches). With `links`, each layer also carries its exposed
    tensor-parallel collectives and the pipeline its sends on the critical path, as
    `step_time` counts them (the end devices' collectives, DP and contention left out)."""
    bound = pipeline_lower_bound(spec, rates, inputs, links)
    if inputs is not None:
        bound += sum(optimizer_and_offload(spec.layout, spec.workload.optimizer, inputs, rates))
    return bound


def pipeline_lower_bound(spec, rates: DeviceRates, inputs: StepInputs | None = None,
                         links: Links | None = None) -> float:
    """`step_lower_bound` before the optimizer step and host copies: the part that does not read
    the layout's ZeRO stage or offload, which a search shares among layouts that differ only there."""
    model, lay, work = spec.model, spec.layout, spec.workload
    tp, pp = lay.tp, lay.pp
    v = lay.virtual_stages if lay.pipeline_schedule == "interleaved" else 1
    sp = lay.sequence_parallel and tp > 1
    s = local_seq_len(spec)  # a rank's tokens of a sequence, as `step_time` times them
    layer = finetune.layer_times(ops.layer_times(model, s, lay.micro_batch_size, tp, sp, lay.flash_attention,
                                                 work.dropout, lay.recompute, work.precision, rates,
                                                 work.seq_len if lay.cp > 1 else None, lay.ep, lay.expert_tp,
                                                 stack_switch(spec.stack, "recompute_early_stop")),
                                 spec, rates)
    ends = finetune.end_times(ops.end_times(model, s, lay.micro_batch_size, tp, sp, work.precision, rates,
                                            stack_cross_entropy(spec)), spec, rates)
    smallest_stage = (model.n_layers // (pp * v)) * v
    per_layer, p2p = layer.total, 0.0
    if links is not None:
        message = float(s * lay.micro_batch_size * model.hidden * inputs.activation_bytes) \
            if inputs is not None else 0.0
        per_layer += tp_layer_seconds(lay, layer, links, message, model)[3]
        if inputs is not None:
            per_layer += ep_layer_seconds(lay, layer, links, model, s * lay.micro_batch_size, inputs.activation_bytes)[1]
        p2p = pipeline_p2p_exposed(lay, links, message, stack_p2p_overlap(spec.stack))
    # the slowest device is at least the average one, embedding and head included
    average = (model.n_layers * per_layer + ends.embedding + ends.head) / pp
    return lay.grad_accum * average + (pp - 1) * smallest_stage * per_layer / v + p2p


def flat_time(*, model_flops_per_unit: float, hardware_flops_per_unit: float, units_per_step: float,
              total_units: float, devices: int, peak_flops: float, efficiency: float, efficiency_source: str,
              efficiency_confidence: str, comm: CommEstimate) -> TimeEstimate:
    """A model without operators (CNNs): hardware FLOPs / (peak × efficiency), DP traffic
    hidden behind up to the backward (2/3 of compute)."""
    compute = hardware_flops_per_unit * units_per_step / devices / (peak_flops * efficiency)
    exposed = comm.dp_seconds - min(comm.dp_seconds, 2.0 / 3.0 * compute)
    step = compute + exposed
    per_second = units_per_step / step
    mfu = model_flops_per_unit * per_second / (devices * peak_flops)
    hfu = hardware_flops_per_unit * per_second / (devices * peak_flops)
    steps = total_units / units_per_step if units_per_step else 0.0
    total = total_units / per_second if per_second else math.inf
    return TimeEstimate(
        peak_flops, efficiency, efficiency_source, efficiency_confidence, compute, 0.0, exposed, step,
        units_per_step, per_second, per_second / devices, mfu, hfu, steps, total, total * devices / 3600.0,
        dp_exposed_seconds=exposed, exposed_comm_share=exposed / step if step else 0.0, model="flat efficiency",
    )
