"""Benchmark: what the per-step meters cost a DDP step, every step against sampled (`training.measure_every`).

Run under torchrun on 2 gloo processes (the embedded default's layout, `parallel.strategy=ddp`).
One model per variant is built in the same two processes (same seed, same data); timings
alternate between the variants in blocks of steps, the order reversed every other round, so
that a busy machine slows all alike. Variants:

- `no_meters`: `train_step` with the saved-tensor meter, the memory reading and the sync-wait
  probe all off (the reference);
- `memory_every_step` / `sync_wait_every_step`: one meter on every step;
- `every_step`: both meters on every step (a run before `training.measure_every`);
- `sampled`: both meters on the steps a run's `MeterSchedule` picks (the first steps, then every
  `measure_every`-th), over a whole run of `--run-steps` steps, as `flopwise train` runs it.

Reported per variant: the median over rounds of the per-round paired ratio (variant block time /
`no_meters` block time in the same round) minus 1, i.e. the overhead, with quartiles; and the same
ratio of the main thread's CPU seconds (`time.thread_time`), which other processes on the cores
move less than wall time. The
`sampled` variant's blocks walk through one run's step numbers, so every round holds the same
share of metered steps.

Usage: torchrun --nproc-per-node 2 benchmarks/meter_overhead.py [--out PATH] [--rounds 20]
       [--steps 5] [--run-steps 150] [key=value ...]
Writes JSON (default benchmarks/results/meter_overhead.json) from rank 0.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from machine import cpu_name


def main() -> None:
    """Build each variant, time alternating blocks of steps, write the JSON result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/meter_overhead.json")
    parser.add_argument("--rounds", type=int, default=20, help="alternating blocks per variant")
    parser.add_argument("--steps", type=int, default=5, help="steps per block")
    parser.add_argument("--variants", default="no_meters,memory_every_step,sync_wait_every_step,every_step,sampled")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    args = parser.parse_args()

    from flopwise.config.loading import load_config
    from flopwise.config.resolve import resolve_run
    from flopwise.train.data.prepare import prepare_data
    from flopwise.train.loop import build_state
    from flopwise.train.meter_schedule import MeterSchedule
    from flopwise.train.parallel.distributed import barrier, init_distributed
    from flopwise.train.step import StepHooks, train_step

    overrides = ["parallel.strategy=ddp", *args.overrides]
    cfg = load_config(None, overrides)
    env = init_distributed(cfg.parallel)
    prepared = prepare_data(cfg.data) if env.is_main else None
    barrier(env)
    if prepared is None:
        prepared = prepare_data(cfg.data)
    run = resolve_run(cfg, processes=env.world_size)
    names = args.variants.split(",")
    steps_in_run = args.rounds * args.steps + 2  # the sampled variant's run: warm-up plus every timed step
    cfg.training.max_steps = max(cfg.training.max_steps, steps_in_run)
    schedule = MeterSchedule(first_step=0, every=cfg.training.measure_every, max_steps=steps_in_run)
    states = {name: build_state(cfg, env, prepared, run) for name in names}

    fixed = {"no_meters": (False, False), "memory_every_step": (True, False),
             "sync_wait_every_step": (False, True), "every_step": (True, True)}

    cpu: dict[str, list[float]] = {name: [] for name in names}  # this thread's CPU seconds per step

    def step(name: str) -> float:
        state = states[name]
        metered = schedule.due(state.step + 1) if name == "sampled" else None
        measure, sync_wait = (metered, metered) if metered is not None else fixed[name]
        cpu_start = time.thread_time()
        seconds = train_step(state, env, run.grad_accum, StepHooks(measure=measure, sync_wait=sync_wait)).step_seconds
        cpu[name].append(time.thread_time() - cpu_start)
        return seconds

    for name in names:  # warm-up: allocator, optimizer state, DDP buckets, prefetch threads
        step(name)
        step(name)
    timings: dict[str, list[float]] = {name: [] for name in names}
    paired: dict[str, list[float]] = {name: [] for name in names}
    paired_cpu: dict[str, list[float]] = {name: [] for name in names}
    metered_steps = 0
    for round_index in range(args.rounds):
        order = names if round_index % 2 == 0 else names[::-1]
        block, block_cpu = {}, {}
        for name in order:
            if name == "sampled":
                metered_steps += sum(schedule.due(states[name].step + 1 + i) for i in range(args.steps))
            block[name] = [step(name) for _ in range(args.steps)]
            block_cpu[name] = sum(cpu[name][-args.steps:])
            timings[name] += block[name]
        for name in names:
            paired[name].append(sum(block[name]) / sum(block[names[0]]))
            paired_cpu[name].append(block_cpu[name] / block_cpu[names[0]])
    for state in states.values():
        state.train_loader.close()
    if not env.is_main:
        return

    medians = {name: statistics.median(values) for name, values in timings.items()}
    tokens_per_step = run.tokens_per_step
    result = {
        "benchmark": "meter_overhead",
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "processes": env.world_size, "backend": "gloo",
                    "threads_per_process": torch.get_num_threads(), "torch": torch.__version__,
                    "load_1min_after": round(os.getloadavg()[0], 2)},
        "settings": {"model": cfg.model.model_dump(mode="json"), "seq_len": cfg.data.seq_len,
                     "micro_batch_size": cfg.training.micro_batch_size, "precision": cfg.precision.mode,
                     "tokens_per_step": tokens_per_step, "rounds": args.rounds, "steps_per_round": args.steps,
                     "measure_every": cfg.training.measure_every, "overrides": overrides,
                     "sampled_run_steps": steps_in_run, "sampled_metered_steps_timed": metered_steps},
        "reference": names[0],
        "median_step_seconds": medians,
        "overhead_paired_median": {name: statistics.median(r) - 1.0 for name, r in paired.items()},
        "overhead_paired_quartiles": {name: [q - 1.0 for q in statistics.quantiles(r, n=4)]
                                      for name, r in paired.items()},
        "cpu_overhead_paired_median": {name: statistics.median(r) - 1.0 for name, r in paired_cpu.items()},
        "cpu_overhead_paired_quartiles": {name: [q - 1.0 for q in statistics.quantiles(r, n=4)]
                                          for name, r in paired_cpu.items()},
        "median_step_cpu_seconds": {name: statistics.median(values) for name, values in cpu.items()},
        "overhead_of_medians": {name: m / medians[names[0]] - 1.0 for name, m in medians.items()},
        "steps_timed": {name: len(values) for name, values in timings.items()},
        "note": "overhead = median over rounds of (variant block time / no_meters block time in the same round) - 1; "
                "cpu_overhead: the same with the main thread's CPU seconds (time.thread_time), which other "
                "processes on the cores move less than wall time; other workers share the CPU, so the figures "
                "are paired, not absolute",
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("median_step_seconds", "overhead_paired_median",
                                             "overhead_paired_quartiles", "cpu_overhead_paired_median",
                                             "cpu_overhead_paired_quartiles")}, indent=2))


if __name__ == "__main__":
    main()
