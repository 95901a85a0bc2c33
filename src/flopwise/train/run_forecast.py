"""What the trainer says before step 1: the planner's forecast in one line, and a warning when a
config written for GPUs is about to run on a CPU.

The figures are the plan the trainer already made for this run and device (`prediction.prepare`,
written to `plan.json`); nothing is planned twice.
"""

from __future__ import annotations

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


def forecast_line(plan: dict | None, hardware_name: str) -> str | None:
    """`forecast: step 0.31 s, run 52 min (10,000 steps); memory 18.2 of 21.5 GiB per device: fits`; None
    without a plan."""
    if not plan:
        return None
    time, memory = plan.get("time") or {}, plan.get("memory") or {}
    step, total, steps = time.get("step_seconds"), time.get("total_seconds"), time.get("steps")
    need, capacity = memory.get("total_bytes"), memory.get("capacity_bytes")
    if step is None or need is None:
        return None
    parts = [f"forecast on {hardware_name}: step {step:.3g} s"]
    if total is not None and steps:
        parts[0] += f", run {_duration(total)} ({int(steps):,} steps)"
    fits = plan.get("fits", memory.get("fits"))
    verdict = "fits" if fits else "DOES NOT FIT"
    room = f" of {capacity / GIB:,.1f}" if capacity else ""
    parts.append(f"memory {need / GIB:,.2f}{room} GiB per device: {verdict}")
    band = (plan.get("band") or {}).get("expected_error")
    if band:
        parts.append(f"expected error ±{100 * band:.0f} %")
    return "; ".join(parts)


def gpu_config_on_cpu(cfg, device_type: str, plan: dict | None) -> str | None:
    """A warning when this run is on a CPU but its config reads as written for GPUs; None otherwise."""
    if device_type != "cpu":
        return None
    reasons = []
    if cfg.parallel.backend == "nccl":
        reasons.append("parallel.backend=nccl")
    if cfg.precision.mode != "fp32":
        reasons.append(f"precision.mode={cfg.precision.mode} (16-bit matmuls are emulated on most CPUs)")
    if cfg.training.compile:
        reasons.append("training.compile=true")
    total = ((plan or {}).get("time") or {}).get("total_seconds")
    if total is not None and total > LONG_CPU_RUN_SECONDS:
        reasons.append(f"a forecast of {_duration(total)}")
    if not reasons:
        return None
    return ("warning: no GPU found; this run goes on the CPU, but its config looks written for GPUs: "
            + ", ".join(reasons) + " (set CUDA_VISIBLE_DEVICES or install a CUDA torch build to use a GPU)")
