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

from flopwise.errors import UserError
from flopwise.plan import memory as mem
from flopwise.plan.calibration import efficiency_for
from flopwise.plan.comm import CommEstimate, estimate_comm
from flopwise.plan.cost import CostEstimate, EnergyEstimate, estimate_cost, estimate_energy
from flopwise.plan.flops import FlopsEstimate, estimate_flops
from flopwise.plan.params import ParamCount, count_params
from flopwise.plan.profile_efficiency import profile_efficiency
from flopwise.plan.spec import (
    OFFLOAD, OPTIMIZERS, PRECISIONS, RECOMPUTE, SCHEDULES, Cluster, Layout, RunSpec, Workload,
)
from flopwise.plan.timing import TimeEstimate, bubble_fraction, estimate_time

GIB = mem.GIB
EXAMPLE = {
    "model": "llama2-7b",
    "hardware": "h100-sxm",
    "gpus": 8,
    "precision": "bf16",
    "optimizer": "adamw",
    "zero": 3,
    "seq_len": 4096,
    "batch_tokens": 4 * 2**20,
    "tokens": 2e12,
}
"""The built-in example (`flopwise plan` with no options): Llama 2 7B on 8 × H100 SXM,
bf16, AdamW, ZeRO-3, sequences of 4096, 4M-token (2^22) batches, 2T tokens."""


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

    @property
    def fits(self) -> bool:
        """Whether the busiest device's memory fits its usable capacity."""
        return self.memory.fits

    def to_dict(self) -> dict:
        """JSON-able plan: the inputs, every section, warnings and advice."""
        params = {name: getattr(self.params, name) for name in self.params.__dataclass_fields__}
        params["per_layer"] = self.params.per_layer
        return {
            "inputs": runspec_to_dict(self.spec),
            "fits": self.fits,
            "params": params,
            "flops": self.flops.to_dict(),
            "memory": self.memory.to_dict(),
            "comm": self.comm.to_dict(),
            "time": self.time.to_dict(),
            "energy": self.energy.to_dict(),
            "cost": self.cost.to_dict(),
            "warnings": list(self.warnings),
            "advice": list(self.advice),
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
        "layout": layout,
        "workload": dataclasses.asdict(spec.workload),
        "cluster": cluster,
    }


# --------------------------------------------------------------------------- validation


def validate(spec: RunSpec) -> None:
    """Raise UserError for a RunSpec no real run could have."""
    lay, work, model = spec.layout, spec.workload, spec.model
    for name, value in (("dp", lay.dp), ("tp", lay.tp), ("pp", lay.pp), ("micro-batch", lay.micro_batch_size),
                        ("grad-accum", lay.grad_accum), ("virtual-stages", lay.virtual_stages)):
        if value < 1:
            raise UserError(f"--{name} must be >= 1, got {value}")
    _choice("precision", work.precision, PRECISIONS)
    _choice("optimizer", work.optimizer, OPTIMIZERS)
    _choice("recompute", lay.recompute, RECOMPUTE)
    _choice("offload", lay.offload, OFFLOAD)
    _choice("schedule", lay.pipeline_schedule, SCHEDULES)
    if lay.zero_stage not in (0, 1, 2, 3):
        raise UserError(f"--zero must be 0, 1, 2 or 3, got {lay.zero_stage}")
    if lay.offload == "params" and lay.zero_stage != 3:
        raise UserError("--offload params needs --zero 3 (parameters are offloaded as ZeRO-3 shards)")
    if model.arch != "cnn":
        if work.seq_len < 1:
            raise UserError(f"--seq-len must be >= 1, got {work.seq_len}")
        if model.n_heads % lay.tp:
            raise UserError(f"--tp {lay.tp} does not divide {model.key}'s {model.n_heads} attention heads")
        if lay.pp > model.n_layers:
            raise UserError(f"--pp {lay.pp} is more than {model.key}'s {model.n_layers} layers")
        if lay.pipeline_schedule == "interleaved" and model.n_layers % (lay.pp * lay.virtual_stages):
            raise UserError(
                f"interleaved schedule needs layers ({model.n_layers}) divisible by pp × virtual stages "
                f"({lay.pp} × {lay.virtual_stages})"
            )
    elif lay.tp > 1 or lay.pp > 1:
        raise UserError(f"{model.key} is a CNN: only data parallelism is planned (use --dp, not --tp/--pp)")
    hw = spec.cluster.hardware
    if hw.peak_flops(work.precision) is None:
        known = [d for d in PRECISIONS if hw.peak_flops(d) is not None]
        raise UserError(
            f"{hw.key} has no published {work.precision} peak; choose --precision from {', '.join(known) or 'none'}"
        )
    eff = spec.cluster.efficiency
    if eff is not None and not 0 < eff <= 1:
        raise UserError(f"--efficiency must be in (0, 1], got {eff}")


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise UserError(f"--{name} '{value}' is not one of {', '.join(allowed)}")


# --------------------------------------------------------------------------- the plan


def plan(spec: RunSpec, profile=None) -> Plan:
    """Predict parameters, FLOPs, memory, communication, time, energy and cost of a run.

    When the run does not fit, `advice` lists which single changes (ZeRO-3, recompute,
    offload, smaller micro-batch, more devices) make it fit, each computed by planning it.
    `profile`: a measured device profile (`flopwise.plan.profile.DeviceProfile`); the
    efficiency of the step's GEMMs then comes from it (unless --efficiency is given).
    """
    result = _evaluate(spec, profile)
    if result.fits:
        return result
    return dataclasses.replace(result, advice=_advice(spec, result))


def _evaluate(spec: RunSpec, profile=None) -> Plan:
    validate(spec)
    model, lay, work, cluster = spec.model, spec.layout, spec.workload, spec.cluster
    hw = cluster.hardware
    warnings: list[str] = list(cluster.extra.get("warnings", ()))
    pc = count_params(model)
    cnn = model.arch == "cnn"
    m = lay.grad_accum

    # FLOPs
    units_per_step = float(lay.global_batch_size) * (1 if cnn else work.seq_len)
    total_units = work.total_samples if cnn else work.total_tokens
    flops = estimate_flops(model, pc, work.seq_len, lay.recompute, total_units)

    # Memory
    memory = _memory(spec, pc, warnings)
    sb = mem.state_bytes(work.precision, work.optimizer)
    psi = pc.total / (lay.tp * lay.pp)
    e = mem.activation_dtype_bytes(work.precision)

    # Communication
    per_node = cluster.devices_per_node or hw.devices_per_node or 8
    message = 0.0 if cnn else work.seq_len * lay.micro_batch_size * model.hidden * e
    comm = estimate_comm(
        params_per_device=psi, grad_bytes=sb.grad, weight_bytes=sb.weight, zero_stage=lay.zero_stage,
        dp=lay.dp, tp=lay.tp, pp=lay.pp, micro_batches=m,
        layers_per_stage=(model.n_layers / lay.pp) if not cnn else 0.0,
        activation_message_bytes=message, recompute=lay.recompute, devices_per_node=per_node,
        scale_up_gbs=hw.scale_up_gbs, scale_out_gbs=hw.scale_out_gbs,
        virtual_stages=lay.virtual_stages if lay.pipeline_schedule == "interleaved" else 1,
    )
    if math.inf in (comm.dp_seconds, comm.tp_seconds, comm.pp_seconds):
        warnings.append(f"{hw.key}: link bandwidth unknown; that communication time is not counted")
        comm = dataclasses.replace(
            comm, **{k: 0.0 for k in ("dp_seconds", "tp_seconds", "pp_seconds") if getattr(comm, k) == math.inf}
        )

    # Time
    peak = hw.peak_flops(work.precision)
    if cluster.efficiency is not None:
        eff_value = cluster.efficiency
        eff_source = cluster.extra.get("efficiency_source", "--efficiency")
        eff_conf = cluster.extra.get("efficiency_confidence", "user")
    elif profile is not None and (cal := profile_efficiency(spec, profile, peak)) is not None:
        eff_value, eff_source, eff_conf = cal.value, cal.source, cal.confidence
    else:
        cal = efficiency_for(hw.key, work.precision)
        eff_value, eff_source, eff_conf = cal.value, cal.source, cal.confidence
        if eff_conf == "low":
            warnings.append(f"efficiency {eff_value:.0%} for {hw.key} {work.precision} is low-confidence ({eff_source})")
    time = estimate_time(
        model_flops_per_unit=flops.model_per_unit, hardware_flops_per_unit=flops.hardware_per_unit,
        units_per_step=units_per_step, total_units=total_units, devices=lay.devices, peak_flops=peak,
        efficiency=eff_value, efficiency_source=eff_source, efficiency_confidence=eff_conf,
        bubble=bubble_fraction(lay.pp, m, lay.pipeline_schedule, lay.virtual_stages), comm=comm,
    )
    if not total_units:
        warnings.append("no --tokens given: whole-job time, energy and cost are 0")

    energy = estimate_energy(time.device_hours, hw.tdp_w, cluster.pue)
    if energy.kwh is None:
        warnings.append(f"{hw.key} has no known power (TDP); energy not estimated")
    cost = estimate_cost(time.device_hours, hw, cluster.price_per_device_hour)
    return Plan(spec, pc, flops, memory, comm, time, energy, cost, tuple(warnings))


def plan_memory(spec: RunSpec, check: bool = True) -> mem.MemoryEstimate:
    """The memory part of `plan()` alone (same formulas), for searches that reject layouts
    which do not fit before timing them. `check=False` skips `validate` for callers that
    only build valid layouts."""
    if check:
        validate(spec)
    return _memory(spec, count_params(spec.model), [])


def _memory(spec: RunSpec, pc: ParamCount, warnings: list[str]) -> mem.MemoryEstimate:
    """Per-device memory of the busiest device and the fit verdict (appends warnings)."""
    lay, work, cluster = spec.layout, spec.workload, spec.cluster
    hw = cluster.hardware
    sb = mem.state_bytes(work.precision, work.optimizer)
    psi = pc.total / (lay.tp * lay.pp)
    states = mem.model_states(psi, sb, lay.zero_stage, lay.dp, lay.offload)
    e = mem.activation_dtype_bytes(work.precision)
    if spec.model.arch == "cnn":
        per_layer = inflight = activations = logits = 0.0
        warnings.append("CNN activation memory is not modelled; memory covers model states only")
    else:
        activations, logits, per_layer, inflight = _activation_memory(spec, e)
    buffers = mem.comm_buffer_bytes(pc, sb, lay.zero_stage, lay.dp, lay.tp, lay.offload)
    total = states.weights + states.gradients + states.optimizer_states + states.master_weights
    total += activations + logits + buffers
    device_bytes = hw.memory_bytes or 0.0
    capacity = device_bytes - cluster.memory_reserve_gib * GIB
    if not device_bytes:
        warnings.append(f"{hw.key} has no known memory size; the fit verdict assumes it does not fit")
    return mem.MemoryEstimate(
        states.weights, states.gradients, states.optimizer_states, states.master_weights,
        activations, logits, buffers, total, capacity, device_bytes, states.cpu_bytes,
        per_layer, inflight, bool(device_bytes) and total <= capacity,
    )


def _activation_memory(spec: RunSpec, e: float) -> tuple[float, float, float, float]:
    """(layer activations, embedding + logits, bytes per layer, in-flight layers) on the busiest stage."""
    model, lay, work = spec.model, spec.layout, spec.workload
    terms = mem.activation_terms(model, work.seq_len, lay.micro_batch_size, e, work.dropout, lay.flash_attention)
    per_layer = mem.activation_bytes_per_layer(terms, lay.tp, lay.sequence_parallel, lay.recompute)
    if lay.recompute == "full":
        # the layer being back-propagated is rebuilt whole for a moment
        rebuilt = mem.activation_bytes_per_layer(terms, lay.tp, lay.sequence_parallel, "none")
    else:
        rebuilt = 0.0
    sbh = float(work.seq_len) * lay.micro_batch_size * model.hidden
    embed = sbh * ((e / lay.tp if lay.sequence_parallel else e) + (1.0 if work.dropout else 0.0))
    head = 2 * terms.layer_input + mem.logits_bytes(work.seq_len, lay.micro_batch_size, model.vocab_size, e, lay.tp)
    inflight = mem.inflight_layer_factor(model.n_layers, lay.pp, lay.grad_accum, lay.pipeline_schedule,
                                         lay.virtual_stages)
    first = per_layer * inflight + rebuilt + embed
    if lay.pp == 1:
        return first, head, per_layer, inflight
    last_inflight = (model.n_layers / lay.pp) * (lay.grad_accum if lay.pipeline_schedule == "gpipe" else 1)
    last = per_layer * last_inflight + rebuilt
    if last + head > first:
        return last, head, per_layer, last_inflight
    return first, 0.0, per_layer, inflight


# --------------------------------------------------------------------------- advice


def _advice(spec: RunSpec, result: Plan) -> tuple[str, ...]:
    """Plan single changes (then a combination) and keep those that fit."""
    lay = spec.layout
    need = f"needs {result.memory.total_bytes / GIB:.1f} GiB of {result.memory.capacity_bytes / GIB:.1f} GiB usable per device"
    candidates: list[tuple[str, Layout]] = []
    if lay.zero_stage < 3 and lay.dp > 1:
        candidates.append(("--zero 3", dataclasses.replace(lay, zero_stage=3)))
    for mode in ("selective", "full"):
        if RECOMPUTE.index(mode) > RECOMPUTE.index(lay.recompute):
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
            alt = _evaluate(dataclasses.replace(spec, layout=layout))
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


def build_runspec(
    model: str | None = None,
    hardware: str | None = None,
    gpus: int | None = None,
    dp: int | None = None,
    tp: int | None = None,
    pp: int | None = None,
    micro_batch: int | None = None,
    global_batch: int | None = None,
    batch_tokens: str | float | None = None,
    seq_len: int | None = None,
    tokens: str | float | None = None,
    precision: str | None = None,
    optimizer: str | None = None,
    zero: int | None = None,
    recompute: str = "none",
    offload: str = "none",
    schedule: str = "1f1b",
    virtual_stages: int | None = None,
    sequence_parallel: bool = False,
    flash_attention: bool = True,
    dropout: bool = False,
    efficiency: float | None = None,
    price_per_hour: float | None = None,
    pue: float = 1.1,
    calibrate: str | None = None,
    memory_reserve_gib: float = 2.0,
    devices_per_node: int = 0,
) -> RunSpec:
    """Build a RunSpec from CLI-like options; anything left None takes the built-in example's value.

    Layout: unspecified dp is gpus/(tp·pp) (so with only --gpus, dp = gpus); gpus
    defaults to dp·tp·pp when dp is given, else 8. Unspecified ZeRO: 3 for pure data
    parallelism, 1 with TP/PP, 0 with one data-parallel rank. The global batch (sequences, or
    `batch_tokens`/seq_len) is split into micro-batches per data-parallel rank; if it does
    not divide, gradient accumulation rounds up and a warning says so.
    """
    from flopwise.catalog.hardware import get_hardware
    from flopwise.catalog.models import get_model

    warnings: list[str] = []
    model_spec = get_model(model or EXAMPLE["model"])
    hw = get_hardware(hardware or EXAMPLE["hardware"])
    tp = tp or 1
    pp = pp or 1
    for name, value in (("gpus", gpus), ("dp", dp), ("tp", tp), ("pp", pp), ("micro-batch", micro_batch),
                        ("global-batch", global_batch), ("seq-len", seq_len)):
        if value is not None and value < 1:
            raise UserError(f"--{name} must be >= 1, got {value}")
    if dp is None:
        gpus = gpus or EXAMPLE["gpus"]
        if gpus % (tp * pp):
            raise UserError(f"--gpus {gpus} is not divisible by tp × pp = {tp} × {pp}")
        dp = gpus // (tp * pp)
    elif gpus is None:
        gpus = dp * tp * pp
    if dp * tp * pp != gpus:
        raise UserError(f"dp × tp × pp = {dp} × {tp} × {pp} = {dp * tp * pp}, but --gpus is {gpus}")

    cnn = model_spec.arch == "cnn"
    if seq_len is None:
        seq_len = EXAMPLE["seq_len"] if model is None else (model_spec.seq_len or 2048)
    micro_batch = micro_batch or 1
    if global_batch is not None and batch_tokens is not None:
        raise UserError("give --global-batch (sequences) or --batch-tokens, not both")
    if global_batch is None:
        if batch_tokens is None:
            batch_tokens = EXAMPLE["batch_tokens"] if not cnn else None
        if batch_tokens is None:
            global_batch = dp * micro_batch
        else:
            global_batch = max(1, round(parse_count(batch_tokens, "--batch-tokens") / seq_len))
    accum = max(1, math.ceil(global_batch / (dp * micro_batch)))
    if accum * dp * micro_batch != global_batch:
        warnings.append(f"global batch {global_batch} is not a multiple of dp × micro-batch = {dp * micro_batch}; "
                        f"planned {accum * dp * micro_batch} sequences per step")

    if zero is None:
        # FSDP-style ZeRO-3 for pure data parallelism; with TP/PP, Megatron's distributed
        # optimizer (ZeRO-1), since ZeRO-3 would re-gather weights on every micro-batch.
        zero = 0 if dp == 1 else (EXAMPLE["zero"] if tp == pp == 1 else 1)
    total = parse_count(tokens if tokens is not None else EXAMPLE["tokens"], "--tokens")
    if schedule == "interleaved":
        virtual_stages = virtual_stages or 2
    elif virtual_stages not in (None, 1):
        raise UserError("--virtual-stages needs --schedule interleaved")

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
    extra["warnings"] = tuple(warnings)

    layout = Layout(
        dp=dp, tp=tp, pp=pp, micro_batch_size=micro_batch, grad_accum=accum, zero_stage=zero,
        sequence_parallel=sequence_parallel, recompute=recompute, offload=offload,
        pipeline_schedule=schedule, virtual_stages=virtual_stages or 1, flash_attention=flash_attention,
    )
    workload = Workload(
        precision=precision or EXAMPLE["precision"], optimizer=optimizer or EXAMPLE["optimizer"],
        seq_len=seq_len, total_tokens=0.0 if cnn else total, total_samples=total if cnn else 0.0,
        dropout=dropout,
    )
    cluster = Cluster(
        hardware=hw, devices_per_node=devices_per_node, efficiency=efficiency,
        price_per_device_hour=price_per_hour, pue=pue, memory_reserve_gib=memory_reserve_gib, extra=extra,
    )
    spec = RunSpec(model_spec, layout, workload, cluster)
    validate(spec)
    return spec
