"""The planner: one RunSpec in, one Plan out (parameters, FLOPs, memory, communication,
time, energy, cost, and what to change when it does not fit).

Pure Python over frozen dataclasses: no torch, no I/O, cheap enough for layout searches
(`plan()` runs in tens of microseconds). `build_runspec` turns CLI-like options into a
RunSpec (it looks names up in the catalogs, so it does read the packaged YAML once).
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

from flopwise.catalog.names import spelled
from flopwise.errors import UserError
from flopwise.plan import finetune as tuning
from flopwise.plan import activation_offload, mamba, recompute_modules
from flopwise.plan import memory as mem
from flopwise.plan.calibration import Efficiency, efficiency_for
from flopwise.plan.comm import (
    LINK_EFFICIENCY, CommEstimate, all_reduce_seconds, link_name, links_for, ring_all_reduce_bytes,
)
from flopwise.plan.cost import CostEstimate, EnergyEstimate, estimate_cost, estimate_energy
from flopwise.plan.flops import FlopsEstimate, estimate_flops
from flopwise.plan.params import ParamCount, count_params
from flopwise.plan.spec import (
    FRAMEWORKS, OFFLOAD, OPTIMIZERS, PRECISIONS, RECOMPUTE, SCHEDULES, Cluster, Layout, RunSpec, Workload,
)
from flopwise.plan.band import Band, band_for, model_size_reason, widened
from flopwise.plan.fit import stack_speed
from flopwise.plan.gemm import ASSUMED_FAMILIES, ASSUMED_SUSTAINED, GemmProfile, curve_for, device_rates
from flopwise.plan.stacks import find_stack
from flopwise.plan.stacks.conventions import gradient_reduce_bytes
from flopwise.plan.stage_memory import amp_params, estimate_memory, every_stage_memory
from flopwise.plan.timing import StepInputs, TimeEstimate, end_slots_note, flat_time, stack_ends_in_split, stack_switch, step_time

GIB = mem.GIB
SCHEMA_VERSION = 2
"""Version of `plan --json`: 2 is the contract of docs/planner.md ("JSON contract")."""
EXAMPLE = {
    "model": "llama2-7b",
    "hardware": "h100-sxm",
    "gpus": 8,
    "precision": "bf16",
    "optimizer": "adamw",
    "seq_len": 4096,
    "batch_tokens": 4 * 2**20,
    "tokens": 2e12,
}
"""The built-in example (`flopwise plan` with no options): Llama 2 7B on 8 × H100 SXM,
bf16, AdamW, sequences of 4096, 4M-token (2^22) batches, 2T tokens; the ZeRO stage is
chosen (`choose_zero_stage`)."""


@dataclass(frozen=True)
class Plan:
    """Everything the planner predicts for one RunSpec."""

    spec: RunSpec
    params: ParamCount
    flops: FlopsEstimate
    memory: mem.MemoryEstimate
    comm: CommEstimate
    time: TimeEstimate
    energy: EnergyEstimate
    cost: CostEstimate
    warnings: tuple[str, ...] = ()
    advice: tuple[str, ...] = ()
    band: Band | None = None  # expected error of the time forecast (plan/band.py)

    @property
    def fits(self) -> bool:
        """Whether the busiest device's memory fits its usable capacity."""
        return self.memory.fits

    @property
    def interruptions(self):
        """The job's expected hardware interruptions and what they add (plan/interruptions.py)."""
        from flopwise.plan.interruptions import for_plan

        extra = self.spec.cluster.extra
        return for_plan(self, extra.get("interruptions_per_device_day"), extra.get("restart_seconds"),
                        extra.get("host_copy_gbps"))

    def to_dict(self) -> dict:
        """JSON-able plan in the contract of docs/planner.md: flat headline figures in SI
        units (bytes, seconds, FLOPs, kWh, USD) under fixed names, the richer sections
        beside them (`memory` and `time` keep every field; parameters in `details`)."""
        from flopwise.plan.facility import estimate_facility

        params = {name: getattr(self.params, name) for name in self.params.__dataclass_fields__}
        params["per_layer"] = self.params.per_layer
        lay, time = self.spec.layout, self.time
        memory = self.memory.to_dict()
        memory["stages"] = [stage.to_dict() for stage in every_stage_memory(self.spec)]
        memory.update(per_device_bytes=self.memory.per_device_bytes(), device_bytes=self.memory.device_bytes,
                      fits=self.fits)
        return {
            "schema_version": SCHEMA_VERSION,
            "params": float(self.params.total),
            "active_params": float(self.params.active),
            "flops_per_token": self.flops.model_per_unit,
            "training_flops": self.flops.model_total,
            "pf_days": self.flops.pf_days,
            "memory": memory,
            "time": time.to_dict(),
            "gpu_hours": time.device_hours,
            "energy_kwh": self.energy.kwh,
            "cost_usd": {"on_demand": self.cost.on_demand_usd, "spot": self.cost.spot_usd},
            "layout": {"dp": lay.dp, "tp": lay.tp, "pp": lay.pp, "micro_batch": lay.micro_batch_size,
                       "grad_accum": lay.grad_accum, "zero": lay.zero_stage, "framework": lay.framework,
                       "recompute": lay.recompute, "compiled": lay.compiled, "cp": lay.cp, "ep": lay.ep,
                       "etp": lay.expert_tp, "sequence_parallel": lay.sequence_parallel,
                       "moe_dispatcher": lay.moe_dispatcher, "moe_shared_expert_overlap": lay.moe_shared_expert_overlap,
                       "offload": lay.offload, "offload_activations": lay.offload_activations,
                       "grad_reduce": gradient_dtype(self.spec, self.memory.fits_with),
                       "fp32_params": planned_amp(self.spec)},
            "facility": estimate_facility(self.spec).to_dict(),
            "defaults": list(self.spec.cluster.extra.get("defaults", ())),
            "fits": self.fits,
            "fits_with": list(self.memory.fits_with),
            "stack": self.spec.stack,
            "finetune": tuning.split_json(self.spec),
            "inputs": runspec_to_dict(self.spec),
            "flops": self.flops.to_dict(),
            "comm": self.comm.to_dict(),
            "energy": self.energy.to_dict(),
            "cost": self.cost.to_dict(),
            "details": {"params": params},
            "warnings": list(self.warnings),
            "advice": list(self.advice),
            "band": self.band.to_dict() if self.band is not None else None,
            "interruptions": self.interruptions.to_dict(),
        }


def runspec_to_dict(spec: RunSpec) -> dict:
    """The inputs of a plan as plain data (model and hardware by key)."""
    cluster = {k: v for k, v in dataclasses.asdict(spec.cluster).items() if k != "hardware"}
    layout = dataclasses.asdict(spec.layout)
    layout["devices"] = spec.layout.devices
    layout["global_batch_size"] = spec.layout.global_batch_size
    return {
        "model": spec.model.key,
        "hardware": spec.cluster.hardware.key,
        "stack": spec.stack,
        "layout": layout,
        "workload": dataclasses.asdict(spec.workload),
        "cluster": cluster,
    }


# --------------------------------------------------------------------------- validation


def check_expert_parallel(model, ep: int) -> None:
    """Raise UserError unless `model` has routed experts that `ep` ranks can split evenly."""
    if model.n_experts <= 1:
        raise UserError(f"--ep {ep}: {model.key} has no experts to split (expert parallelism is for MoE models)")
    if model.n_experts % ep:
        raise UserError(f"--ep {ep} does not divide {model.key}'s {model.n_experts} experts")


def validate(spec: RunSpec) -> None:
    """Raise UserError for a RunSpec no real run could have."""
    lay, work, model = spec.layout, spec.workload, spec.model
    for name, value in (("dp", lay.dp), ("tp", lay.tp), ("pp", lay.pp), ("cp", lay.cp), ("ep", lay.ep),
                        ("micro-batch", lay.micro_batch_size),
                        ("grad-accum", lay.grad_accum), ("virtual-stages", lay.virtual_stages)):
        if value < 1:
            raise UserError(f"--{name} must be >= 1, got {value}")
    _choice("precision", work.precision, PRECISIONS)
    _choice("optimizer", work.optimizer, OPTIMIZERS)
    if lay.ep > 1:
        check_expert_parallel(model, lay.ep)
    if lay.etp and model.n_experts <= 1:
        raise UserError(f"--etp {lay.etp}: {model.key} has no experts (expert tensor parallelism is for MoE models)")
    if lay.etp < 0 or (lay.etp and lay.tp % lay.etp):
        raise UserError(f"--etp {lay.etp} must divide --tp {lay.tp}")
    if lay.ep > 1 and (lay.gradient_group * lay.tp) % (lay.ep * lay.expert_tp):
        if lay.expert_tp == lay.tp:
            raise UserError(f"--ep {lay.ep} must divide the data-parallel ranks dp x cp = {lay.gradient_group} "
                            "(the expert-parallel ranks are data-parallel ranks for the rest of the model; with "
                            "--etp below --tp they may span the tensor-parallel ranks too)")
        raise UserError(f"--ep {lay.ep} x --etp {lay.expert_tp} must divide dp x cp x tp = "
                        f"{lay.gradient_group * lay.tp}")
    if not mem.is_recompute_policy(lay.recompute):
        raise UserError(f"--recompute '{lay.recompute}' is not one of {', '.join(mem.RECOMPUTE_POLICIES)}, "
                        "every:K, blocks:F or Megatron-Core modules (modules:mlp+moe, --recompute-modules)")
    if (modules := recompute_modules.parse(lay.recompute)) is not None:
        recompute_modules.check(modules, model)
    _choice("framework", lay.framework, FRAMEWORKS)
    tuning.validate_workload(work, lay, model, spec.stack)
    if not 0 <= spec.cluster.allocator_reserve < 1:
        raise UserError(f"--allocator-reserve must be in [0, 1), got {spec.cluster.allocator_reserve}")
    _choice("offload", lay.offload, OFFLOAD)
    _choice("schedule", lay.pipeline_schedule, SCHEDULES)
    if lay.zero_stage not in (0, 1, 2, 3):
        raise UserError(f"--zero must be 0, 1, 2 or 3, got {lay.zero_stage}")
    if lay.offload == "params" and lay.zero_stage != 3:
        raise UserError("--offload params needs --zero 3 (parameters are offloaded as ZeRO-3 shards)")
    activation_offload.check(lay, model, find_stack(spec.stack))
    if not 0 <= lay.fsdp_unit_mb < float("inf"):
        raise UserError(f"--fsdp-unit-mb must be a finite number >= 0 (0 = one unit per block), got {lay.fsdp_unit_mb}")
    if model.arch != "cnn":
        if work.seq_len < 1:
            raise UserError(f"--seq-len must be >= 1, got {work.seq_len}")
        if lay.cp > 1 and work.seq_len % (2 * lay.cp):
            raise UserError(f"--cp {lay.cp}: the sequence ({work.seq_len} tokens) must divide into 2 × cp chunks "
                            "(each rank takes one from each end, to balance causal attention)")
        if lay.cp > 1 and not lay.flash_attention:
            raise UserError(f"--cp {lay.cp} needs flash attention (ring attention passes K/V blocks through it)")
        if model.n_heads % lay.tp:
            raise UserError(f"--tp {lay.tp} does not divide {model.key}'s {model.n_heads} attention heads")
        _check_hybrid(spec)
        # a Megatron stack counts the embedding and the loss as a layer each when layers are short (`timing.end_slots`)
        ends = stack_ends_in_split(spec.stack)
        room = model.n_layers + 2 * ends
        and_ends = f" and its embedding and loss (which {spec.stack} counts as a layer each)" if ends else ""
        if lay.pp > room:
            raise UserError(f"--pp {lay.pp} is more than {model.key}'s {model.n_layers} layers{and_ends}")
        if lay.pipeline_schedule == "interleaved" and lay.pp * lay.virtual_stages > room:
            raise UserError(
                f"interleaved schedule needs at least one layer per chunk: pp × virtual stages "
                f"({lay.pp} × {lay.virtual_stages}) is more than {model.n_layers} layers{and_ends}"
            )
    elif lay.tp > 1 or lay.pp > 1:
        raise UserError(f"{model.key} is a CNN: only data parallelism is planned (use --dp, not --tp/--pp)")
    hw = spec.cluster.hardware
    if hw.peak_flops(mem.compute_dtype(work.precision)) is None:
        known = [d for d in PRECISIONS if hw.peak_flops(mem.compute_dtype(d)) is not None]
        raise UserError(
            f"{hw.key} has no published {work.precision} peak; choose --precision from {', '.join(known) or 'none'}"
        )
    eff = spec.cluster.efficiency
    if eff is not None and not 0 < eff <= 1:
        raise UserError(f"--efficiency must be in (0, 1], got {eff}")


def _check_hybrid(spec: RunSpec) -> None:
    """What a hybrid Mamba-2 stack's plan does not cover: tensor parallelism that splits a Mamba head or
    group (Megatron-Core's `MambaMixer` asserts both divide), context parallelism (Megatron's Mamba
    all-to-alls, `mamba_context_parallel.py`, are not modelled) and LoRA (its adapters are counted on
    attention and MLP blocks)."""
    model, lay = spec.model, spec.layout
    mix = mamba.layer_mix(model)
    if mix is None:
        return
    if mix.mamba and (model.mamba_heads % lay.tp or model.mamba_groups % lay.tp):
        raise UserError(f"--tp {lay.tp} must divide {model.key}'s {model.mamba_heads} Mamba heads and "
                        f"{model.mamba_groups} groups")
    if lay.cp > 1:
        raise UserError(f"--cp {lay.cp}: context parallelism of a hybrid Mamba model is not planned")
    if getattr(spec.workload, "finetune", "full") != "full":
        raise UserError(f"--finetune {spec.workload.finetune}: adapters on a hybrid Mamba model are not planned")


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise UserError(f"--{name} '{value}' is not one of {', '.join(allowed)}")


# --------------------------------------------------------------------------- the plan


def plan(spec: RunSpec, profile: GemmProfile | None = None, advise: bool = True) -> Plan:
    """Predict parameters, FLOPs, memory, communication, time, energy and cost of a run.

    `profile`: a measured device profile (`flopwise.plan.profile.DeviceProfile` or anything
    with its methods); its GEMM rates and memory bandwidth replace the family curve.
    When the run does not fit, `advice` lists which single changes (ZeRO-3, recompute,
    offload, smaller micro-batch, more devices) make it fit, each computed by planning it.
    `profile`: a measured device profile (`flopwise.plan.profile.DeviceProfile`); the
    efficiency of the step's GEMMs then comes from it (unless --efficiency is given).
    `advise=False` leaves the advice out (a search times thousands of layouts and shows a few:
    `with_advice` adds it to those).
    """
    result = _evaluate(spec, profile)
    if result.fits:
        return result
    if kept_as_stated(spec, result.memory):  # the verdict says tight, the advice what fits for certain
        return with_advice(result, profile) if advise else result
    with_recompute = _stack_recompute(spec, profile)
    if with_recompute is not None:
        return with_recompute
    return with_advice(result, profile) if advise else result


def with_advice(result: Plan, profile: GemmProfile | None = None) -> Plan:
    """`result` with the advice `plan` gives a layout that does not fit (none for one that fits)."""
    if result.fits or result.advice:
        return result
    return dataclasses.replace(result, advice=_advice(result.spec, result, profile))


def plan_layout(spec: RunSpec, profile: GemmProfile | None = None) -> Plan:
    """The plan of exactly this layout, recompute included: no recompute added when it does not
    fit and no advice (for a published run whose source states its recompute policy, which must
    be timed as it ran, its memory verdict standing as the planner counts it)."""
    return _evaluate(spec, profile)


def kept_as_stated(spec: RunSpec, memory: mem.MemoryEstimate) -> bool:
    """A layout stated whole (`build_runspec`'s `layout_stated`) that is tight, over the usable memory
    by less than the memory forecast's validated error, is planned as stated, no recompute added:
    runs planned that close have run so (docs/validation.md). `plan` and `plan_memory` both ask here."""
    return not memory.fits and memory.may_fit and bool(spec.cluster.extra.get("layout_stated"))


STACK_RECOMPUTE_LADDER = ("every:4", "every:2", "full")
"""Recompute a named stack tries, least first, before it judges a layout not to fit:
Megatron-Core's `--recompute-granularity full --recompute-method block --recompute-num-layers N`
recomputes N layers per stage (a quarter, a half, all), as `every:K` plans it."""


def stack_rates(spec: RunSpec) -> tuple[str | None, str | None]:
    """(attention kernel, fp8 recipe) of the spec's stack, for `gemm.device_rates`: the flopwise
    stack keeps the family curve's attention unless a recipe is given."""
    recipe = spec.cluster.extra.get("fp8_recipe")
    stack = None if spec.stack == "flopwise" else find_stack(spec.stack)
    if stack is None:
        return None, recipe
    return stack.attention_kernel, recipe


GRAD_REDUCE_DTYPES = {"bf16": "bf16", "fp32": "fp32", "bfloat16": "bf16", "float32": "fp32", "float": "fp32"}
"""`--grad-reduce` values: the dtype the data-parallel gradient reduction runs in."""


def spelled_grad_reduce(text: str) -> str:
    """`--grad-reduce` as bf16 or fp32 (any case); one line naming the choices otherwise."""
    value = GRAD_REDUCE_DTYPES.get(str(text).strip().lower())
    if value is None:
        raise UserError(f"--grad-reduce {text!r} is not one of: bf16, fp32")
    return value


def _amp_params(stated: bool | None, stack, framework: str, precision: str, finetune: str) -> bool:
    """`--fp32-params` as planned: AMP with fp32 parameters, stated or the stack's 16-bit training,
    for a full bf16/fp16 training under FSDP/DDP conventions; a statement that cannot hold is one line."""
    if stated is None:
        return stack.fp32_params and precision in ("bf16", "fp16") and finetune == "full"
    if not stated:
        return False
    if precision not in ("bf16", "fp16"):
        raise UserError(f"--fp32-params: autocast keeps fp32 parameters under bf16 or fp16 (got --precision "
                        f"{precision}; fp32 parameters are already planned at fp32, bf16-true has none)")
    if framework != "fsdp":
        raise UserError(f"--fp32-params: {framework} keeps 16-bit weights beside an fp32 master; AMP's fp32 "
                        "parameters are planned with FSDP / DDP conventions (--framework fsdp)")
    if finetune != "full":
        raise UserError("--fp32-params: a --finetune plans its frozen base's and adapters' dtypes itself")
    return True


def gradient_dtype(spec: RunSpec, options: tuple[str, ...] = ()) -> str:
    """The dtype the data-parallel gradient reduction runs in (`gradient_bytes`), by name."""
    if gradient_bytes(spec, options) >= 4:
        return "fp32"
    return "fp16" if spec.workload.precision == "fp16" else "bf16"


def planned_amp(spec: RunSpec) -> bool:
    """Whether the plan keeps AMP's fp32 parameters (`--fp32-params`, or the stack's 16-bit training)."""
    stack = find_stack(spec.stack)
    return amp_params(spec, bool(stack is not None and stack.fp32_params))


def gradient_bytes(spec: RunSpec, options: tuple[str, ...] = ()) -> float:
    """Bytes per gradient element the data-parallel reduction moves under the spec's stack, with
    the memory `options` the plan fits with (`stacks.conventions.gradient_reduce_bytes`), or as
    `--grad-reduce` states it."""
    stated = spec.cluster.extra.get("grad_reduce")
    stack = find_stack(spec.stack)
    if stated is None and spec.workload.fp32_params:  # AMP: the gradients are the fp32 parameters' own
        return 4.0
    if stack is None and stated is None:
        return mem.state_bytes(spec.workload.precision, spec.workload.optimizer).grad
    return gradient_reduce_bytes(stack or find_stack("flopwise"), spec.workload.precision, options, stated)


def _stack_recompute_ladder(spec: RunSpec) -> tuple[str, ...] | None:
    """The recompute policies to try for `spec`, or None when its stack offers none (the
    flopwise stack, a layout that already recomputes or whose recompute the user stated, a CNN)."""
    if spec.stack == "flopwise" or spec.layout.recompute != "none" or spec.model.arch == "cnn" \
            or spec.cluster.extra.get("recompute_stated"):
        return None
    stack = find_stack(spec.stack)
    if stack is None or "recompute" not in stack.memory_options:
        return None
    if spec.layout.offload_activations and stack.layer_offload_limits:
        return None  # its CPU offload refuses recompute (activation_offload.check)
    if stack.recompute_policies is not None:  # only what its recipes offer (litgpt: every block or none)
        return tuple(p for p in STACK_RECOMPUTE_LADDER if p in stack.recompute_policies) or None
    return STACK_RECOMPUTE_LADDER


def _stack_recompute(spec: RunSpec, profile: GemmProfile | None) -> Plan | None:
    """Under a named stack that offers recompute, the layout with the least recompute that fits
    (timed with its recompute), its memory saying so in `fits_with`; None when none fits."""
    ladder = _stack_recompute_ladder(spec)
    if ladder is None:
        return None
    for policy in ladder:
        tried = dataclasses.replace(spec, layout=dataclasses.replace(spec.layout, recompute=policy))
        result = _evaluate(tried, profile)
        if result.fits:
            memory = dataclasses.replace(result.memory, fits_with=(*result.memory.fits_with, f"recompute {policy}"))
            return dataclasses.replace(result, memory=memory)
    return None


def _framework(spec: RunSpec) -> str:
    """The training framework whose conventions apply (megatron | deepspeed | fsdp): `--framework`."""
    return spec.layout.framework


def _flat_time(spec, flops, sb, psi, links, units_per_step, total_units, peak, warnings):
    """CNNs have no operator model here: hardware FLOPs at a flat efficiency, DP all-reduce on the links."""
    lay, cluster, hw = spec.layout, spec.cluster, spec.cluster.hardware
    if cluster.efficiency is not None:
        eff = Efficiency(cluster.efficiency, cluster.extra.get("efficiency_source", "--efficiency"),
                         cluster.extra.get("efficiency_confidence", "user"))
    else:
        eff = efficiency_for(hw.key, mem.compute_dtype(spec.workload.precision))
        if eff.confidence == "low":
            warnings.append(f"efficiency {eff.value:.0%} for {hw.key} {spec.workload.precision} is low-confidence "
                            f"({eff.source})")
    grads = psi * sb.grad
    seconds = all_reduce_seconds(links, lay.dp, 1, grads)
    comm = CommEstimate(ring_all_reduce_bytes(lay.dp, grads), 0.0, 0.0, seconds, 0.0, 0.0,
                        link_name(links, lay.dp, 1), "-", "-", LINK_EFFICIENCY)
    time = flat_time(
        model_flops_per_unit=flops.model_per_unit, hardware_flops_per_unit=flops.hardware_per_unit,
        units_per_step=units_per_step, total_units=total_units, devices=lay.devices, peak_flops=peak,
        efficiency=eff.value, efficiency_source=eff.source, efficiency_confidence=eff.confidence, comm=comm,
    )
    return time, comm


def _with_16bit_mfu(time, hw, precision: str, peak: float | None):
    """An fp8 plan's MFU also over the 16-bit dense peak, as torchtitan states it (`get_peak_flops`:
    the bf16 peak for every run), twice what the fp8 peak gives; Composer's SpeedMonitor divides by
    the fp8 peak (`GPU_AVAILABLE_FLOPS[...]["amp_fp8"]`), as `mfu` does."""
    peak16 = hw.peak_flops("bf16") or hw.peak_flops("fp16")
    if precision != "fp8" or not peak or not peak16 or peak16 == peak:
        return time
    return dataclasses.replace(time, mfu_16bit_peak=time.mfu * peak / peak16)


def _evaluate(spec: RunSpec, profile: GemmProfile | None = None) -> Plan:
    validate(spec)
    model, lay, work, cluster = spec.model, spec.layout, spec.workload, spec.cluster
    hw = cluster.hardware
    warnings: list[str] = list(cluster.extra.get("warnings", ()))
    pc = count_params(model)
    cnn = model.arch == "cnn"

    # FLOPs
    units_per_step = float(lay.global_batch_size) * (1 if cnn else work.seq_len)
    total_units = work.total_samples if cnn else work.total_tokens
    flops = estimate_flops(model, pc, work.seq_len, lay.recompute, total_units,
                           stack_switch(spec.stack, "recompute_early_stop"))
    tuned = tuning.split_of(spec)
    if tuned is not None:  # no base weight gradients: 4N + 6·adapters (plan/finetune.py)
        flops = tuning.finetune_flops(model, pc, tuned, work.seq_len, lay.recompute, total_units)

    # Memory
    memory = _memory(spec, pc, warnings)
    sb = mem.state_bytes(work.precision, work.optimizer)
    experts = pc.moe_layers * pc.experts_per_layer  # routed experts: 1/(ep x etp) of them per device
    psi = (pc.total - experts) / (lay.tp * lay.pp) + experts / (lay.ep * lay.expert_tp * lay.pp)
    e = mem.activation_dtype_bytes(work.precision)

    # Communication and time: the operator model (ops.py, gemm.py, comm.py, timing.py)
    peak = hw.peak_flops(mem.compute_dtype(work.precision))
    # the scale-up link reaches the whole scale-up domain (a TPU pod's ICI, an NVL72 rack), not just a host
    domain = cluster.devices_per_node or max(hw.devices_per_node or 8, hw.scale_up_domain or 0)
    links = links_for(hw, domain, profile)
    if ((links.node_bps is None and lay.devices > 1 and links.devices_per_node > 1)
            or (links.net_bps is None and lay.devices > links.devices_per_node)):
        warnings.append(f"{hw.key}: link bandwidth unknown; that communication time is not counted")
        links = dataclasses.replace(links, node_bps=links.node_bps or math.inf, net_bps=links.net_bps or math.inf)
    eff_value = cluster.efficiency
    if eff_value is not None:
        eff_source = cluster.extra.get("efficiency_source", "--efficiency")
        eff_conf = cluster.extra.get("efficiency_confidence", "user")
    if cnn:
        time, comm = _flat_time(spec, flops, sb, psi, links, units_per_step, total_units, peak, warnings)
    else:
        rates = device_rates(hw, mem.compute_dtype(work.precision), peak, profile, eff_value, stack_speed(spec.stack),
                             *stack_rates(spec))
        if eff_value is None:
            eff_source = (f"operator model: GEMM rates and memory bandwidth from the measured device profile "
                          f"({getattr(profile, 'device', 'profile')})" if profile is not None else
                          f"operator model: {rates.curve.family} GEMM curve ({rates.curve.source})")
            eff_conf = "measured" if profile is not None else (
                "low" if rates.curve.family in (*ASSUMED_SUSTAINED, *ASSUMED_FAMILIES) else "medium")
            if eff_conf == "low":
                what = ("no GEMM micro-benchmark for this device family" if rates.curve.family in ASSUMED_FAMILIES else
                        ASSUMED_SUSTAINED[rates.curve.family])
                warnings.append(f"{hw.key}: {what}; times are low-confidence "
                                "(measure a profile with `flopwise calibrate`)")
        if work.precision == "fp8" and spec.cluster.extra.get("fp8_recipe") == "mxfp8" \
                and rates.curve.family != "blackwell":
            warnings.append(f"{hw.key}: MXFP8 block scales are native to Blackwell's tensor cores only; "
                            "planned at the per-tensor fp8 rate, which this device's stacks cannot run it at")
        inputs = StepInputs(psi, gradient_bytes(spec, memory.fits_with), sb.weight, e, flops.hardware_per_unit,
                            flops.model_per_unit,
                            _framework(spec), saved_bytes_per_layer=memory.activation_bytes_per_layer,
                            host_bytes_per_second=activation_offload.host_bytes_per_second(hw))
        if tuned is not None:
            inputs = tuning.step_inputs(inputs, tuned, spec, pc, sb)
        time, comm = step_time(spec, inputs, rates, links, total_units, peak, eff_source, eff_conf)
        warnings += tuning.time_warnings(spec, rates, time.step_seconds)
    time = _with_16bit_mfu(time, hw, work.precision, peak)
    if not total_units:
        warnings.append("no --tokens given: whole-job time, energy and cost are 0")

    energy = estimate_energy(time.device_hours, hw.tdp_w, cluster.pue)
    if energy.kwh is None:
        warnings.append(f"{hw.key} has no known power (TDP); energy not estimated")
    cost = estimate_cost(time.device_hours, hw, cluster.price_per_device_hour)
    band = band_for(spec.stack, lay.zero_stage, work.precision, lay.devices, curve_for(hw).family)
    if lay.cp > 1:  # no published run in the validation splits its sequences
        band = dataclasses.replace(band, extrapolates=True,
                                   reasons=(*band.reasons, "context parallelism never validated"))
    small = model_size_reason(pc.active) if model.arch != "cnn" else None
    if small:
        band = dataclasses.replace(band, extrapolates=True, reasons=(*band.reasons, small))
    if mamba.layer_mix(model) is not None:  # nor runs a Mamba layer; and pp > 1 splits the average layer
        band = dataclasses.replace(band, extrapolates=True,
                                   reasons=(*band.reasons, "hybrid Mamba layers never validated"))
        if lay.pp > 1:
            warnings.append(f"{model.key}: each pipeline stage is planned with the whole model's mix of Mamba, "
                            "attention and MLP layers (the average layer), not the layers the pattern puts there")
    if model.n_experts > 1:  # no published run in the validation routes tokens to experts
        band = dataclasses.replace(band, extrapolates=True, reasons=(
            *band.reasons, "mixture-of-experts" + (" and expert parallelism" if lay.ep > 1 else "") + " never validated"))
    band = widened(band)  # outside what was validated: the extrapolation band at least
    return Plan(spec, pc, flops, memory, comm, time, energy, cost, tuple(warnings), band=band)


def plan_memory(spec: RunSpec, check: bool = True, stack_recompute: bool = True) -> mem.MemoryEstimate:
    """The memory part of `plan()` alone (same formulas), for searches that reject layouts
    which do not fit before timing them. `check=False` skips `validate` for callers that
    only build valid layouts; `stack_recompute=False` judges the layout as given, as
    `plan_layout` does."""
    if check:
        validate(spec)
    pc = count_params(spec.model)
    memory = estimate_memory(spec, pc, [], every_stage=False)
    ladder = None if memory.fits or not stack_recompute else _stack_recompute_ladder(spec)
    if ladder is None:
        return memory
    if kept_as_stated(spec, memory):
        return memory
    for policy in ladder:  # as `plan()` does (`_stack_recompute`)
        tried = dataclasses.replace(spec, layout=dataclasses.replace(spec.layout, recompute=policy))
        with_recompute = estimate_memory(tried, pc, [], every_stage=False)
        if with_recompute.fits:
            return dataclasses.replace(with_recompute, fits_with=(*with_recompute.fits_with, f"recompute {policy}"))
    return memory


def _memory(spec: RunSpec, pc: ParamCount, warnings: list[str]) -> mem.MemoryEstimate:
    """Per-device memory of the busiest pipeline stage and the fit verdict (plan/stage_memory.py);
    only the stages that can be the busiest are planned (`Plan.to_dict` lists every stage)."""
    return estimate_memory(spec, pc, warnings, every_stage=False)


# --------------------------------------------------------------------------- advice


def _advice(spec: RunSpec, result: Plan, profile: GemmProfile | None = None) -> tuple[str, ...]:
    """Plan single changes (then a combination) and keep those that fit."""
    lay = spec.layout
    need = f"needs {result.memory.allocated_bytes / GIB:.1f} GiB of {result.memory.capacity_bytes / GIB:.1f} GiB usable per device"
    candidates: list[tuple[str, Layout]] = []
    if lay.zero_stage < 3 and lay.dp > 1:
        candidates.append(("--zero 3", dataclasses.replace(lay, zero_stage=3)))
    if (spec.stack == "flopwise" and lay.framework == "fsdp" and lay.zero_stage >= 2 and lay.grad_accum > 1
            and lay.pp == 1 and not lay.fsdp_sync_every_micro_step):
        candidates.append(("--fsdp-sync-every-micro-step (train: parallel.fsdp_grad_sync=every_micro_step)",
                           dataclasses.replace(lay, fsdp_sync_every_micro_step=True)))
    keeps_less = {"none": 0, "selective": 1, "op": 2, "full": 4}.get(lay.recompute, 3)  # every:K is 3
    for mode in ("selective", "full"):
        if {"selective": 1, "full": 4}[mode] > keeps_less:
            candidates.append((f"--recompute {mode}", dataclasses.replace(lay, recompute=mode)))
    if lay.offload == "none":
        candidates.append(("--offload optimizer", dataclasses.replace(lay, offload="optimizer")))
    if lay.offload != "params":
        candidates.append(("--zero 3 --offload params", dataclasses.replace(lay, zero_stage=3, offload="params")))
    mbs = lay.micro_batch_size
    while mbs > 1:
        mbs //= 2
        accum = max(1, lay.global_batch_size // (lay.dp * mbs))
        candidates.append((f"--micro-batch {mbs}", dataclasses.replace(lay, micro_batch_size=mbs, grad_accum=accum)))
    for k in (2, 4, 8, 16):
        if lay.zero_stage == 0:
            break
        accum = max(1, lay.grad_accum // k)
        candidates.append((f"--gpus {lay.devices * k} (dp {lay.dp * k})", dataclasses.replace(lay, dp=lay.dp * k, grad_accum=accum)))
    for tp in (2, 4, 8):
        if tp > lay.tp and spec.model.arch != "cnn" and spec.model.n_heads % tp == 0:
            candidates.append((f"--gpus {lay.dp * tp * lay.pp} (tp {tp}, sequence parallel)",
                               dataclasses.replace(lay, tp=tp, sequence_parallel=True)))
    candidates.append(("--zero 3 --recompute full --offload optimizer",
                       dataclasses.replace(lay, zero_stage=3, recompute="full",
                                           offload="params" if lay.offload == "params" else "optimizer")))
    fitting = []
    for label, layout in candidates:
        try:
            alt = _evaluate(dataclasses.replace(spec, layout=layout), profile)
        except UserError:
            continue
        if alt.fits:
            fitting.append(f"{label}: {alt.memory.total_bytes / GIB:.1f} GiB, "
                           f"{alt.time.tokens_per_second_per_device:,.0f} {alt.flops.unit}s/s/device")
    if not fitting:
        return (need, "no single change tried fits: use more devices, a smaller model or a larger-memory device")
    return (need, *("would fit with " + f for f in fitting))


# --------------------------------------------------------------------------- inputs


_SUFFIXES = {"": 1.0, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12, "P": 1e15}
_COUNT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMBGTP]?)\s*$", re.IGNORECASE)


def parse_count(text: str | float | int, option: str = "--tokens") -> float:
    """'300B', '1.4T', '2e12', '4M' -> float (K=1e3, M=1e6, B/G=1e9, T=1e12, P=1e15)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        match = _COUNT.match(str(text))
        if not match:
            raise UserError(f"{option} '{text}' is not a count; use e.g. 300B, 1.4T, 2e12 or 4M")
        value = float(match.group(1)) * _SUFFIXES[match.group(2).upper()]
    if not math.isfinite(value) or value < 0:
        raise UserError(f"{option} must be a finite number >= 0, got {text!r}")
    return value


PRECISION_WORDS = {
    # PyTorch Lightning's and Composer's names (Trainer(precision=...), `precision: amp_bf16`)
    "bf16-mixed": "bf16", "amp-bf16": "bf16", "16-mixed": "fp16", "fp16-mixed": "fp16", "amp-fp16": "fp16",
    "16": "fp16", "32": "fp32", "32-true": "fp32", "fp32-true": "fp32", "amp-fp8": "fp8", "float8": "fp8",
    "fp8-mixed": "fp8", "transformer-engine": "fp8",
    "bfloat16": "bf16", "float16": "fp16", "float32": "fp32",
    # pure bf16 (no fp32 master), as torchtune's `dtype: bf16` and litgpt's `bf16-true` mean it
    "pure-bf16": "bf16-true", "bf16-pure": "bf16-true", "true-bf16": "bf16-true",
    # Megatron-LM's --fp8-format values (Transformer Engine: e4m3 everywhere, or e5m2 for gradients)
    "e4m3": "fp8", "hybrid": "fp8",
}
"""--precision as the trainers and papers spell it; the mixed-precision names keep an fp32 master
copy, which is what bf16 / fp16 plan (bf16-true is the pure-bf16 one)."""


def spelled_precision(text: str) -> str:
    """A precision in any case, with `_` or spaces ("BF16", "amp_bf16", "bf16-mixed"), as its
    canonical name; an unknown one is returned as typed, for the check that names the choices."""
    word = spelled(text)
    return PRECISION_WORDS.get(word, word) if word else text


def precision_and_recipe(text: str) -> tuple[str, str | None]:
    """A precision that names its fp8 recipe as NVIDIA's tables print it ("FP8-CS", "fp8 (DS)",
    "MXFP8", "fp8_blockwise") is fp8 with that recipe; any other precision as `spelled_precision`
    reads it, with no recipe."""
    known = spelled_precision(text)
    if known in PRECISIONS:
        return known, None
    word = spelled(text).replace("(", "").replace(")", "").strip("-")
    if word == "mxfp8":
        return "fp8", "mxfp8"
    head, _, tail = word.partition("-")
    if head == "fp8" and tail:
        return "fp8", tail
    return known, None


RECOMPUTE_WORDS = {"true": "full", "yes": "full", "on": "full", "ckpt": "full",
                   "false": "none", "no": "none", "off": "none",
                   # Megatron-Core's --recompute-modules core_attn is Korthikanti et al.'s selective recompute
                   "core_attn": "selective", "core-attn": "selective"}
"""--recompute as a source's "activation checkpointing: yes / no" puts it: a whole block's forward
again (llm-foundry's `activation_checkpointing: true`, FSDP's checkpoint wrapper) or nothing."""


BLOCK_LAYERS = "block-layers:"
"""`block-layers:N`: Megatron-Core's `--recompute-granularity full --recompute-method block
--recompute-num-layers N` (NeMo's recompute_layers): the first N blocks of each pipeline stage
(virtual chunk) recomputed whole."""


def blocks_of_stage(recompute: str, layers: int, chunks: int) -> str:
    """`block-layers:N` as the share of blocks it recomputes, `blocks:F` with F = N / (layers per chunk)."""
    count = recompute[len(BLOCK_LAYERS):]
    per_chunk = layers / chunks
    if not count.isdigit() or int(count) < 1:
        raise UserError(f"--recompute-num-layers must be a whole number >= 1, got {count!r}")
    if int(count) > per_chunk:
        raise UserError(f"--recompute-num-layers {count} is more than the {per_chunk:g} layers of a pipeline stage "
                        f"({layers} layers over {chunks} stages and virtual chunks)")
    return f"blocks:{int(count) / per_chunk:.6g}"


def build_runspec(
    model: str | None = None,
    hardware: str | None = None,
    gpus: int | None = None,
    dp: int | None = None,
    tp: int | None = None,
    pp: int | None = None,
    micro_batch: int | None = None,
    global_batch: int | None = None,
    grad_accum: int | None = None,
    batch_tokens: str | float | None = None,
    seq_len: int | None = None,
    tokens: str | float | None = None,
    precision: str | None = None,
    optimizer: str | None = None,
    zero: int | None = None,
    recompute: str | None = None,
    offload: str = "none",
    schedule: str = "1f1b",
    virtual_stages: int | None = None,
    sequence_parallel: bool | None = None,
    flash_attention: bool = True,
    compiled: bool = False,
    cp: int | None = None,
    ep: int | None = None,
    etp: int | None = None,
    fsdp_sync_every_micro_step: bool = False,
    dropout: bool | None = None,
    tp_comm_overlap: bool = False,
    efficiency: float | None = None,
    price_per_hour: float | None = None,
    pue: float = 1.1,
    calibrate: str | None = None,
    memory_reserve_gib: float = 2.0,
    devices_per_node: int = 0,
    framework: str = "fsdp",
    allocator_reserve: float | None = None,
    nodes_per_rack: int = 4,
    profile: GemmProfile | None = None,
    stack: str = "flopwise",
    fp8_recipe: str | None = None,
    moe_dispatcher: str | None = None,
    finetune: str | None = None,
    lora_rank: int | None = None,
    lora_targets: str | None = None,
    lora_dropout: float | None = None,
    fsdp_unit_mb: float = 0.0,
    interruptions_per_device_day: float | None = None,
    restart_seconds: float | None = None,
    host_copy_gbps: float | None = None,
    offload_activations: str | int | None = None,
    grad_reduce: str | None = None,
    fp32_params: bool | None = None,
) -> RunSpec:
    """Build a RunSpec from CLI-like options; anything left None takes the built-in example's value.

    Layout: unspecified dp is gpus/(tp·pp) (so with only --gpus, dp = gpus); gpus
    defaults to dp·tp·pp when dp is given, else 8. Unspecified ZeRO: the fastest stage the
    framework offers that fits (`choose_zero_stage`), 0 with one data-parallel rank; the
    reason is kept in `cluster.extra["defaults"]`. The global batch (sequences, or
    `batch_tokens`/seq_len) is split into micro-batches per data-parallel rank; if it does
    not divide, gradient accumulation rounds up and a warning says so. `hardware` may be a
    HardwareSpec (a profiled CPU); `profile`, a measured device profile, times the stages and
    splits the defaults compare, as `plan(spec, profile)` times the plan.
    """
    # choices in any case, as sources print them ("1F1B", "AdamW", "Megatron", "LoRA"); Adam plans as AdamW
    schedule, offload, framework, finetune = (
        word.strip().lower() if isinstance(word, str) else word for word in (schedule, offload, framework, finetune))
    if lora_targets is not None:  # "q_proj,v_proj" as PEFT spells it: the matrices it adapts
        lora_targets = tuning.named_targets(lora_targets)
    if isinstance(optimizer, str):
        optimizer = {"adam": "adamw"}.get(optimizer.strip().lower(), optimizer.strip().lower())
    options = dict(locals())
    # a stated --finetune (full included) is a fine-tune of a pretrained model: its defaults (tokens, batch,
    # sequence) are a fine-tune's; unstated, the run trains from scratch
    tuned_defaults = finetune is not None
    finetune = finetune or "full"
    # a layout stated whole (a published run's, a recipe's): kept as given when it is only tight (`plan`)
    layout_stated = micro_batch is not None and (tp is not None or pp is not None)
    from flopwise.catalog.hardware import get_hardware
    from flopwise.catalog.models import get_model
    from flopwise.plan.stacks import get_stack, spelled_fp8_recipe

    stack_spec = get_stack(stack or "flopwise")
    stack = stack_spec.name
    if stack != "flopwise" and framework == "fsdp":
        framework = stack_spec.framework  # a named stack brings its framework's conventions
    if allocator_reserve is None:
        allocator_reserve = stack_spec.allocator_reserve
    plain_bf16 = precision is None or spelled(precision) in ("bf16", "bfloat16")  # not "bf16-mixed", "amp_bf16"
    if precision is not None:
        precision, named_recipe = precision_and_recipe(precision)
        fp8_recipe = fp8_recipe if fp8_recipe is not None else named_recipe
    if fp8_recipe is not None:  # "Row-wise", "current scaling", "MXFP8": as a source prints it
        fp8_recipe = spelled_fp8_recipe(fp8_recipe)
    pure_bf16_default = finetune in stack_spec.pure_bf16 and plain_bf16
    if pure_bf16_default:  # torchtune's `dtype: bf16`: no AMP, the parameters themselves are bf16
        precision = "bf16-true"
    if finetune == "qlora" and stack_spec.fp32_params and precision in ("bf16", "fp16"):
        raise UserError(f"--stack {stack} quantizes a QLoRA base under pure 16-bit precision only (its mixed "
                        f"precision keeps fp32 parameters); plan --precision bf16-true")
    if precision == "fp8" and not stack_spec.fp8_training:
        raise UserError(f"--stack {stack} has no fp8 training recipe; plan it at --precision bf16 (or another stack)")

    precision = precision or EXAMPLE["precision"]
    tp_comm_overlap = tp_comm_overlap or (stack != "flopwise" and stack_spec.tp_comm_overlap and (tp or 1) > 1)
    stack_selective = None
    if recompute is not None:  # "activation checkpointing: yes" as a source states it
        recompute = RECOMPUTE_WORDS.get(recompute.strip().lower(), recompute.strip().lower())
        listed = recompute_modules.modules_in(recompute)  # "mla_up_proj/mlp/moe" as NeMo's tables list them
        if listed is not None:
            recompute = recompute_modules.spelled(listed)
        elif recompute.startswith(recompute_modules.PREFIX):
            raise UserError(recompute_modules.unknown_modules_message(recompute))
    if recompute == "selective" and stack_spec.selective_recompute != "selective":
        recompute = stack_spec.selective_recompute  # what "selective" means on this stack
        stack_selective = (f"recompute {recompute}: {stack}'s selective activation checkpointing as its configs "
                           f"run it (Megatron's attention-core recompute saves nothing under flash attention)")
    if sequence_parallel is None:  # what the stack's recipes run: NeMo / Megatron-Bridge and torchtitan shard with tp
        sequence_parallel = stack_spec.sequence_parallel and (tp or 1) > 1

    warnings: list[str] = []
    model_spec = get_model(model or EXAMPLE["model"])
    hw = hardware if hasattr(hardware, "peak_flops") else get_hardware(hardware or EXAMPLE["hardware"])
    tp = tp or 1
    pp = pp or 1
    cp = cp or 1
    for name, value in (("gpus", gpus), ("dp", dp), ("tp", tp), ("pp", pp), ("cp", cp), ("ep", ep),
                        ("micro-batch", micro_batch),
                        ("global-batch", global_batch), ("seq-len", seq_len)):
        if value is not None and value < 1:
            raise UserError(f"--{name} must be >= 1, got {value}")
    if dp is None:
        gpus = gpus or EXAMPLE["gpus"]
        if gpus % (tp * pp * cp):
            names, sizes = ("tp × pp × cp", f"{tp} × {pp} × {cp}") if cp > 1 else ("tp × pp", f"{tp} × {pp}")
            raise UserError(f"--gpus {gpus} is not divisible by {names} = {sizes}")
        dp = gpus // (tp * pp * cp)
    elif gpus is None:
        gpus = dp * tp * pp * cp
    if dp * tp * pp * cp != gpus:
        if cp > 1:
            raise UserError(f"dp × tp × pp × cp = {dp} × {tp} × {pp} × {cp} = {dp * tp * pp * cp}, but --gpus is {gpus}")
        raise UserError(f"dp × tp × pp = {dp} × {tp} × {pp} = {dp * tp * pp}, but --gpus is {gpus}")
    if not stack_spec.model_parallel and tp * pp > 1:
        raise UserError(f"--stack {stack} trains with data parallelism only (FSDP): drop --tp/--pp, or plan "
                        "tensor / pipeline parallelism with a stack that runs it (torchtitan, megatron-core)")
    if finetune == "qlora" and stack_spec.qlora_max_devices and gpus > stack_spec.qlora_max_devices:
        raise UserError(f"--stack {stack} runs a QLoRA on {stack_spec.qlora_max_devices} device only (its "
                        f"quantization refuses more); plan --gpus 1, or --stack flopwise to shard the QLoRA over "
                        f"{gpus} devices")
    stack_lora_recompute = None
    if recompute is None and finetune in ("lora", "qlora") and gpus > 1 and stack_spec.distributed_lora_recompute:
        recompute = stack_spec.distributed_lora_recompute  # as the stack's multi-device LoRA recipes run it
        stack_lora_recompute = f"recompute {recompute}: {stack} checkpoints every block of a LoRA on more than one device"

    cnn = model_spec.arch == "cnn"
    seq_defaulted = seq_len is None
    if seq_len is None:
        seq_len = EXAMPLE["seq_len"] if model is None else (model_spec.seq_len or 2048)
        if tuned_defaults and not cnn:  # as `flopwise train` windows a fine-tune (finetune_defaults)
            seq_len = min(seq_len, tuning.FINETUNE_SEQ_LEN_CAP)
    micro_batch = micro_batch or 1
    if global_batch is not None and batch_tokens is not None:
        raise UserError("give --global-batch (sequences) or --batch-tokens, not both")
    if grad_accum is not None:  # a table's GA column: dp x micro-batch x GA sequences per step
        if grad_accum < 1:
            raise UserError(f"--grad-accum must be >= 1, got {grad_accum}")
        if global_batch is None and batch_tokens is None:
            global_batch = dp * micro_batch * grad_accum
    if global_batch is None:
        if batch_tokens is None:
            batch_tokens = (EXAMPLE["batch_tokens"] if not tuned_defaults else tuning.DEFAULT_FINETUNE_BATCH_TOKENS
                            ) if not cnn else None
        if batch_tokens is None:
            global_batch = dp * micro_batch
        else:
            global_batch = max(1, round(parse_count(batch_tokens, "--batch-tokens") / seq_len))
    if grad_accum is not None and global_batch != dp * micro_batch * grad_accum:
        raise UserError(f"--grad-accum {grad_accum} gives dp x micro-batch x grad-accum = {dp} x {micro_batch} x "
                        f"{grad_accum} = {dp * micro_batch * grad_accum} sequences per step, but the global batch "
                        f"is {global_batch}")
    accum = max(1, math.ceil(global_batch / (dp * micro_batch)))
    if accum * dp * micro_batch != global_batch:
        warnings.append(f"global batch {global_batch} is not a multiple of dp × micro-batch = {dp * micro_batch}; "
                        f"planned {accum * dp * micro_batch} sequences per step")

    choose_zero = zero is None
    stack_default_zero = None
    if choose_zero and stack != "flopwise" and framework == "megatron" and stack_spec.distributed_optimizer \
            and dp > 1 and offload != "params":
        # the stack's recipes run the distributed optimizer (Megatron's ZeRO-1): plan what they run
        zero, choose_zero = 1, False
        stack_default_zero = f"zero 1: {stack}'s distributed optimizer (--use-distributed-optimizer), on in its recipes"
    elif choose_zero and stack_spec.zero_stage is not None and dp > 1 and offload != "params":
        zero, choose_zero = stack_spec.zero_stage, False
        stack_default_zero = f"zero {zero}: {stack} shards every multi-device run so (FSDP full sharding)"
    if zero is None:
        zero = 3 if offload == "params" else 0  # placeholder until `choose_zero_stage`
    total = parse_count(tokens if tokens is not None else tuning.default_tokens(
        finetune if finetune != "full" or not tuned_defaults else "full-finetune", EXAMPLE["tokens"]),
                        "--tokens")
    if schedule == "1f1b" and virtual_stages not in (None, 1):
        # Megatron's --virtual-pipeline-model-parallel-size alone selects its interleaved 1F1B
        schedule = "interleaved"
    if schedule == "interleaved":
        virtual_stages = virtual_stages or 2
    elif virtual_stages not in (None, 1):
        raise UserError(f"--virtual-stages {virtual_stages} needs --schedule interleaved (or 1f1b), not {schedule}")
    if recompute is not None and recompute.startswith(BLOCK_LAYERS) and not cnn:
        recompute = blocks_of_stage(recompute, model_spec.n_layers, pp * (virtual_stages or 1))

    extra: dict = {}
    if calibrate is not None:
        from flopwise.plan.calibration import load_run_calibration

        run = load_run_calibration(calibrate)
        if efficiency is None:
            efficiency = run.efficiency
            extra["efficiency_source"] = run.source
            extra["efficiency_confidence"] = "measured"
        if run.hardware not in (hw.key, hw.name) and run.hardware not in hw.aliases:
            warnings.append(f"--calibrate: run was measured on {run.hardware}, not {hw.key}; its MFU is used anyway")
    if pue <= 0:
        raise UserError(f"--pue must be > 0, got {pue}")
    if price_per_hour is not None and price_per_hour < 0:
        raise UserError(f"--price-per-hour must be >= 0, got {price_per_hour}")
    if nodes_per_rack < 1:
        raise UserError(f"--nodes-per-rack must be >= 1, got {nodes_per_rack}")
    if hw.memory_bytes and memory_reserve_gib * mem.GIB >= hw.memory_bytes:
        raise UserError(f"--memory-reserve-gib {memory_reserve_gib:g} leaves no usable memory on {hw.key} "
                        f"({hw.memory_bytes / mem.GIB:.1f} GiB)")
    if precision == "bf16-true" or (precision == "fp8" and "full" in stack_spec.pure_bf16):
        warnings.append(mem.BF16_TRUE_TRADE_OFF)  # torchtune's fp8 swaps the linears of a pure-bf16 model
    given_lora = [flag for flag, key in (("--lora-rank", "lora_rank"), ("--lora-targets", "lora_targets"),
                                         ("--lora-dropout", "lora_dropout")) if options[key] is not None]
    if given_lora and finetune == "full":
        warnings.append(f"{', '.join(given_lora)} appl{'ies' if len(given_lora) == 1 else 'y'} to adapters only: "
                        f"this plan trains every weight and ignores {'it' if len(given_lora) == 1 else 'them'} "
                        "(add --finetune lora or qlora)")
    if options["fp8_recipe"] is not None and precision != "fp8":
        warnings.append(f"--fp8-recipe {fp8_recipe} applies to fp8 GEMMs only: this plan is "
                        f"{precision} and ignores it (add --precision fp8)")
    extra["warnings"] = tuple(warnings)
    if recompute is not None:  # a stated policy is planned as given: no stack recompute added to fit
        extra["recompute_stated"] = True
    if layout_stated:
        extra["layout_stated"] = True
    # the expected job with hardware interruptions (plan/interruptions.py) reads these; unset, its defaults
    for key, value in (("interruptions_per_device_day", interruptions_per_device_day),
                       ("restart_seconds", restart_seconds), ("host_copy_gbps", host_copy_gbps)):
        if value is not None:
            extra[key] = value
    if stack_default_zero:
        extra["defaults"] = (stack_default_zero,)
    if stack_selective:
        extra["defaults"] = (*extra.get("defaults", ()), stack_selective)
    if pure_bf16_default:
        extra["defaults"] = (*extra.get("defaults", ()), f"bf16-true: {stack} trains in pure bf16 (no fp32 master "
                                                         "copy); --precision bf16-mixed plans AMP, fp32 full precision")
    if lora_dropout is None:  # the stack's LoRA recipes' own (litgpt: 0.05)
        lora_dropout = stack_spec.lora_dropout
        if finetune in ("lora", "qlora") and lora_dropout:
            extra["defaults"] = (*extra.get("defaults", ()), f"lora dropout {lora_dropout:g}: {stack}'s LoRA default")
    if stack_lora_recompute:
        extra["defaults"] = (*extra.get("defaults", ()), stack_lora_recompute)
    if lora_targets is None:  # the stack's own LoRA targets (torchtune: q, v, o and the MLP), else every linear
        lora_targets = stack_spec.lora_targets
        if finetune in ("lora", "qlora") and lora_targets != "all-linear":
            extra["defaults"] = (*extra.get("defaults", ()), f"lora targets {lora_targets}: {stack}'s LoRA default")
    if lora_rank is None:  # the stack's own LoRA default (NeMo: 32), else flopwise's
        lora_rank = stack_spec.lora_rank if stack != "flopwise" else tuning.DEFAULT_LORA_RANK
        if finetune in ("lora", "qlora") and lora_rank != tuning.DEFAULT_LORA_RANK:
            extra["defaults"] = (*extra.get("defaults", ()), f"lora rank {lora_rank}: {stack}'s LoRA default")
    amp = _amp_params(fp32_params, stack_spec, framework, precision, finetune)
    if amp and fp32_params is None:
        extra["defaults"] = (*extra.get("defaults", ()), f"{mem.AMP_STATE_BYTES_NOTE}: {stack}'s 16-bit training "
                                                         "is AMP (torch.autocast)")
    if dropout is None:  # the stack's models' own (flash-attn's GPT configs: 0.1)
        dropout = stack_spec.dropout
        if dropout:
            extra["defaults"] = (*extra.get("defaults", ()), f"dropout on: {stack}'s models train with it "
                                                             "(--no-dropout plans without)")
    if grad_reduce is not None:  # the data-parallel gradient reduction's dtype, as the run states it
        extra["grad_reduce"] = spelled_grad_reduce(grad_reduce)
    if stack != "flopwise":
        extra["fp8_recipe"] = fp8_recipe or stack_spec.fp8_recipe
    elif fp8_recipe is not None:
        extra["fp8_recipe"] = fp8_recipe
    if tuned_defaults:
        extra["defaults"] = (*extra.get("defaults", ()),
                             *tuning.default_notes(tokens is None,
                                                   options["batch_tokens"] is None and options["global_batch"] is None,
                                                   seq_len if seq_defaulted and not cnn else None))

    # how MoE tokens reach their experts: as asked, or as the stack's recipes dispatch this model on this device
    from flopwise.plan.expert_comm import spelled_dispatcher, stack_moe_defaults
    from flopwise.plan.gemm import curve_for

    family = curve_for(hw).family
    dispatcher, shared_overlap, dispatcher_reason = stack_moe_defaults(
        stack_spec, model_spec, family, None if moe_dispatcher is None else spelled_dispatcher(moe_dispatcher))
    if ep and ep > 1 and model_spec.n_experts > 1:
        if dispatcher_reason:
            extra["defaults"] = (*extra.get("defaults", ()), dispatcher_reason)
        if shared_overlap:
            extra["defaults"] = (*extra.get("defaults", ()),
                                 f"shared expert overlapped: {stack}'s recipes run it beside the {dispatcher} "
                                 "dispatch and combine (moe_shared_expert_overlap)")
        if dispatcher == "deepep" and family not in ("ampere", "hopper"):
            extra["warnings"] = (*extra["warnings"], f"--moe-dispatcher deepep: DeepEP's kernels run on Ampere and "
                                 f"Hopper GPUs; planned on {hw.key} at its H800 rates scaled to this device's links")
    if ep and ep > 1 and etp is None and tp > 1 and (dp * cp) % ep and (dp * cp * tp) % ep == 0:
        # the only layout that runs: Megatron-Core's MoE parallel folding, as NeMo's MoE recipes set it
        etp = 1
        extra["defaults"] = (*extra.get("defaults", ()),
                             f"etp 1: --ep {ep} spans the tensor-parallel ranks (dp x cp = {dp * cp}), so the experts "
                             "fold: each rank holds whole experts (Megatron-Core --expert-tensor-parallel-size 1)")
    split_note = None if cnn else end_slots_note(model_spec.n_layers, pp, virtual_stages or 1, stack)
    if split_note:  # an end of the model takes a decoder layer's place in the pipeline split
        extra["defaults"] = (*extra.get("defaults", ()), split_note)
    layout = Layout(
        dp=dp, tp=tp, pp=pp, micro_batch_size=micro_batch, grad_accum=accum, zero_stage=zero,
        sequence_parallel=sequence_parallel, recompute=recompute or "none", offload=offload,
        pipeline_schedule=schedule, virtual_stages=virtual_stages or 1, flash_attention=flash_attention,
        compiled=compiled, cp=cp, ep=ep or 1, etp=0 if etp is None or etp == tp else etp,
        moe_dispatcher=dispatcher, moe_shared_expert_overlap=shared_overlap,
        fsdp_sync_every_micro_step=fsdp_sync_every_micro_step,
        tp_comm_overlap=tp_comm_overlap, fsdp_unit_mb=fsdp_unit_mb,
        framework=framework, offload_activations=activation_offload.parse_blocks(offload_activations),
    )
    workload = Workload(
        precision=precision, optimizer=optimizer or EXAMPLE["optimizer"],
        seq_len=seq_len, total_tokens=0.0 if cnn else total, total_samples=total if cnn else 0.0,
        dropout=dropout, finetune=finetune, lora_rank=lora_rank, lora_targets=lora_targets, lora_dropout=lora_dropout,
        fp32_params=amp if fp32_params is not None else None,
    )
    cluster = Cluster(
        hardware=hw, devices_per_node=devices_per_node, efficiency=efficiency,
        price_per_device_hour=price_per_hour, pue=pue, memory_reserve_gib=memory_reserve_gib,
        allocator_reserve=allocator_reserve, nodes_per_rack=nodes_per_rack, extra=extra,
    )
    spec = RunSpec(model_spec, layout, workload, cluster, stack=stack)
    validate(spec)
    if choose_zero and dp > 1 and offload != "params":
        spec = with_chosen_zero(spec, profile)
    if recompute is None and finetune != "full":
        spec = tuning.recompute_if_needed(spec, lambda s: _evaluate(s, profile), choose_zero and dp > 1
                                          and offload != "params", lambda s: with_chosen_zero(s, profile))
    if (choose_zero or stack_default_zero) and options["tp"] is None and options["pp"] is None \
            and options["dp"] is None and not cnn and stack_spec.model_parallel:
        spec = _split_if_needed(spec, options)
    return spec


def _split_if_needed(spec: RunSpec, options: dict) -> RunSpec:
    """When the job fits on no ZeRO stage with tp = pp = 1 and no layout option was given
    (dp, tp, pp, zero), the fastest
    (tp, pp) that fits: TP within a node (with sequence parallelism, Korthikanti et al. 2022),
    then pipeline stages; ties go to the smaller model-parallel size."""
    profile = options.get("profile")
    if _evaluate(spec, profile).fits:
        return spec
    hw, model = spec.cluster.hardware, spec.model
    per_node = spec.cluster.devices_per_node or hw.devices_per_node or 8
    gpus = spec.layout.devices
    best = None
    for tp in (1, 2, 4, 8):
        if tp > per_node or gpus % tp or model.n_heads % tp:
            continue
        for pp in (1, 2, 4, 8, 16, 32):
            if (tp, pp) == (1, 1) or (gpus // tp) % pp or pp > model.n_layers:
                continue
            try:
                candidate = build_runspec(**{**options, "tp": tp, "pp": pp,
                                             "sequence_parallel": options["sequence_parallel"] is not False and tp > 1})
            except UserError:
                continue
            result = _evaluate(candidate, profile)
            if result.fits and (best is None or result.time.step_seconds < best[1] * (1 - TIME_TIE)):
                best = (candidate, result.time.step_seconds)
    if best is None:
        return spec
    chosen = best[0]
    lay = chosen.layout
    reason = (f"tp {lay.tp}, pp {lay.pp}: the fastest split that fits (with tp = pp = 1 no ZeRO stage fits)")
    defaults = (*chosen.cluster.extra.get("defaults", ()), reason)
    return dataclasses.replace(chosen, cluster=dataclasses.replace(
        chosen.cluster, extra={**chosen.cluster.extra, "defaults": defaults}))


ZERO_STAGES = {"fsdp": (0, 2, 3), "megatron": (0, 1), "deepspeed": (0, 1, 2, 3)}
"""ZeRO stages each framework offers: FSDP NO_SHARD / SHARD_GRAD_OP / FULL_SHARD; Megatron's
distributed optimizer; DeepSpeed ZeRO 0-3."""
TIME_TIE = 0.01
"""Step times within 1 % count as equal (below the time model's resolution)."""
TIE_ORDER = (1, 2, 0, 3)
"""Among equally fast stages: ZeRO-1/2 first (the same bytes as an all-reduce for less
memory, Rajbhandari et al. 2020 §7.2.1), then none, ZeRO-3 last (its per-layer gathers
cost latency the time model may not see)."""


def with_chosen_zero(spec: RunSpec, profile: GemmProfile | None = None) -> RunSpec:
    """`spec` at the ZeRO stage `choose_zero_stage` picks, the reason kept in `cluster.extra["defaults"]`
    (replacing an earlier choice's reason, e.g. one made before a `--profile` was read)."""
    stage, reason = choose_zero_stage(spec, profile)
    defaults = tuple(d for d in spec.cluster.extra.get("defaults", ()) if not d.startswith("zero "))
    cluster = dataclasses.replace(spec.cluster, extra={**spec.cluster.extra, "defaults": (reason, *defaults)})
    return dataclasses.replace(spec, layout=dataclasses.replace(spec.layout, zero_stage=stage), cluster=cluster)


def choose_zero_stage(spec: RunSpec, profile: GemmProfile | None = None) -> tuple[int, str]:
    """The ZeRO stage a careful engineer would pick, and why, in one line.

    Each stage the framework offers is planned with `plan()`'s own models (and the measured
    device profile, when one is given); among those that fit with room for the memory forecast's
    own error (`band.memory_band`: a stage that fits by less could run out of memory on the card),
    or among all that fit when none has that room, the fastest step wins and, within 1 % of it,
    the first in `TIE_ORDER`. When none fits, the most sharded stage, whose advice then says what
    else to change.
    """
    from flopwise.plan.band import memory_band

    results = {}
    for stage in ZERO_STAGES[spec.layout.framework]:
        layout = dataclasses.replace(spec.layout, zero_stage=stage)
        results[stage] = _evaluate(dataclasses.replace(spec, layout=layout), profile)
    fitting = {z: r for z, r in results.items() if r.fits}
    if not fitting:
        stage = max(results)
        return stage, f"zero {stage}: no ZeRO stage fits; the most sharded one is planned"
    band = memory_band()
    roomy = {z: r for z, r in fitting.items() if r.memory.allocated_bytes <= (1 - band) * r.memory.capacity_bytes}
    crowded = set(fitting) - set(roomy) if roomy else set()
    fitting = roomy or fitting
    fastest = min(r.time.step_seconds for r in fitting.values())
    equal = [z for z, r in fitting.items() if r.time.step_seconds <= fastest * (1 + TIME_TIE)]
    stage = min(equal, key=TIE_ORDER.index)
    chosen = fitting[stage]
    spare = (chosen.memory.capacity_bytes - chosen.memory.allocated_bytes) / GIB
    reason = f"zero {stage}: fits with {spare:.0f} GiB to spare"
    others = []
    for z, r in sorted(results.items()):
        if z == stage:
            continue
        if not r.fits:
            others.append(f"zero {z} does not fit")
        elif z in crowded:
            others.append(f"zero {z} fits with {(r.memory.capacity_bytes - r.memory.allocated_bytes) / GIB:.1f} GiB "
                          f"to spare, inside the memory forecast's ± {band:.0%}")
        elif r.time.step_seconds > chosen.time.step_seconds * (1 + TIME_TIE):
            others.append(f"zero {z} would cost {r.time.step_seconds / chosen.time.step_seconds - 1:.0%} more time")
        else:
            others.append(f"zero {z} is as fast with {(r.memory.capacity_bytes - r.memory.allocated_bytes) / GIB:.0f} GiB to spare")
    return stage, "; ".join([reason, *others])
