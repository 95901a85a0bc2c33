"""Benchmark: FSDP2 step time against `parallel.fsdp_unit_mb` (blocks grouped per unit), with DDP for reference.

Run under torchrun on 2 gloo processes (the embedded default's layout). Every variant is
built once in the same two processes (same model seed, same data); timings then alternate
between the variants in short blocks (the order reversed every other round), so that a busy
machine slows all alike. Reports, per variant, the median and fastest step, tokens/s, the
ratio of medians to the per-block units (`fsdp_unit_mb=0`, the first variant) and to DDP, the
paired ratio (median over rounds of the per-block variant's block time over this variant's
in the same round: the figure least moved by load that changes between rounds), the number of block units and the
largest unit's parameter bytes (two such units are gathered at once: the memory price).

Usage: torchrun --nproc-per-node 2 benchmarks/fsdp_units.py [--out PATH] [--unit-mb 0,2,4,8]
       [--rounds 12] [--steps 2] [--no-ddp] [key=value ...]
Writes JSON (default benchmarks/results/fsdp_units.json) from rank 0.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from machine import cpu_name


def main() -> None:
    """Build each variant, time alternating blocks of steps, write the JSON result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/fsdp_units.json")
    parser.add_argument("--unit-mb", default="0,2,4,8", help="comma-separated parallel.fsdp_unit_mb values")
    parser.add_argument("--rounds", type=int, default=12, help="alternating blocks per variant")
    parser.add_argument("--steps", type=int, default=2, help="steps per block")
    parser.add_argument("--no-ddp", action="store_true", help="leave out the DDP reference")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    args = parser.parse_args()

    from flopwise.config.loading import load_config
    from flopwise.config.resolve import resolve_run
    from flopwise.plan.fsdp_units import MIB, group_blocks
    from flopwise.train.data.prepare import prepare_data
    from flopwise.train.loop import build_state
    from flopwise.train.parallel.distributed import barrier, init_distributed
    from flopwise.train.step import StepHooks, train_step

    base = load_config(None, ["parallel.strategy=fsdp", *args.overrides])
    env = init_distributed(base.parallel)
    prepared = prepare_data(base.data) if env.is_main else None
    barrier(env)
    if prepared is None:
        prepared = prepare_data(base.data)

    variants = {f"fsdp_unit_mb={mb:g}": [f"parallel.fsdp_unit_mb={mb:g}"]
                for mb in (float(v) for v in args.unit_mb.split(","))}
    if not args.no_ddp:
        variants["ddp"] = ["parallel.strategy=ddp"]
    states, units = {}, {}
    for name, extra in variants.items():
        cfg = load_config(None, ["parallel.strategy=fsdp", *args.overrides, *extra])
        run = resolve_run(cfg, processes=env.world_size)
        states[name] = build_state(cfg, env, prepared, run)
        if cfg.parallel.strategy == "fsdp":
            blocks = [sum(p.numel() * p.element_size() for p in b.parameters())  # a DTensor's numel is the whole
                      for b in states[name].built.model.blocks]
            groups = group_blocks(blocks, cfg.parallel.fsdp_unit_mb * MIB)
            units[name] = {"block_units": len(groups), "blocks_per_unit": [len(g) for g in groups],
                           "largest_unit_parameter_bytes": max(sum(blocks[i] for i in g) for g in groups)}
    tokens_per_step = base.training.micro_batch_size * base.data.seq_len * env.world_size

    timings: dict[str, list[float]] = {name: [] for name in states}
    hooks = StepHooks(measure=False)
    for state in states.values():  # warm-up: allocator, optimizer state, prefetch threads
        train_step(state, env, 1, hooks)
        train_step(state, env, 1, hooks)
    paired: dict[str, list[float]] = {name: [] for name in states}  # per round: per-block block / this block
    names = list(states)
    for round_index in range(args.rounds):
        order = names if round_index % 2 == 0 else names[::-1]  # neither variant always runs first
        block = {}
        for name in order:
            block[name] = [train_step(states[name], env, 1, hooks).step_seconds for _ in range(args.steps)]
            timings[name] += block[name]
        for name in names:
            paired[name].append(sum(block[names[0]]) / sum(block[name]))
    for state in states.values():
        state.train_loader.close()
    if not env.is_main:
        return

    medians = {name: statistics.median(values) for name, values in timings.items()}
    reference = medians[next(iter(variants))]
    result = {
        "benchmark": "fsdp_units",
        "machine": {"cpu": cpu_name(), "processes": env.world_size, "backend": "gloo",
                    "threads_per_process": torch.get_num_threads(), "torch": torch.__version__},
        "settings": {"model": base.model.model_dump(mode="json"), "seq_len": base.data.seq_len,
                     "micro_batch_size": base.training.micro_batch_size, "precision": base.precision.mode,
                     "tokens_per_step": tokens_per_step, "rounds": args.rounds, "steps_per_round": args.steps,
                     "overrides": args.overrides},
        "units": units,
        "median_step_seconds": medians,
        "fastest_step_seconds": {name: min(values) for name, values in timings.items()},
        "tokens_per_second": {name: tokens_per_step / m for name, m in medians.items()},
        "speed_over_per_block_units": {name: reference / m for name, m in medians.items()},
        "paired_speed_over_per_block_units": {name: statistics.median(r) for name, r in paired.items()},
        "paired_speed_quartiles": {name: statistics.quantiles(r, n=4) for name, r in paired.items()},
        "speed_over_ddp": ({name: medians["ddp"] / m for name, m in medians.items()} if "ddp" in medians else None),
        "steps_timed": {name: len(values) for name, values in timings.items()},
        "note": "medians of alternating blocks in the same two processes; speed ratios > 1 are faster",
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: result[k] for k in ("units", "median_step_seconds", "speed_over_per_block_units",
                                             "paired_speed_over_per_block_units", "speed_over_ddp")}, indent=2))


if __name__ == "__main__":
    main()
