"""What the forecast costs a run before step 1: planning and loading the device profile.

Issue 22 asks to cache the plan when this costs more than ~0.3 s. Two parts, on the embedded
default config (the run `flopwise train` makes with no file), each in fresh processes:

  - imports: the modules only the forecast needs (the planner, the device profile's readers),
    timed after everything else the training loop imports is already loaded;
  - `train.prediction.prepare` on one process: the plan's inputs from the config, the device
    profile read from its cache file, the hardware, `plan()`, and `plan.json` written.

A machine that has no profile yet for this device, torch build and thread count measures a
quick one once (all ranks together) and caches it; `--cold` times that too, in a scratch
cache folder (XDG_CACHE_HOME), so the real cache is left alone.

    OMP_NUM_THREADS=1 python benchmarks/startup_forecast.py [--runs 5] [--cold] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# Everything run_training imports besides the forecast's own modules (train/loop.py's imports).
TRAINER_MODULES = """
import torch
import flopwise.train.parallel.comm_volume, flopwise.train.build, flopwise.config.resolve, flopwise.config.schema
import flopwise.config.loading, flopwise.config.signature, flopwise.train.data.chat_loader, flopwise.train.data.chat_rows
import flopwise.train.data.files, flopwise.train.launch.heartbeat, flopwise.train.data.prepare
import flopwise.train.parallel.distributed, flopwise.train.checkpoint.policy, flopwise.runrecord.records
import flopwise.runrecord.run_dir, flopwise.safe_write, flopwise.train.metrics, flopwise.train.techniques.precision
import flopwise.train.step
"""

ONE_RUN = TRAINER_MODULES + """
import json, sys, tempfile, time
start = time.perf_counter()
import flopwise.measure.calibrate, flopwise.train.prediction, flopwise.train.run_forecast
import flopwise.train.launch.strategy_choice, flopwise.plan.planner
imports = time.perf_counter() - start
from flopwise.config.loading import load_config
from flopwise.config.resolve import resolve_run
from flopwise.train.parallel.distributed import DistEnv
from flopwise.train import prediction
cfg = load_config(None, [f"logging.run_dir={tempfile.mkdtemp(prefix='flopwise-startup-')}"])
run = resolve_run(cfg, processes=1)
env = DistEnv(rank=0, world_size=1, local_rank=0, backend=None, device=torch.device("cpu"), distributed=False)
start = time.perf_counter()
forecast = prediction.prepare(cfg, run, 4096, env)
prepare = time.perf_counter() - start
print(json.dumps({"imports": imports, "prepare": prepare, "profile": forecast.profile,
                  "predicted_run_seconds": forecast.plan.time.total_seconds if forecast.plan else None}))
"""


def one_run(env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", ONE_RUN], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cold", action="store_true", help="also time a first run that measures the profile")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "startup_forecast.json"))
    args = parser.parse_args()
    env = dict(os.environ)
    one_run(env)  # warm-up: the profile is cached, .pyc files written
    runs = [one_run(env) for _ in range(args.runs)]
    result = {
        "benchmark": "startup_forecast",
        "load_average_1min": os.getloadavg()[0],
        "cpus": os.cpu_count(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "runs": args.runs,
        "median_seconds": {key: statistics.median(r[key] for r in runs) for key in ("imports", "prepare")},
        "all_seconds": {key: [r[key] for r in runs] for key in ("imports", "prepare")},
        "profile": runs[-1]["profile"],
        "threshold_seconds": 0.3,
    }
    result["median_seconds"]["total"] = result["median_seconds"]["imports"] + result["median_seconds"]["prepare"]
    if args.cold:
        with tempfile.TemporaryDirectory(prefix="flopwise-cold-cache-") as cache:
            cold = one_run({**env, "XDG_CACHE_HOME": cache})
        result["cold_profile_measured"] = {"imports": cold["imports"], "prepare": cold["prepare"],
                                           "source": (cold["profile"] or {}).get("source")}
    result["plan_cache_warranted"] = result["median_seconds"]["total"] > result["threshold_seconds"]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    median = result["median_seconds"]
    print(f"forecast before step 1 (median of {args.runs}, load {result['load_average_1min']:.1f}): imports "
          f"{median['imports'] * 1000:.0f} ms + prepare {median['prepare'] * 1000:.0f} ms = {median['total'] * 1000:.0f} ms "
          f"(threshold {result['threshold_seconds'] * 1000:.0f} ms)")
    if args.cold:
        print(f"  a machine without a profile: prepare {result['cold_profile_measured']['prepare']:.2f} s once "
              f"(profile {result['cold_profile_measured']['source']})")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
