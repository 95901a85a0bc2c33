"""Predicted vs measured: the planner's forecast for this very run, and the comparison at the end.

Before step 1 the run plans itself (a typed `Plan` for the same model, layout, precision and
device, kept in the `Forecast`; `runrecord.write_plan` serialises it once, as `plan.json`). At
the end `compare` (pure) puts it beside what was measured, and the run writes and prints
`predicted_vs_measured.json`: memory per component, tokens/s and MFU, side by side.

The device and its peak FLOP/s (MFU's denominator) come from `measure/device_peak.py`.

The prediction uses the device profile of the device the run is on (`flopwise
calibrate`'s cache, or a quick profile measured by all ranks on first use and cached), so
predicted and measured throughput come from the same machine; the record names it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from flopwise.measure.calibrate import machine_load
from flopwise.measure.device_peak import device_name, device_profile, detect_hardware
from flopwise.plan.from_config import planned_config
from flopwise.plan.planner import Plan, plan
from flopwise.config.resolve import ResolvedRun
from flopwise.runrecord.records import MEMORY_COMPONENTS, Comparison, write_plan
from flopwise.config.schema import RunConfig
from flopwise.train.parallel.distributed import DistEnv, all_reduce_mean

# What the CPU measurement counts per rank (`metrics.measure_memory`); the plan's `other` is not among them.
COUNTED_COMPONENTS = ("weights", "gradients", "optimizer", "activations")


@dataclass
class Forecast:
    """What the planner expects for this run, and the peak that MFU divides by."""

    plan: Plan | None  # the planner's own value; serialised once, into plan.json (runrecord.write_plan)
    hardware_key: str
    hardware_name: str
    peak_flops: float | None  # per device, in the run's compute dtype
    peak_source: str
    flops_per_token: float | None  # model FLOPs (forward + backward), as the planner counts them
    world_size: int
    notes: list[str] = field(default_factory=list)
    profile: dict | None = None  # which device profile the prediction used: path, sha256, cache or measured, load
    load_at_start: float | None = None  # the machine's 1-minute load before step 1

    def mfu(self, tokens_per_second: float) -> float | None:
        """Model FLOPs utilisation (Chowdhery et al. 2022, PaLM, App. B): achieved / (devices x peak)."""
        if not self.peak_flops or not self.flops_per_token or not tokens_per_second:
            return None
        return self.flops_per_token * tokens_per_second / (self.world_size * self.peak_flops)


def compare(forecast: Forecast, measured: dict) -> Comparison:
    """The predicted-vs-measured record; `measured.mfu` / `measured.hardware` feed `plan --calibrate`.

    Pure: the forecast made before step 1 and this run's measurements in, the record out.
    """
    predicted_memory = _planned_memory(forecast.plan)
    measured_memory = {
        "weights": measured["parameters"],
        "gradients": measured["gradients"],
        "optimizer": measured["optimizer"],
        "activations": measured["activations"],
    }
    host_predicted = (forecast.plan.memory.cpu_offload_bytes if forecast.plan is not None else 0.0) or 0.0
    if host_predicted:
        # FSDP2's CPUOffloadPolicy keeps parameter shards, their gradients and the optimizer
        # state in host memory: the model states the run counted are host-resident bytes
        # (on a CPU run host and "device" are one memory, so the policy, not the address, places them)
        predicted_memory["host_offload"] = host_predicted
        measured_memory["host_offload"] = sum(measured_memory.pop(k) for k in ("weights", "gradients", "optimizer"))
        measured_memory.update(weights=0, gradients=0, optimizer=0)
    measured_memory["total"] = sum(v for k, v in measured_memory.items() if k != "host_offload")
    measured_memory["counted_total"] = measured_memory["total"]  # named as on the predicted side, for readers
    # `other` (FSDP's gathered units, DDP buckets, a pipeline stage's gathered copy) lives only
    # around collectives and is not counted on CPU: the totals compare the counted components
    predicted_memory["counted_total"] = sum(predicted_memory.get(k) or 0.0 for k in COUNTED_COMPONENTS)
    if measured.get("cuda_peak_allocated") is not None:
        measured_memory["cuda_peak_allocated"] = measured["cuda_peak_allocated"]
    plan_time = forecast.plan.time if forecast.plan is not None else None
    predicted = {
        "memory_bytes": predicted_memory,
        "tokens_per_second": _planned_time(plan_time, "tokens_per_second"),
        "step_seconds": _planned_time(plan_time, "step_seconds"),
        "mfu": _planned_time(plan_time, "mfu"),
    }
    measured_out = {
        "memory_bytes": measured_memory,
        "tokens_per_second": measured["tokens_per_second"],
        "step_seconds": measured["step_seconds"],
        "mfu": forecast.mfu(measured["tokens_per_second"]),
        "hardware": forecast.hardware_key,
        "final_train_loss": measured.get("final_train_loss"),
        "val_losses": [{"step": s, "loss": v} for s, v in measured.get("val_losses", [])],
        "steps": measured.get("steps"),
    }
    if measured.get("machine_load") is not None:  # so `diagnose` can tell a busy machine from a wrong model
        measured_out["machine_load"] = {"start": forecast.load_at_start, **measured["machine_load"]}
    ratio = {}
    for key in MEMORY_COMPONENTS:
        predicted_key = "counted_total" if key == "total" else key
        ratio[f"memory_{key}"] = _memory_ratio(measured_memory.get(key), predicted_memory.get(predicted_key))
    if host_predicted:
        ratio["memory_host_offload"] = _ratio(measured_memory["host_offload"], host_predicted)
    ratio["tokens_per_second"] = _ratio(measured_out["tokens_per_second"], predicted["tokens_per_second"])
    ratio["mfu"] = _ratio(measured_out["mfu"], predicted["mfu"])
    if measured.get("comm_bytes") is not None:  # one metered step (`train/parallel/comm_volume.py`)
        planned = forecast.plan.comm if forecast.plan is not None else None
        predicted["comm_bytes_per_step"] = {dim: getattr(planned, f"{dim}_bytes", None) for dim in ("dp", "tp", "pp")}
        measured_out["comm_bytes_per_step"] = {dim: sum(kinds.values())
                                               for dim, kinds in measured["comm_bytes"].items()}
        measured_out["comm_bytes_by_kind"] = measured["comm_bytes"]
        for dim in ("dp", "tp", "pp"):
            ratio[f"comm_{dim}"] = _memory_ratio(measured_out["comm_bytes_per_step"].get(dim, 0.0),
                                                 predicted["comm_bytes_per_step"][dim] or 0.0)
    if measured.get("bubble_fraction") is not None:  # pipelines: idle share of a pass, mean over ranks
        predicted["bubble_fraction"] = _planned_time(plan_time, "bubble_fraction")
        measured_out["bubble_fraction"] = measured["bubble_fraction"]
        ratio["bubble_fraction"] = _ratio(measured["bubble_fraction"], predicted["bubble_fraction"])
    return Comparison(
        hardware={
            "key": forecast.hardware_key,
            "name": forecast.hardware_name,
            "peak_flops": forecast.peak_flops,
            "peak_source": forecast.peak_source,
            "devices": forecast.world_size,
        },
        predicted=predicted,
        measured=measured_out,
        measured_over_predicted=ratio,
        profile=forecast.profile,
        notes=list(forecast.notes) + [
            "memory is per device (rank), in bytes; measured on CPU = exact tensor bytes of this rank's "
            "parameters, gradients, optimizer state and tensors saved for backward (largest rank)",
            "comm bytes are what each rank sends per optimizer step (ring model: all-reduce 2(n-1)/n, "
            "all-gather and reduce-scatter (n-1)/n of the buffer, a pipeline send its size), counted on one "
            "step by dimension and collective kind; the largest rank",
            "memory_total compares the counted components (predicted counted_total = weights + gradients + "
            "optimizer + activations); the plan's `other` (gathered FSDP units, buckets) is not counted on CPU",
            "tokens_per_second uses the median step time after the first 20% of steps, slowest rank",
            "measured activations are the peak bytes of tensors saved for backward alive at once (logits "
            "included; a pipeline's in-flight micro-batches, not all of a pass's)",
        ] + ([RECOMPUTE_NOTE] if _recomputes(forecast.plan) else []),
    )


RECOMPUTE_NOTE = ("with recompute (activation checkpointing) the planner also counts one layer's recomputed "
                  "activations, which exist only during its backward, inside the checkpointed region the meter "
                  "does not see: measured activations read below the prediction")
RECOMPUTE_FOOTNOTE = ("† activation checkpointing: the planner also counts the activations a block recomputes "
                      "during its backward, which the measurement leaves out, so measured reads below predicted")


def _recomputes(plan: Plan | None) -> bool:
    """Whether the planned run recomputes activations (any policy but `none`)."""
    return plan is not None and plan.spec.layout.recompute != "none"


def prepare(cfg: RunConfig, run: ResolvedRun, vocab_size: int, env: DistEnv) -> Forecast:
    """Find the device peak, plan the run, and write `plan.json` (rank 0) before the first step.

    The plan's inputs come from `plan.from_config.planned_config`, the same function
    `flopwise plan --config` uses, so the two predictions agree for the same config; the
    time model uses this device's measured profile (`flopwise calibrate`).
    """
    dtype = run.precision.compute_dtype
    planned = planned_config(cfg, run, vocab_size)
    notes = list(planned.notes)
    profile, profile_record = device_profile(env.device, dtype, notes)
    hardware, peak_source, reason = detect_hardware(env.device, dtype, env.world_size,
                                                    lambda values: all_reduce_mean(values, env), profile)
    spec = planned.model
    planned_run, plan_error = None, None
    if hardware is None:
        plan_error = f"no prediction: {reason}"
    else:
        try:
            planned_run = plan(planned.on(hardware), profile=profile)
        except Exception as err:  # a forecast that fails must not stop the training run
            plan_error = f"no prediction: the planner could not plan this run ({err.__class__.__name__}: {err})"
    if plan_error:
        notes.append(plan_error)
    peak = hardware.peak_flops(dtype) if hardware is not None else None
    if hardware is not None and peak is None:
        reason = f"the catalog has no {dtype} peak for {hardware.name}"
    if reason:
        notes.append(f"no MFU: {reason}")
    flops_per_token = planned_flops_per_token(planned_run) or model_flops_per_token(spec)
    forecast = Forecast(
        plan=planned_run,
        hardware_key=hardware.key if hardware is not None else "unknown",
        hardware_name=hardware.name if hardware is not None else device_name(env.device),
        peak_flops=peak,
        peak_source=peak_source,
        flops_per_token=flops_per_token,
        world_size=env.world_size,
        notes=notes,
        profile=profile_record,
        load_at_start=machine_load(),
    )
    if env.is_main:
        write_plan(cfg.logging.run_dir, planned_run, plan_error)
    return forecast


def model_flops_per_token(spec) -> float:
    """Fallback when the planner is unavailable: 6N + 12·L·s·h (PaLM, Chowdhery et al. 2022, App. B)."""
    h, L, s = spec.hidden, spec.n_layers, spec.seq_len
    kv = spec.n_kv_heads or spec.n_heads
    head_dim = spec.head_dim or h // max(1, spec.n_heads)
    attn = h * spec.n_heads * head_dim * 2 + h * kv * head_dim * 2
    mlp = (3 if spec.mlp == "swiglu" else 2) * h * spec.ffn_hidden
    n = L * (attn + mlp) + spec.vocab_size * h
    return 6.0 * n + 12.0 * L * s * h


# ------------------------------------------------------------------------- output


def _planned_memory(plan: Plan | None) -> dict:
    """The plan's per-device memory in the trainer's components (`MemoryEstimate.per_device_bytes`):
    optimizer = optimizer states + fp32 master weights; activations = per-layer activations +
    logits (the measured saved tensors include the loss's logits)."""
    return plan.memory.per_device_bytes() if plan is not None else {}


def _planned_time(time, name: str) -> float | None:
    """A figure of the plan's time estimate; None without a plan, or where it is infinite (as plan.json writes it)."""
    value = getattr(time, name, None) if time is not None else None
    return None if value is None or (isinstance(value, float) and math.isinf(value)) else value


def planned_flops_per_token(plan: Plan | None) -> float | None:
    """Model FLOPs per token, as the planner counts them (None without a plan)."""
    if plan is None or not plan.flops.model_per_unit:
        return None
    return float(plan.flops.model_per_unit)


def _memory_ratio(measured, predicted) -> float | None:
    """measured / predicted bytes; 1.0 when both are zero (nothing, as planned: an offloaded state, a size-1 dimension)."""
    if measured == 0 and predicted == 0:
        return 1.0
    return _ratio(measured, predicted)


def _ratio(measured, predicted) -> float | None:
    if measured is None or not predicted:
        return None
    return measured / predicted


def format_comparison(comparison: Comparison) -> str:
    """A small predicted-vs-measured table for the terminal."""
    from io import StringIO

    from rich.console import Console
    from rich.table import Table

    hw = comparison.hardware
    table = Table(title=f"predicted vs measured ({hw['name']}, {hw['devices']} device(s)): memory per device, "
                        "speed for the whole run")
    for column in ("", "predicted", "measured", "measured / predicted"):
        table.add_column(column, justify="right" if column else "left")
    pred, meas, ratio = comparison.predicted, comparison.measured, comparison.measured_over_predicted
    for key in MEMORY_COMPONENTS:
        planned = pred["memory_bytes"].get(key)
        label = f"memory: {key}"
        if key == "total" and "counted_total" in pred["memory_bytes"]:  # what the ratio compares
            planned, label = pred["memory_bytes"]["counted_total"], "memory: total (counted)"
        if key == "activations" and RECOMPUTE_NOTE in comparison.notes:
            label += " †"
        table.add_row(label, _mib(planned), _mib(meas["memory_bytes"].get(key)),
                      _num(ratio.get(f"memory_{key}"), "{:.2f}"))
    other = pred["memory_bytes"].get("other")
    if other:
        table.add_row("memory: other (not counted)", _mib(other), "n/a", "n/a")
    if "host_offload" in pred["memory_bytes"]:
        table.add_row("memory: host (offloaded)", _mib(pred["memory_bytes"]["host_offload"]),
                      _mib(meas["memory_bytes"].get("host_offload")), _num(ratio.get("memory_host_offload"), "{:.2f}"))
    for dim, planned in (pred.get("comm_bytes_per_step") or {}).items():
        sent = (meas.get("comm_bytes_per_step") or {}).get(dim, 0.0)
        if planned or sent:
            table.add_row(f"sent per step: {dim}", _mib(planned), _mib(sent), _num(ratio.get(f"comm_{dim}"), "{:.2f}"))
    table.add_row("tokens/s *", _num(pred["tokens_per_second"], "{:,.0f}"), _num(meas["tokens_per_second"], "{:,.0f}"),
                  _num(ratio.get("tokens_per_second"), "{:.2f}"))
    table.add_row("MFU *", _num(pred["mfu"], "{:.1%}"), _num(meas["mfu"], "{:.1%}"), _num(ratio.get("mfu"), "{:.2f}"))
    buffer = StringIO()
    console = Console(file=buffer, width=100, force_terminal=False)
    console.print(table)
    console.print("* measured: all ranks' tokens per step / the slowest rank's median step time after the first "
                  "20% of steps (the progress bar shows single steps on rank 0, so it moves around this figure)")
    if RECOMPUTE_NOTE in comparison.notes:
        console.print(RECOMPUTE_FOOTNOTE)
    console.print(f"peak: {hw['peak_source']}")
    for note in comparison.notes:
        if note.startswith(("no MFU", "no prediction")):
            console.print(note)
    return buffer.getvalue().rstrip()


def _mib(value) -> str:
    return "n/a" if value is None else f"{value / 2**20:,.2f} MiB"


def _num(value, fmt: str) -> str:
    return "n/a" if value is None else fmt.format(value)
