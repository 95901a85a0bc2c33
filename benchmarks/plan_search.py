"""How fast the layout search is: every layout of GPT-3 175B on 1,024 A100-80GB.

Target: one search in <= 1 s, in process and as a whole `flopwise plan --search --json`
process (imports, catalog, search, JSON out). On a shared machine the wall time also measures other
people's load: the process CPU time and the load average are recorded beside it. Also runs the search with its shortcuts off
(`exhaustive=True`, every layout's memory and time planned) to show how many layouts
there are and that both find the same best layout. Writes JSON to
benchmarks/results/plan_search.json (or --out).

    python benchmarks/plan_search.py [--out FILE] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path


def describe(result) -> dict:
    """Counts and the best layout of a SearchResult."""
    best = result.best
    lay = best.spec.layout
    return {
        "layouts_memory_evaluated": result.evaluated,
        "layouts_timed": result.timed,
        "layouts_that_fit": result.fitting,
        "rejected": {k: v for k, v in result.to_dict()["rejected"].items()},
        "notes": list(result.notes),
        "best": {
            "dp": lay.dp, "tp": lay.tp, "pp": lay.pp, "micro_batch": lay.micro_batch_size,
            "grad_accum": lay.grad_accum, "zero": lay.zero_stage, "recompute": lay.recompute,
            "offload": lay.offload, "schedule": lay.pipeline_schedule, "virtual_stages": lay.virtual_stages,
            "days": best.time.total_seconds / 86_400, "mfu": best.time.mfu,
            "memory_gib": best.memory.total_bytes / 2**30,
        },
    }


SEARCH_COMMAND = [sys.executable, "-m", "flopwise", "plan", "--search", "--model", "gpt3-175b", "--hardware",
                  "a100-80gb", "--gpus", "1024", "--global-batch", "1536", "--tokens", "300B", "--json"]


def time_process(runs: int) -> dict:
    """Wall and CPU seconds of the whole search as a process (median of `runs`, after one warm-up)."""
    import resource
    import subprocess

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(SEARCH_COMMAND, check=True, stdout=subprocess.DEVNULL, env=env)
    walls, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(SEARCH_COMMAND, check=True, stdout=subprocess.DEVNULL, env=env)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return {"command": " ".join(SEARCH_COMMAND[1:]), "runs_seconds": walls, "median_seconds": statistics.median(walls),
            "cpu_seconds": cpus, "median_cpu_seconds": statistics.median(cpus),
            "meets_target": statistics.median(walls) <= 1.0}


def main() -> None:
    """Time the search (median of --runs) and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "plan_search.json")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    from flopwise.plan.planner import build_runspec
    from flopwise.plan.search import search_layouts

    # GPT-3 175B as trained: 2048-token sequences, 3.2M-token (1,536-sequence) batches, 300B tokens
    spec = build_runspec(model="gpt3-175b", hardware="a100-80gb", gpus=1, global_batch=1536, tokens="300B")
    search_layouts(spec, 1024)  # warm caches (parameter counts, imports)
    walls, cpus = [], []
    for _ in range(args.runs):
        start, cpu = time.perf_counter(), time.process_time()
        result = search_layouts(spec, 1024, top=5)
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    start = time.perf_counter()
    exhaustive = search_layouts(spec, 1024, top=5, exhaustive=True)
    exhaustive_seconds = time.perf_counter() - start
    same = [p.spec.layout for p in exhaustive.ranked] == [p.spec.layout for p in result.ranked]

    out = {
        "benchmark": "plan_search",
        "case": "gpt3-175b on 1024 x a100-80gb, bf16, AdamW, seq 2048, global batch 1536, 300B tokens",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "runs_seconds": walls,
        "median_seconds": statistics.median(walls),
        "cpu_seconds": cpus,
        "median_cpu_seconds": statistics.median(cpus),
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "target_seconds": 1.0,
        "meets_target": statistics.median(walls) <= 1.0,
        "search": describe(result),
        "exhaustive": {**describe(exhaustive), "seconds": exhaustive_seconds},
        "same_ranking_as_exhaustive": same,
        "process": time_process(args.runs),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({k: out[k] for k in ("median_seconds", "median_cpu_seconds", "load_average", "meets_target",
                                           "same_ranking_as_exhaustive")}))
    print(json.dumps({"process_" + k: out["process"][k] for k in ("median_seconds", "median_cpu_seconds",
                                                                  "meets_target")}))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
