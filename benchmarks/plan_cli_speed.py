"""`flopwise plan --json` as a whole process against the same interpreter importing typer,
rich, pydantic and yaml: the ratio of their wall times.

Target: ratio <= 1.5. The two processes are run alternately in pairs (plan, baseline,
plan, baseline, ...) so that load on a shared machine hits both alike; the ratio is the
median of the per-pair ratios, with the medians of each side beside it. Byte-code is
written and one warm-up run of each precedes timing, as for an installed package (a
source checkout run with PYTHONDONTWRITEBYTECODE=1 recompiles flopwise every time).

    python benchmarks/plan_cli_speed.py [--pairs 30] [--out benchmarks/results/plan_cli_speed.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

PLAN = [sys.executable, "-m", "flopwise", "plan", "--json"]
TABLES = [sys.executable, "-m", "flopwise", "plan"]  # the plain command: its tables, through rich
BASELINE = [sys.executable, "-c", "import typer, rich, pydantic, yaml"]


def wall(command: list[str], env: dict) -> float:
    """Seconds one process takes from start to exit."""
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=env)
    return time.perf_counter() - start


def measure(pairs: int, command: list[str] = PLAN) -> dict:
    """Paired alternating runs of `command` (`plan --json`) and the import baseline."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["OMP_NUM_THREADS"] = "1"
    src = Path(__file__).resolve().parents[1] / "src"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(src), env.get("PYTHONPATH", "")]))
    wall(command, env), wall(BASELINE, env)  # warm-up: byte-code and the OS file cache
    plan_s, base_s, ratios = [], [], []
    for _ in range(pairs):
        p, b = wall(command, env), wall(BASELINE, env)
        plan_s.append(p)
        base_s.append(b)
        ratios.append(p / b)
    return {
        "pairs": pairs,
        "plan_json_median_s": statistics.median(plan_s),
        "baseline_median_s": statistics.median(base_s),
        "ratio_median_of_pairs": statistics.median(ratios),
        "ratio_of_medians": statistics.median(plan_s) / statistics.median(base_s),
        "target_ratio": 1.5,
        "plan_json_s": plan_s,
        "baseline_s": base_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=30)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "plan_cli_speed.json"))
    args = parser.parse_args()
    result = {
        "benchmark": "plan_cli_speed",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": sys.version.split()[0],
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "plan_command": " ".join(PLAN[1:]),
        "baseline_command": " ".join(BASELINE[1:]),
        **measure(args.pairs),
        "tables": {"command": " ".join(TABLES[1:]), **measure(args.pairs, TABLES)},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"plan --json {result['plan_json_median_s']:.3f} s, baseline {result['baseline_median_s']:.3f} s, "
          f"ratio {result['ratio_median_of_pairs']:.2f} (target <= 1.5); plain plan (tables) ratio "
          f"{result['tables']['ratio_median_of_pairs']:.2f} -> {out}")


if __name__ == "__main__":
    main()
