"""Benchmark: flopwise's training step vs a hand-written minimal PyTorch loop.

Same model (the embedded default's decoder, built once and shared), same data (the same
cached token shards and loader), same settings (fp32, AdamW, clipping, warm-up + cosine),
one process. Timings alternate between the two loops in short blocks and the medians are
compared, so that a busy machine slows both alike. Three variants are timed:

- `baseline`: forward, cross-entropy, backward, clip, AdamW step, zero_grad, LR step;
- `flopwise`: `step.train_step` as a run uses it (timing splits, saved-tensor and
  memory measurement on every step);
- `flopwise_no_memory`: `train_step` with `StepHooks(measure=False)`, to show what measurement costs.

A run meters only some steps (`training.measure_every`); `benchmarks/meter_overhead.py` pairs
every-step meters against the sampled schedule on a 2-process DDP step.

Target: flopwise's overhead <= 3% of the step time (median steps; the fastest steps,
least disturbed by other processes, are reported too). Writes JSON (default
benchmarks/results/train_overhead.json).

Usage: python benchmarks/train_overhead.py [--out PATH] [--rounds 15] [--steps 3] [--threads 1]
       [--config CONFIG.yaml] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from machine import cpu_name


def baseline_step(model, optimizer, scheduler, loader, grad_clip: float | None) -> float:
    """The minimal loop's step: what a person writes by hand (nanoGPT's inner loop)."""
    t0 = time.perf_counter()
    inputs, targets = next(loader)
    logits = model(inputs)
    loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
    loss.backward()
    if grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    scheduler.step()
    loss.item()
    return time.perf_counter() - t0


def main() -> None:
    """Time the three loops and write the JSON result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/train_overhead.json")
    parser.add_argument("--rounds", type=int, default=15, help="alternating blocks per variant")
    parser.add_argument("--steps", type=int, default=3, help="steps per block")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--config", default=None, help="a run config (default: the embedded default)")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from flopwise.config.loading import load_config
    from flopwise.config.resolve import resolve_run
    from flopwise.train.data.prepare import prepare_data
    from flopwise.train.loop import build_state, make_loader, make_optimizer, make_scheduler
    from flopwise.train.step import StepHooks, train_step
    from flopwise.train.parallel.distributed import init_distributed

    overrides = ["parallel.strategy=single", "parallel.nproc_per_node=1", *args.overrides]
    cfg = load_config(args.config, overrides)
    env = init_distributed(cfg.parallel)
    t0 = time.perf_counter()
    prepared = prepare_data(cfg.data)
    prepare_seconds = time.perf_counter() - t0

    run = resolve_run(cfg, processes=env.world_size)
    state = build_state(cfg, env, prepared, run)
    model = state.built.model  # the baseline trains the very same module, with its own optimizer
    base_optimizer = make_optimizer(model, cfg.training)
    base_scheduler = make_scheduler(base_optimizer, cfg.training)
    base_loader = iter(make_loader(cfg, env, prepared, "train", run))

    timings: dict[str, list[float]] = {"baseline": [], "flopwise": [], "flopwise_no_memory": []}
    runners = {
        "baseline": lambda: baseline_step(model, base_optimizer, base_scheduler, base_loader, cfg.training.grad_clip),
        "flopwise": lambda: train_step(state, env, 1, StepHooks(measure=True)).step_seconds,
        "flopwise_no_memory": lambda: train_step(state, env, 1, StepHooks(measure=False)).step_seconds,
    }
    for runner in runners.values():  # warm-up: allocator, optimizer state, prefetch threads
        runner()
        runner()
    for _ in range(args.rounds):
        for name, runner in runners.items():
            timings[name] += [runner() for _ in range(args.steps)]
    state.train_loader.close()

    medians = {name: statistics.median(values) for name, values in timings.items()}
    fastest = {name: min(values) for name, values in timings.items()}
    quartiles = {name: statistics.quantiles(values, n=4) for name, values in timings.items()}
    overhead = medians["flopwise"] / medians["baseline"] - 1.0
    result = {
        "benchmark": "train_overhead",
        "machine": {"cpu": cpu_name(), "threads": args.threads, "torch": torch.__version__},
        "settings": {
            "model": cfg.model.model_dump(mode="json"),
            "seq_len": cfg.data.seq_len,
            "micro_batch_size": cfg.training.micro_batch_size,
            "precision": cfg.precision.mode,
            "optimizer": cfg.training.optimizer,
            "tokens_per_step": cfg.training.micro_batch_size * cfg.data.seq_len,
            "rounds": args.rounds,
            "steps_per_round": args.steps,
            "data_prepare_seconds": prepare_seconds,
        },
        "median_step_seconds": medians,
        "fastest_step_seconds": fastest,
        "quartile_step_seconds": quartiles,
        "overhead_fraction_fastest_steps": fastest["flopwise"] / fastest["baseline"] - 1.0,
        "steps_timed": {name: len(values) for name, values in timings.items()},
        "overhead_fraction": overhead,
        "overhead_without_memory_measurement_fraction": medians["flopwise_no_memory"] / medians["baseline"] - 1.0,
        "target_overhead_fraction": 0.03,
        "meets_target": overhead <= 0.03,
        "note": "medians of alternating blocks; on a shared machine the spread between blocks can exceed "
                "the overhead itself, so compare repeated runs before drawing conclusions",
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: result[k] for k in ("median_step_seconds", "overhead_fraction", "overhead_fraction_fastest_steps",
                                             "overhead_without_memory_measurement_fraction", "meets_target")},
                     indent=2))


if __name__ == "__main__":
    main()
