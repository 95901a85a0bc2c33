"""How fast the planner is: 10,000 in-process `plan()` calls, and `flopwise plan` as a process.

Targets: 10,000 evaluations in <= 1 s; a `flopwise plan` process median <= 0.5 s.
Writes JSON to benchmarks/results/plan_speed.json (or --out).

    python benchmarks/plan_speed.py [--out FILE] [--evaluations 10000] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def time_in_process(evaluations: int) -> dict:
    """Plan the built-in example (it fits) and a run that does not (its advice re-plans alternatives)."""
    from flopwise.plan.planner import build_runspec, plan

    results = {}
    for name, spec in (("default_example", build_runspec()),
                       ("does_not_fit", build_runspec(model="llama2-70b", gpus=8, zero=1))):
        plan(spec)  # warm the parameter-count cache
        n = evaluations if name == "default_example" else max(1, evaluations // 10)
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(n):
            plan(spec)
        seconds = time.perf_counter() - start
        cpu_seconds = time.process_time() - cpu
        results[name] = {"evaluations": n, "seconds": seconds, "cpu_seconds": cpu_seconds,
                         "microseconds_per_plan": seconds / n * 1e6}
    return results


def time_process(runs: int) -> dict:
    """Median wall time of `flopwise plan` (the console script next to this Python, else `python -m flopwise`)."""
    script = Path(sys.executable).with_name("flopwise")
    command = [str(script), "plan"] if script.exists() else [sys.executable, "-m", "flopwise", "plan"]
    if not script.exists() and shutil.which("flopwise"):
        command = [shutil.which("flopwise"), "plan"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    walls = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=env)
        walls.append(time.perf_counter() - start)
    return {"command": " ".join(command), "runs": walls, "median_seconds": statistics.median(walls)}


BREAKDOWN = """
import io, json, time, contextlib
t0 = time.perf_counter()
import flopwise.cli
t1 = time.perf_counter()
from flopwise.catalog.hardware import load_hardware
load_hardware()
t2 = time.perf_counter()
from flopwise.catalog.models import load_models
load_models()
t3 = time.perf_counter()
from flopwise.plan.planner import build_runspec, plan
result = plan(build_runspec())
t4 = time.perf_counter()
from flopwise.plan.commands import print_plan
with contextlib.redirect_stdout(io.StringIO()):
    print_plan(result)
t5 = time.perf_counter()
print(json.dumps({"import_cli": t1 - t0, "load_hardware_yaml": t2 - t1, "load_models_yaml": t3 - t2,
                  "build_and_plan": t4 - t3, "print_tables": t5 - t4}))
"""


def time_breakdown() -> dict:
    """Where one `flopwise plan` process spends its time (one fresh interpreter)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", BREAKDOWN], check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout)


def main() -> None:
    """Run both measurements and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "plan_speed.json"))
    parser.add_argument("--evaluations", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    in_process = time_in_process(args.evaluations)
    process = time_process(args.runs)
    process["breakdown_seconds"] = time_breakdown()
    result = {
        "benchmark": "plan_speed",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "in_process": in_process,
        "process": process,
        "targets": {"evaluations_10000_seconds": 1.0, "process_median_seconds": 0.5},
        "meets_targets": {
            "in_process": in_process["default_example"]["seconds"] * 10_000 / args.evaluations <= 1.0,
            "process": process["median_seconds"] <= 0.5,
        },
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
