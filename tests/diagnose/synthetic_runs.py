"""Synthetic run directories in the layout `flopwise train` writes, with injected problems.

Field names follow `flopwise.runrecord.records.StepRecord`: one JSON line per step per rank
in `metrics.rank<R>.jsonl`, memory as `memory_<component>_bytes`, non-finite values as
null. Noise comes from a seeded generator, so every run dir is the same each time.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import yaml

from flopwise.train.meter_schedule import MeterSchedule

TOKENS_PER_STEP = 4096


def write_run_dir(
    root: Path,
    *,
    ranks: int = 2,
    steps: int = 40,
    straggler: tuple[int, float] | None = None,
    data_share: dict[int, float] | None = None,
    stall: tuple[int, list[int], float] | None = None,
    nan_from: int | None = None,
    spike_at: int | None = None,
    slow_steps: list[int] | None = None,
    sync_wait: bool = True,
    measure_every: int = 1,
    val_every: int = 10,
    plan_step_seconds: float | None = 0.15,
    seed: int = 0,
    hardware: str = "cpu-measured",
    profile: dict | None = None,
    machine_load: dict | None = None,
) -> Path:
    """Write a run dir and return it.

    straggler=(rank, 0.35) makes that rank's compute 35% slower while the others wait for
    it at gradient sync; data_share={rank: 0.3} makes data wait that share of its steps;
    stall=(rank, steps, seconds) adds long data waits on those steps; slow_steps makes
    those steps slow on every rank (as checkpoint writes would). measure_every=k meters only the
    steps the trainer's `MeterSchedule` picks: the others carry no memory and no sync wait, and
    their wait is inside compute, as a real run's are.
    """
    meters = MeterSchedule(first_step=0, every=measure_every, max_steps=steps)
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    base_compute, base_opt, base_data = 0.100, 0.010, 0.004
    slow_rank, slow_by = straggler or (None, 0.0)
    for rank in range(ranks):
        lines = []
        for step in range(1, steps + 1):
            jitter = 1 + rng.uniform(-0.03, 0.03)
            compute = base_compute * jitter * (1 + slow_by if rank == slow_rank else 1)
            slowest = base_compute * (1 + slow_by)
            wait = max(0.0, slowest - compute) + 0.001 if sync_wait else None
            data = base_data * (1 + rng.uniform(-0.1, 0.1))
            if data_share and rank in data_share:
                share = data_share[rank]
                data = share / (1 - share) * (compute + base_opt)
            if stall and rank == stall[0] and step in stall[1]:
                data = stall[2]
            if slow_steps and step in slow_steps:
                compute *= 3
            if step == 1:
                compute *= 4  # warm-up
            opt = base_opt * jitter
            step_seconds = data + compute + opt + (wait or 0.0)
            loss = 8.0 * math.exp(-step / 25) + 2.0 + rng.uniform(-0.02, 0.02)
            if spike_at is not None and step == spike_at:
                loss *= 2.5
            if nan_from is not None and step >= nan_from:
                loss = None
            record = {
                "step": step,
                "rank": rank,
                "loss": loss,
                "lr": 3e-3,
                "grad_norm": 1.0,
                "tokens_per_second": TOKENS_PER_STEP / step_seconds,
                "step_seconds": step_seconds,
                "data_seconds": data,
                "compute_seconds": compute,
                "optimizer_seconds": opt,
                "tokens_seen": step * TOKENS_PER_STEP,
                "mfu": 0.02,
                "skipped_step": False,
                "memory_parameters_bytes": 4_000_000,
                "memory_gradients_bytes": 4_000_000,
                "memory_optimizer_bytes": 8_000_000,
                "memory_saved_activations_bytes": 12_000_000 + rank * 1000,
            }
            if wait is not None and meters.due(step):
                record["sync_wait_seconds"] = wait
            elif wait is not None:  # not probed: DDP's backward waited for the slowest rank inside compute
                record["compute_seconds"] += wait
            if not meters.due(step):
                for key in [k for k in record if k.startswith("memory_")]:
                    del record[key]
            if val_every and step % val_every == 0:
                record["val_loss"] = (loss or 0.0) + 0.1 if loss is not None else None
            lines.append(json.dumps(record))
        (root / f"metrics.rank{rank}.jsonl").write_text("\n".join(lines) + "\n")
    config = {"parallel": {"strategy": "fsdp", "nproc_per_node": ranks}, "precision": {"mode": "fp32"}}
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    (root / "plan.json").write_text(json.dumps({"step_seconds": plan_step_seconds}))
    if plan_step_seconds is not None:
        # The shape of `flopwise.runrecord.records.Comparison`, as the trainer writes it.
        pvm = {
            "hardware": {"key": hardware, "name": hardware, "devices": ranks},
            "predicted": {
                "memory_bytes": {"weights": 4_000_000, "gradients": 4_000_000, "optimizer": 8_000_000, "activations": 10_000_000},
                "tokens_per_second": TOKENS_PER_STEP / plan_step_seconds,
                "step_seconds": plan_step_seconds,
                "mfu": None,
            },
            "measured": {
                "memory_bytes": {"weights": 4_000_000, "gradients": 4_000_000, "optimizer": 8_000_000, "activations": 12_000_000},
                "tokens_per_second": TOKENS_PER_STEP / 0.12,
                "step_seconds": 0.12,
                "mfu": 0.02,
                "hardware": hardware,
                "val_losses": [{"step": 10, "loss": 5.0}],
            },
            "measured_over_predicted": {"memory_activations": 1.2},
        }
        if profile is not None:  # the device profile record the prediction used
            pvm["profile"] = profile
        if machine_load is not None:  # the 1-minute load during the run
            pvm["measured"]["machine_load"] = machine_load
        (root / "predicted_vs_measured.json").write_text(json.dumps(pvm))
    return root
