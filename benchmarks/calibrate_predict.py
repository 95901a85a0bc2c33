"""Predicted vs measured tokens/s on this machine: `flopwise calibrate`, then `flopwise train`.

Runs `flopwise calibrate --nproc 2` (the default training launch: 2 processes, 1 thread
each, so the trainer finds this profile in the cache), then three short training runs of
the default config: as is, with `training.gradient_checkpointing=true`, and with
`parallel.strategy=ddp`. For each run it records the trainer's own
`predicted_vs_measured.json` figures, which profile the prediction used, the load
average, and the share of the CPUs the run's processes got (CPU seconds / (wall × 2)):
on a shared machine other work slows the measured run but not the profile (calibrate
counts CPU time), so compare runs made with a low load average. Even alone the ranks use
about 60 % of the two CPUs (they wait on gloo collectives), so the share is no correction
factor, only a sign of how busy the machine was.

Load-independent reading: each configuration also runs `--short-steps` steps; the
difference of the two runs' CPU seconds, per rank and per step, is what one step costs the
CPU whatever else runs (start-up, evaluation and checkpoint cancel out). A step cannot take
less wall time than that when alone, so `cpu_seconds_per_step / predicted step_seconds`
shows how much of the step the prediction accounts for when the load makes the wall-time
ratio meaningless (a diagnostic, not the issue's bar, which is the wall-time ratio).

    OMP_NUM_THREADS=1 python benchmarks/calibrate_predict.py [--steps 30] [--repeat 3] [--short-steps 0]
        [--out benchmarks/results/calibrate_predict.json]

`--repeat N` calibrates and trains N times over (the machine's speed moves between
minutes; each repetition's prediction comes from its own calibration) and counts, per
configuration, the repetitions within the 15 % bar. The profile each repetition measured
is kept in the results.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import machine_info

RUNS = {
    "default": [],
    "gradient_checkpointing": ["training.gradient_checkpointing=true"],
    "ddp": ["parallel.strategy=ddp"],
}
TOLERANCE = 0.15  # the bar: predicted tokens/s within 15 % of measured


def child_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(cmd: list[str], env: dict) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process tree) of one command; raises on failure."""
    cpu, wall = child_cpu_seconds(), time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return time.perf_counter() - wall, child_cpu_seconds() - cpu


def one_round(flopwise: list[str], env: dict, work: Path, steps: int, short_steps: int) -> dict:
    """Calibrate, then train each configuration: the figures of one repetition."""
    load_before = os.getloadavg()
    wall, cpu = run([*flopwise, "calibrate", "--nproc", "2"], env)
    result = {"calibrate": {"wall_seconds": wall, "cpu_seconds": cpu, "load_average_before": load_before},
              "runs": {}}
    for name, overrides in RUNS.items():
        run_dir = work / name
        shutil.rmtree(run_dir, ignore_errors=True)
        load = os.getloadavg()
        wall, cpu = run([*flopwise, "train", f"training.max_steps={steps}", "logging.progress=false",
                         f"logging.run_dir={run_dir}", *overrides], env)
        comparison = json.loads((run_dir / "predicted_vs_measured.json").read_text())
        plan_time = json.loads((run_dir / "plan.json").read_text())["time"]
        predicted = comparison["predicted"]["tokens_per_second"]
        measured = comparison["measured"]["tokens_per_second"]
        result["runs"][name] = {
            "overrides": overrides,
            "predicted_tokens_per_second": predicted,
            "measured_tokens_per_second": measured,
            "measured_over_predicted": measured / predicted if predicted else None,
            "within_tolerance": bool(predicted) and abs(measured / predicted - 1) <= TOLERANCE,
            "predicted_mfu": comparison["predicted"]["mfu"],
            "measured_mfu": comparison["measured"]["mfu"],
            "measured_step_seconds": comparison["measured"]["step_seconds"],
            "efficiency_source": plan_time["efficiency_source"],
            "predicted_seconds_per_step": {key: plan_time[key] for key in (
                "step_seconds", "gemm_seconds", "attention_seconds", "memory_bound_seconds", "optimizer_seconds",
                "dp_exposed_seconds", "compute_seconds")},
            "profile": comparison.get("profile"),
            "load_average_before": load,
            "wall_seconds": wall,
            "cpu_share": cpu / (wall * 2),
        }
        row = result["runs"][name]
        if short_steps:
            short_dir = work / (name + "-short")
            shutil.rmtree(short_dir, ignore_errors=True)
            _, short_cpu = run([*flopwise, "train", f"training.max_steps={short_steps}", "logging.progress=false",
                                f"logging.run_dir={short_dir}", *overrides], env)
            per_step = (cpu - short_cpu) / (steps - short_steps) / 2
            predicted_step = comparison["predicted"]["step_seconds"]
            row["cpu_seconds_per_rank_step"] = per_step
            row["cpu_per_step_over_predicted_step"] = per_step / predicted_step if predicted_step else None
            print(f"{name}: CPU seconds per rank and step {per_step:.3f} (predicted step {predicted_step:.3f} s)")
        print(f"{name}: predicted {predicted:,.0f} tokens/s, measured {measured:,.0f} "
              f"(x{row['measured_over_predicted']:.2f}); CPU share {row['cpu_share']:.0%}, load {load[0]:.1f}",
              flush=True)
    profile_path = next((r["profile"]["path"] for r in result["runs"].values() if r.get("profile")), None)
    if profile_path:
        result["profile"] = json.loads(Path(profile_path).read_text())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--short-steps", type=int, default=10, help="the twin run for CPU seconds per step (0: skip)")
    parser.add_argument("--repeat", type=int, default=1, help="calibrate-and-train repetitions")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "calibrate_predict.json")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="flopwise-calibrate-predict-"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "XDG_CACHE_HOME": str(work / "cache")}
    flopwise = [sys.executable, "-m", "flopwise"]
    rounds = []
    for index in range(args.repeat):
        print(f"repetition {index + 1} of {args.repeat}", flush=True)
        rounds.append(one_round(flopwise, env, work, args.steps, args.short_steps))
    summary = {}
    for name in RUNS:
        ratios = [r["runs"][name]["measured_over_predicted"] for r in rounds]
        summary[name] = {"measured_over_predicted": ratios,
                         "within_tolerance": sum(abs(x - 1) <= TOLERANCE for x in ratios if x), "of": len(ratios)}
        print(f"{name}: measured / predicted {', '.join(f'{x:.2f}' for x in ratios)}; "
              f"{summary[name]['within_tolerance']} of {len(ratios)} within {TOLERANCE:.0%}")
    result = {"machine": machine_info(), "steps": args.steps, "tolerance": TOLERANCE, "summary": summary,
              "repetitions": rounds}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
