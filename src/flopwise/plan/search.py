"""Layout search: every valid way to run one job on a given number of devices, ranked.

A layout is dp × tp × pp = devices, a micro-batch size with the gradient accumulation
that makes the global batch, a ZeRO stage, recompute, offload and a pipeline schedule.
Each candidate is judged by the planner itself: `plan_memory` (the memory part of
`plan()`) rejects those that do not fit before any time is computed, and every layout
that fits is timed by `plan()`. There is no second model here, only enumeration,
bookkeeping and ranking.

Enumeration rules (what "valid" means):
- tp divides the attention heads and the KV heads, and stays inside a node unless
  `tp_within_node=False` (Megatron places TP on the scale-up link; Shoeybi et al. 2019).
- pp is at most the layers; stages need not be equal (the planner times uneven splits, the
  first and last stage carrying the embedding and the head).
- dp divides the global batch; the micro-batch divides the per-rank batch, so
  accumulation gives exactly the global batch.
- sequence parallelism is on whenever tp > 1: under the planner's model it moves the same
  bytes as plain TP and keeps less activation memory (Korthikanti et al. 2022), so a
  layout without it is never better. A user who cannot run it (`--no-sequence-parallel`:
  a trainer without it) gets every layout planned without it.
- ZeRO 0-3 with offload none/optimizer, and ZeRO-3 with parameter offload; with one
  data-parallel rank ZeRO shards nothing, so only ZeRO-0 (+ optimizer offload) and
  ZeRO-3 + parameter offload (ZeRO-Infinity style) are distinct.
- schedule 1F1B, GPipe, or interleaved with v chunks per device (2 ≤ v ≤
  `max_virtual_stages`, pp·v ≤ layers); with pp = 1 there is no schedule to choose.

Ranking: the objective (job time, cost or energy), then — since the planner does not
model the CPU time of offload or recompute's extra memory traffic — less offload, less
recompute, and lower peak memory first among equals.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from dataclasses import dataclass, field
from typing import NamedTuple

from flopwise.errors import UserError
from flopwise.plan.finetune import model_parallel_refusal
from flopwise.plan.planner import GIB, Plan, _framework, check_expert_parallel, plan, plan_memory, stack_rates, with_advice
from flopwise.plan.spec import OFFLOAD, RECOMPUTE, Layout, RunSpec
from flopwise.plan.fit import stack_speed
from flopwise.plan.gemm import device_rates
from flopwise.plan.comm import links_for
from flopwise.plan.memory import activation_dtype_bytes, compute_dtype, state_bytes
from flopwise.plan.activation_offload import host_bytes_per_second
from flopwise.plan.stacks import find_stack
from flopwise.plan.timing import StepInputs, optimizer_and_offload, pipeline_lower_bound

OBJECTIVES = ("time", "cost", "energy")

BEST_PUBLISHED_MFU = {
    "ampere": (0.6423, "MosaicML llm-foundry MPT-7B on 8 A100-80GB: 64.2 % MFU"),
    "ampere-pcie": (0.6423, "MosaicML llm-foundry MPT-7B on 8 A100-80GB (SXM): 64.2 % MFU"),
    "hopper": (0.4644, "MosaicML llm-foundry MPT-7B on 8 H100-80GB BF16: 46.4 % MFU"),
}
"""The highest MFU a published training run reached per device family (published.md); a
prediction above it is marked rather than trusted."""


def published_mfu_ceiling(result: Plan) -> tuple[float, str] | None:
    """(best published MFU, its source) for the plan's device family, or None when unknown."""
    from flopwise.plan.gemm import curve_for

    return BEST_PUBLISHED_MFU.get(curve_for(result.spec.cluster.hardware).family)


def above_published(result: Plan) -> bool:
    """Whether the plan predicts a higher MFU than any published run on that device family."""
    ceiling = published_mfu_ceiling(result)
    return ceiling is not None and result.time.mfu > ceiling[0]
MAX_MICRO_BATCH = 64
MAX_VIRTUAL_STAGES = 8

REASONS = {
    "tp_heads": "tp does not divide the attention/KV heads",
    "tp_node": "tp spans more than one node",
    "pp_layers": "pp is more than the layers",
    "dp_batch": "dp does not divide the global batch (or --ep does not divide dp x cp)",
    "memory": "does not fit in device memory",
    "host_memory": "offloaded states exceed the host memory per device",
}


@dataclass(frozen=True)
class SearchResult:
    """The ranked layouts that fit, and an account of everything that was not kept.

    `evaluated` counts layouts whose memory the planner computed; `timed` those it also
    timed; `fitting` those that fit. `ranked` holds one layout per `family_key` (variants
    that differ only in ZeRO stage or offload and score the same are shown once). `rejected` maps a reason key (see REASONS) to how many
    candidates it removed: shape rejections count (tp, pp) pairs, "memory" counts layouts.
    """

    base: RunSpec
    objective: str
    devices: int
    global_batch: int
    evaluated: int
    timed: int
    fitting: int
    rejected: dict[str, int]
    ranked: tuple[Plan, ...]
    smallest_memory_gib: float | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def best(self) -> Plan | None:
        """The top-ranked plan, or None when nothing fits."""
        return self.ranked[0] if self.ranked else None

    def to_dict(self) -> dict:
        """JSON-able summary with each ranked layout's full plan."""
        return {
            "objective": self.objective,
            "devices": self.devices,
            "hardware": self.base.cluster.hardware.key,
            "model": self.base.model.key,
            "global_batch": self.global_batch,
            "evaluated": self.evaluated,
            "timed": self.timed,
            "fitting": self.fitting,
            "rejected": {REASONS[k]: v for k, v in self.rejected.items()},
            "notes": list(self.notes),
            "ranked": [{"rank": i + 1, "objective_value": objective_value(p, self.objective),
                        "mfu": p.time.mfu, "exposed_comm_share": p.time.exposed_comm_share,
                        "above_best_published_mfu": above_published(p), "plan": p.to_dict()}
                       for i, p in enumerate(self.ranked)],
            "best_published_mfu": (dict(zip(("mfu", "source"), published_mfu_ceiling(self.ranked[0])))
                                   if self.ranked and published_mfu_ceiling(self.ranked[0]) else None),
        }


def divisors(n: int) -> list[int]:
    """Positive divisors of n in ascending order."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def objective_value(result: Plan, objective: str) -> float:
    """What the search minimises: job seconds, on-demand USD or kWh (per token when the job has no length)."""
    if objective == "time":
        return result.time.total_seconds or 1.0 / result.time.tokens_per_second
    if objective == "cost":
        per_hour = result.cost.on_demand_usd_per_device_hour
        if per_hour is None:
            raise UserError(f"--objective cost: no price for {result.spec.cluster.hardware.key}; "
                            "pass --price-per-hour or use --objective time")
        return per_hour * (result.time.device_hours or result.spec.layout.devices / 3600.0 / result.time.tokens_per_second)
    if objective == "energy":
        if result.energy.kwh is None:
            raise UserError(f"--objective energy: {result.spec.cluster.hardware.key} has no known power (TDP); "
                            "use --objective time")
        return result.energy.kwh or result.energy.watts_per_device * result.spec.layout.devices / result.time.tokens_per_second
    raise UserError(f"--objective '{objective}' is not one of {', '.join(OBJECTIVES)}")


def rank_key(result: Plan, objective: str) -> tuple:
    """Sort key: objective, then less offload, less recompute, less memory (unmodelled costs)."""
    lay = result.spec.layout
    return (objective_value(result, objective), OFFLOAD.index(lay.offload), _recompute_rank(lay.recompute),
            result.memory.total_bytes, lay.zero_stage, lay.pp, lay.tp)


def _recompute_rank(policy: str) -> float:
    """Less recompute first: none, selective, then by the share of the forward run again
    (`every:K`, which a stack's recompute ladder may choose, sits between them and full)."""
    from flopwise.plan.memory import recompute_forward_fraction

    if policy in ("none", "selective"):
        return RECOMPUTE.index(policy)
    return 1.0 + recompute_forward_fraction(policy)


def parallel_shapes(spec: RunSpec, devices: int, tp_within_node: bool = True) -> tuple[list[tuple[int, int]], dict[str, int]]:
    """(tp, pp) pairs whose product divides `devices` and that the model allows, plus rejection counts."""
    model = spec.model
    rejected = {"tp_heads": 0, "tp_node": 0, "pp_layers": 0}
    # LoRA/QLoRA: single, DDP, FSDP2, except Megatron-Core's LoRA (finetune.model_parallel_refusal)
    stack = find_stack(spec.stack)
    if model.arch == "cnn" or (spec.workload.finetune != "full"
                               and model_parallel_refusal(spec.workload.finetune, spec.stack)) \
            or (stack is not None and not stack.model_parallel):  # a data-parallel-only stack (litgpt)
        return [(1, 1)], rejected
    per_node = spec.cluster.devices_per_node or spec.cluster.hardware.devices_per_node or 8
    kv = model.n_kv_heads or model.n_heads
    shapes = []
    for tp in divisors(devices):
        pps = divisors(devices // tp)
        # a hybrid model's Mamba heads and groups split over tp too (Megatron-Core `MambaMixer`)
        if model.n_heads % tp or kv % tp or (model.mamba_heads and (model.mamba_heads % tp or model.mamba_groups % tp)):
            rejected["tp_heads"] += len(pps)
            continue
        if tp_within_node and tp > per_node:
            rejected["tp_node"] += len(pps)
            continue
        for pp in pps:
            if pp > model.n_layers:
                rejected["pp_layers"] += 1
            else:
                shapes.append((tp, pp))
    return shapes, rejected


def memory_options(dp: int) -> list[tuple[int, str]]:
    """(ZeRO stage, offload) pairs that differ for this data-parallel size."""
    if dp == 1:
        return [(0, "none"), (0, "optimizer"), (3, "params")]
    return [(z, o) for z in (0, 1, 2, 3) for o in ("none", "optimizer")] + [(3, "params")]


def schedules(n_layers: int, pp: int, max_virtual_stages: int) -> list[tuple[str, int]]:
    """(schedule, virtual stages) choices for pp stages: v chunks per device, at least one layer each
    (stages need not hold equal layer counts: the planner times the uneven split)."""
    if pp == 1:
        return [("1f1b", 1)]
    interleaved = [("interleaved", v) for v in range(2, max_virtual_stages + 1) if pp * v <= n_layers]
    return [("1f1b", 1), ("gpipe", 1), *interleaved]


def selective_recompute(stack_name: str) -> str:
    """The policy "selective" names on this stack (`Stack.selective_recompute`)."""
    stack = find_stack(stack_name)
    return stack.selective_recompute if stack is not None else "selective"


def layout_families(spec: RunSpec, tp: int, pp: int, dp: int, max_virtual_stages: int):
    """(schedule, v, zero, offload, recompute) choices for one (tp, pp, dp); micro-batch varies inside."""
    recomputes = ("none",) if spec.model.arch == "cnn" else RECOMPUTE
    selective = selective_recompute(spec.stack)
    if selective != "selective":  # the stack's own selective policy (torchtitan: per-op)
        recomputes = tuple(selective if r == "selective" else r for r in recomputes)
    options = memory_options(dp)
    if spec.stack != "flopwise" and spec.layout.framework == "megatron":
        # a Megatron stack offers its distributed optimizer (ZeRO-1) and no parameter sharding
        options = [(z, o) for z, o in options if z <= 1 and o == "none"] or [(0, "none")]
    stack = find_stack(spec.stack)
    if stack is not None and stack.recompute_policies is not None:  # only what its recipes offer
        recomputes = tuple(r for r in recomputes if r in stack.recompute_policies)
    if stack is not None and stack.zero_stage is not None:  # it shards one way (litgpt: FSDP full sharding)
        options = [(stack.zero_stage if dp > 1 else 0, "none")]
    for schedule, v in schedules(spec.model.n_layers, pp, max_virtual_stages):
        for zero, offload in options:
            for recompute in recomputes:
                yield schedule, v, zero, offload, recompute


def with_expert_parallel(spec: RunSpec, ep: int) -> RunSpec:
    """The search's base spec with `--ep` as asked (a base of cp devices has no data-parallel
    ranks to hold it, so `search_devices_and_base` leaves it out of the base and it is set here);
    the layouts tried keep it and need dp x cp divisible by it."""
    if ep == spec.layout.ep:
        return spec
    check_expert_parallel(spec.model, ep)
    return dataclasses.replace(spec, layout=dataclasses.replace(spec.layout, ep=ep))


def search_layouts(
    spec: RunSpec,
    devices: int | None = None,
    objective: str = "time",
    top: int = 5,
    tp_within_node: bool = True,
    max_micro_batch: int = MAX_MICRO_BATCH,
    max_virtual_stages: int = MAX_VIRTUAL_STAGES,
    first_fit_only: bool = False,
    exhaustive: bool = False,
    host_memory_per_device_gib: float | None = None,
    profile=None,
    sequence_parallel: bool = True,
) -> SearchResult:
    """Enumerate every valid layout of `spec`'s job on `devices`, keep those `plan()` says fit,
    and return the best `top` by `objective`.

    The model, hardware, workload and global batch come from `spec`; its layout is ignored
    except for flash attention. `first_fit_only` stops at the first layout that fits (a
    feasibility test for `compare`). `host_memory_per_device_gib` rejects layouts whose
    offloaded states (the plan's `cpu_offload_bytes`) exceed it; None leaves host memory
    unchecked, as `plan()` does. `profile` (a measured device profile, `--profile`) times
    every layout, as `plan(spec, profile)` does. `sequence_parallel=False` plans every tp > 1
    layout without sequence parallelism (`--no-sequence-parallel`). Two exact shortcuts keep it fast, `exhaustive=True`
    turns them off (tests compare both):
    - memory never shrinks as the micro-batch grows (activations ∝ micro-batch × in-flight
      micro-batches, capped by the per-rank batch; model states do not depend on it), so
      each family is bisected for its largest micro-batch that fits;
    - a layout's step takes at least its layers' compute on the average pipeline stage
      plus the bubble of the smallest stages (`timing.step_lower_bound`, from the same
      operator model; exposed communication is ≥ 0), so layouts are timed in order of
      that bound and timing stops once the bound exceeds the k-th best found.
    """
    if objective not in OBJECTIVES:
        raise UserError(f"--objective '{objective}' is not one of {', '.join(OBJECTIVES)}")
    if top < 1:
        raise UserError(f"--top must be >= 1, got {top}")
    devices = devices or spec.layout.devices
    global_batch = spec.layout.global_batch_size
    cp = spec.layout.cp  # context parallelism stays as asked; dp × tp × pp share the rest
    if devices % cp:
        raise UserError(f"--gpus {devices} is not divisible by --cp {cp}")
    shapes, rejected = parallel_shapes(spec, devices // cp, tp_within_node)
    rejected.update(dp_batch=0, memory=0, host_memory=0)
    host_limit = None if host_memory_per_device_gib is None else host_memory_per_device_gib * GIB
    evaluated = inferred = 0
    fits: list[Fit] = []
    smallest = None
    flash = spec.layout.flash_attention
    # a named stack keeps its framework's conventions and TP overlap on every layout tried
    stack_layout = {} if spec.stack == "flopwise" else {"framework": spec.layout.framework,
                                                         "tp_comm_overlap": spec.layout.tp_comm_overlap}
    ep = spec.layout.ep  # expert parallelism stays as asked: its ranks are data-parallel ranks

    def candidate(family: tuple, mbs: int) -> RunSpec:
        """One family's layout at one micro-batch size."""
        dp, tp, pp, per_rank, zero, offload, recompute, schedule, v = family
        return RunSpec(spec.model, Layout(
            dp=dp, tp=tp, pp=pp, micro_batch_size=mbs, grad_accum=per_rank // mbs, zero_stage=zero,
            sequence_parallel=sequence_parallel and tp > 1, recompute=recompute, offload=offload, pipeline_schedule=schedule,
            virtual_stages=v, flash_attention=flash, compiled=spec.layout.compiled, cp=cp, ep=ep,
            moe_dispatcher=spec.layout.moe_dispatcher,
            moe_shared_expert_overlap=spec.layout.moe_shared_expert_overlap,
            **stack_layout), spec.workload, spec.cluster,
            stack=spec.stack)

    for tp, pp in shapes:
        dp = devices // (cp * tp * pp)
        if global_batch % dp or (dp * cp) % ep:
            rejected["dp_batch"] += 1
            continue
        per_rank = global_batch // dp
        micro_batches = [d for d in divisors(per_rank) if d <= max_micro_batch]
        for schedule, v, zero, offload, recompute in layout_families(spec, tp, pp, dp, max_virtual_stages):
            family = (dp, tp, pp, per_rank, zero, offload, recompute, schedule, v)
            if host_limit is not None:
                # offloaded bytes do not depend on the micro-batch: one evaluation judges the family
                probe = plan_memory(candidate(family, micro_batches[0]), check=False)
                evaluated += 1
                if probe.cpu_offload_bytes > host_limit:
                    rejected["host_memory"] += len(micro_batches)
                    continue
            if exhaustive or first_fit_only:
                for mbs in micro_batches:
                    memory = plan_memory(candidate(family, mbs), check=False)
                    evaluated += 1
                    if memory.may_fit:
                        fits.append(Fit(family, mbs, candidate(family, mbs)))
                        if first_fit_only:
                            return _result(spec, objective, devices, global_batch, evaluated, rejected, inferred,
                                           [plan(fits[0].spec, profile, advise=False)], 1, top, smallest, shapes,
                                           profile)
                    else:
                        rejected["memory"] += 1
                        smallest = memory.total_bytes if smallest is None else min(smallest, memory.total_bytes)
                continue
            # memory never shrinks as the micro-batch grows: bisect for the largest that fits
            lo, hi = 0, len(micro_batches)  # micro_batches[:lo] fit, micro_batches[hi:] do not
            inferred += len(micro_batches)
            tried: dict[int, RunSpec] = {}  # the layouts bisected, kept for the list of those that fit
            while lo < hi:
                mid = (lo + hi) // 2
                tried[mid] = candidate(family, micro_batches[mid])
                memory = plan_memory(tried[mid], check=False)
                evaluated += 1
                inferred -= 1
                if memory.may_fit:
                    lo = mid + 1
                else:
                    hi = mid
                    smallest = memory.total_bytes if smallest is None else min(smallest, memory.total_bytes)
            fits.extend(Fit(family, micro_batches[i], tried.get(i)) for i in range(lo))
            rejected["memory"] += len(micro_batches) - lo
    timed = _time_best(fits, candidate, objective, top, exhaustive, profile)
    return _result(spec, objective, devices, global_batch, evaluated, rejected, inferred, timed, len(fits), top,
                   smallest, shapes, profile)


class Fit(NamedTuple):
    """A layout that fits: its family's choices (dp, tp, pp, per-rank batch, ZeRO stage, offload,
    recompute, schedule, v), its micro-batch and its RunSpec when one was built already. Most
    layouts that fit are never timed (their step bound exceeds the top k), so their RunSpec is
    built only when the bound or the timing needs it."""

    family: tuple
    mbs: int
    spec: RunSpec | None


def family_key(result: Plan, objective: str) -> tuple:
    """Layouts equal but for ZeRO stage / offload that the planner gives the same objective
    value share a key: the ranking shows the simplest of them once."""
    lay = result.spec.layout
    return (lay.dp, lay.tp, lay.pp, lay.micro_batch_size, lay.pipeline_schedule, lay.virtual_stages,
            lay.recompute, float(f"{objective_value(result, objective):.12g}"))


def _time_best(fits: list[Fit], candidate, objective: str, top: int, exhaustive: bool, profile=None) -> list[Plan]:
    """Plan the layouts that fit, in order of a lower bound on their step time, until none can enter the top k.
    `candidate(family, mbs)` builds a fit's RunSpec where it has none."""
    def spec_of(fit: Fit) -> RunSpec:
        return fit.spec if fit.spec is not None else candidate(fit.family, fit.mbs)

    if exhaustive or not fits:
        return [plan(spec_of(c), profile, advise=False) for c in fits]
    first = plan(spec_of(fits[0]), profile, advise=False)
    timed: list[Plan] = [first]
    families: set[tuple] = set()
    smallest: list[float] = []  # max-heap (negated) of the `top` best objective values of distinct families
    _keep_top(families, smallest, first, objective, top)
    # objective / step is the same for every layout of one job (same tokens, devices, prices)
    ratio = objective_value(first, objective) / first.time.step_seconds
    bound_of = _bounder(first, spec_of, profile)
    pending = sorted((bound_of(c), i, c) for i, c in enumerate(fits[1:]))
    for bound, _, fit in pending:
        if len(smallest) >= top and bound * ratio > -smallest[0] * (1 + 1e-9):
            break
        result = plan(spec_of(fit), profile, advise=False)
        timed.append(result)
        _keep_top(families, smallest, result, objective, top)
    return timed


def _keep_top(families: set[tuple], smallest: list[float], result: Plan, objective: str, top: int) -> None:
    """Track the k-th best objective over distinct families of layouts that fit (a family's value is
    part of its key); tight layouts are timed but do not fill the top k, which they follow."""
    if not result.fits:
        return
    key = family_key(result, objective)
    if key in families:
        return
    families.add(key)
    value = objective_value(result, objective)
    if len(smallest) < top:
        heapq.heappush(smallest, -value)
    elif value < -smallest[0]:
        heapq.heapreplace(smallest, -value)


def _bounder(reference: Plan, spec_of, profile=None):
    """A function giving a step time no plan of a fit can beat (`timing.step_lower_bound`:
    the average stage's compute per micro-batch, the smallest stages' bubble, the optimizer
    step; communication >= 0). Model, workload and cluster are the reference's for every
    candidate, so what depends only on them is computed once; `spec_of(fit)` builds a fit's
    RunSpec. CNNs have one flat compute time for every layout: the reference plan's."""
    spec = reference.spec
    if spec.model.arch == "cnn":
        return lambda fit: reference.time.compute_seconds
    cluster, work = spec.cluster, spec.workload
    rates = device_rates(cluster.hardware, compute_dtype(work.precision),
                         cluster.hardware.peak_flops(compute_dtype(work.precision)),
                         profile, cluster.efficiency, stack_speed(spec.stack), *stack_rates(spec))
    sb = state_bytes(work.precision, work.optimizer)
    total, framework = reference.params.total, _framework(spec)
    hw = cluster.hardware
    domain = cluster.devices_per_node or max(hw.devices_per_node or 8, hw.scale_up_domain or 0)
    links = links_for(hw, domain, profile)
    # an unknown link costs nothing in the bound (the plan then counts it as free or warns)
    links = dataclasses.replace(links, node_bps=links.node_bps or math.inf, net_bps=links.net_bps or math.inf)
    activation = activation_dtype_bytes(work.precision)
    host_link = host_bytes_per_second(hw)
    inputs_of: dict[int, StepInputs] = {}  # by tp x pp: the parameters a rank holds
    pipeline_of: dict[tuple, float] = {}
    optimizer_of: dict[tuple, float] = {}

    def bound(fit: Fit) -> float:
        # `step_lower_bound` in two parts, each shared by the fits that agree on what it reads: the
        # pipeline part does not read the ZeRO stage or offload, the optimizer part (and host copies)
        # reads only dp, tp x pp, the accumulation, ZeRO stage and offload (the search varies nothing else)
        dp, tp, pp, _, zero, offload, recompute, schedule, v = fit.family
        pipeline_key = (dp, tp, pp, fit.mbs, recompute, schedule, v)
        optimizer_key = (dp, tp, pp, fit.mbs, zero, offload)
        pipeline, optimizer = pipeline_of.get(pipeline_key), optimizer_of.get(optimizer_key)
        if pipeline is None or optimizer is None:
            candidate = spec_of(fit)
            ranks = tp * pp
            inputs = inputs_of.get(ranks)
            if inputs is None:
                inputs = inputs_of[ranks] = StepInputs(total / ranks, sb.grad, sb.weight, activation, 0.0, 0.0,
                                                       framework, host_bytes_per_second=host_link)
            if pipeline is None:
                pipeline = pipeline_of[pipeline_key] = pipeline_lower_bound(candidate, rates, inputs, links)
            if optimizer is None:
                optimizer = optimizer_of[optimizer_key] = sum(
                    optimizer_and_offload(candidate.layout, work.optimizer, inputs, rates))
        return pipeline + optimizer

    return bound


def _result(spec, objective, devices, global_batch, evaluated, rejected, inferred, timed, fitting, top, smallest,
            shapes, profile=None) -> SearchResult:
    timed = [p for p in timed if p.memory.may_fit]  # plan() has the last word on every layout shown
    ranked = _distinct([p for p in timed if p.fits], objective, top)
    # tight layouts (over the usable memory by less than the memory forecast's validated error) come
    # after those that fit: the ones that would beat the last layout shown, which a user may try;
    # each with the advice `plan` gives it (timed without, as every layout of the search was)
    worst = objective_value(ranked[-1], objective) if len(ranked) == top else math.inf
    ranked += [with_advice(p, profile) for p in
               _distinct([p for p in timed if not p.fits and objective_value(p, objective) < worst], objective, top)]
    notes = []
    if not shapes:
        notes.append(f"no (tp, pp) split of {devices} devices suits {spec.model.key}")
    if inferred > 0:
        notes.append(f"{inferred:,} layouts were judged without their own memory evaluation: memory grows with "
                     "the micro-batch, so below one that fits all fit and above one that does not none do")
    if len(timed) < fitting:
        notes.append(f"{fitting - len(timed):,} layouts that fit were not timed: their compute lower bound "
                     f"already exceeds the top {top}")
    return SearchResult(spec, objective, devices, global_batch, evaluated, len(timed), fitting,
                        {k: v for k, v in rejected.items() if v}, tuple(ranked),
                        None if smallest is None else smallest / GIB, tuple(notes))


def _distinct(plans: list[Plan], objective: str, top: int) -> list[Plan]:
    """The best `top` plans by `rank_key`, one per `family_key`."""
    ranked: list[Plan] = []
    seen: set[tuple] = set()
    for result in sorted(plans, key=lambda p: rank_key(p, objective)):
        key = family_key(result, objective)
        if key not in seen:
            seen.add(key)
            ranked.append(result)
        if len(ranked) == top:
            break
    return ranked


def fits_anywhere(spec: RunSpec, devices: int, tp_within_node: bool = True,
                  host_memory_per_device_gib: float | None = None, sequence_parallel: bool = True) -> Plan | None:
    """The first layout on `devices` that `plan()` says fits, or None (a feasibility test)."""
    result = search_layouts(spec, devices, first_fit_only=True, tp_within_node=tp_within_node,
                            host_memory_per_device_gib=host_memory_per_device_gib,
                            sequence_parallel=sequence_parallel)
    return result.best


def describe_layout(lay: Layout) -> str:
    """One short line naming a layout, in the `flopwise plan` option vocabulary."""
    sp = "+SP" if (lay.tp > 1 and lay.sequence_parallel) else ""
    text = f"dp {lay.dp} tp {lay.tp}{sp} pp {lay.pp}" + (f" cp {lay.cp}" if lay.cp > 1 else "") \
        + (f" ep {lay.ep}" + (f" etp {lay.expert_tp}" if lay.expert_tp != lay.tp else "")
           + (" deepep" if lay.moe_dispatcher == "deepep" else "") if lay.ep > 1 else "") \
        + f", micro-batch {lay.micro_batch_size} x {lay.grad_accum}, ZeRO-{lay.zero_stage}"
    if lay.recompute != "none":
        text += f", recompute {lay.recompute}"
    if lay.offload != "none":
        text += f", offload {lay.offload}"
    if lay.pp > 1:
        text += f", {lay.pipeline_schedule}" + (f" v{lay.virtual_stages}" if lay.pipeline_schedule == "interleaved" else "")
    return text


def nothing_fits_message(result: SearchResult, tp_within_node: bool = True, max_factor: int = 64,
                         host_memory_per_device_gib: float | None = None) -> str:
    """One line for a search where no layout fits: what was needed, and the nearest changes that fit.

    Offload and recompute are already part of the search, so the changes tried are more
    devices (2x ... `max_factor`x, the same global batch) and shorter sequences (same tokens
    per step).
    """
    spec, devices = result.base, result.devices
    hw = spec.cluster.hardware
    usable = ((hw.memory_bytes or 0.0) - spec.cluster.memory_reserve_gib * GIB) / GIB
    line = f"no layout of {spec.model.key} fits on {devices} x {hw.key}"
    if result.smallest_memory_gib is not None:
        line += (f": the leanest layout tried needs {result.smallest_memory_gib:.1f} GiB of {usable:.1f} GiB "
                 "usable per device")
    if result.rejected.get("host_memory"):
        line += f" ({result.rejected['host_memory']:,} layouts offloading more than the host memory were excluded)"
    options = []
    factor = 2
    while factor <= max_factor:
        found = fits_anywhere(spec, devices * factor, tp_within_node, host_memory_per_device_gib)
        if found is not None:
            options.append(f"--gpus {devices * factor} ({describe_layout(found.spec.layout)})")
            break
        factor *= 2
    seq = spec.workload.seq_len
    if spec.model.arch != "cnn":
        while seq > 128:
            seq //= 2
            scale = spec.workload.seq_len // seq
            shorter = dataclasses.replace(
                spec, workload=dataclasses.replace(spec.workload, seq_len=seq),
                layout=dataclasses.replace(spec.layout, grad_accum=spec.layout.grad_accum * scale))
            found = fits_anywhere(shorter, devices, tp_within_node, host_memory_per_device_gib)
            if found is not None:
                options.append(f"--seq-len {seq} ({describe_layout(found.spec.layout)})")
                break
    if not options:
        return line + f"; nothing fits with up to {devices * max_factor} devices or sequences down to 128 tokens either"
    return line + "; nearest that fits: " + " or ".join(options)
