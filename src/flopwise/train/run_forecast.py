"""What the trainer says before step 1: the planner's forecast in one line, and a warning when a
config written for GPUs is about to run on a CPU.

The figures are the plan the trainer already made for this run and device (`prediction.prepare`,
written to `plan.json`); nothing is planned twice.
"""

from __future__ import annotations

from flopwise.config.precision import Precision

GIB = 2**30
LONG_CPU_RUN_SECONDS = 3600.0  # a CPU run forecast to take longer than this was likely meant for GPUs


def _duration(seconds: float) -> str:
    """Seconds as the largest sensible unit: 42 s, 13 min, 5.2 h, 3.1 days."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def forecast_line(plan, hardware_name: str) -> str | None:
    """`forecast on H100: step 0.31 s, run 52 min (10,000 steps); memory 18.2 of 21.5 GiB per device: fits`
    from the run's typed `Plan`; None without a plan."""
    if plan is None:
        return None
    time, memory = plan.time, plan.memory
    parts = [f"forecast on {hardware_name}: step {time.step_seconds:.3g} s"]
    if time.steps:
        parts[0] += f", run {_duration(time.total_seconds)} ({int(time.steps):,} steps)"
    verdict = {"fits": "fits", "tight": f"TIGHT (within the memory forecast's ±{100 * memory.band:.0f} %: may not fit)",
               }.get(memory.verdict, "DOES NOT FIT")
    room = f" of {memory.capacity_bytes / GIB:,.1f}" if memory.capacity_bytes > 0 else ""
    parts.append(f"memory {memory.total_bytes / GIB:,.2f}{room} GiB per device: {verdict}")
    if plan.band is not None and plan.band.expected_error:
        parts.append(f"expected error ±{100 * plan.band.expected_error:.0f} %")
    return "; ".join(parts)


def gpu_config_on_cpu(cfg, precision: Precision, device_type: str, total_seconds: float | None) -> str | None:
    """A warning when this run is on a CPU but its config reads as written for GPUs (`precision`: the run's
    resolved one; `total_seconds`: the forecast run time, if any); None otherwise."""
    if device_type != "cpu":
        return None
    reasons = []
    if cfg.parallel.backend == "nccl":
        reasons.append("parallel.backend=nccl")
    if precision.compute_dtype != "fp32":
        reasons.append(f"precision.mode={precision.mode} (16-bit matmuls are emulated on most CPUs)")
    if cfg.training.compile:
        reasons.append("training.compile=true")
    if total_seconds is not None and total_seconds > LONG_CPU_RUN_SECONDS:
        reasons.append(f"a forecast of {_duration(total_seconds)}")
    if not reasons:
        return None
    return ("warning: no GPU found; this run goes on the CPU, but its config looks written for GPUs: "
            + ", ".join(reasons) + " (set CUDA_VISIBLE_DEVICES or install a CUDA torch build to use a GPU)")
