"""Checkpoint save time, side by side on the same state: flopwise's background save against plain DCP.

One process on the CPU, a decoder whose checkpoint (fp32 weights + AdamW moments) is about
100 MiB, the size the checkpoint issue measured. In each round, in turn, on the same state:

  - flopwise async (`checkpoint.async=true`, the default): blocking = time until training
    may continue (staging into host memory, trainer state captured), total = until the
    checkpoint is published (DCP write with each file hashed while written, fsync, trainer
    state, manifest, atomic rename, `latest`, retention);
  - flopwise blocking (`checkpoint.async=false`): the same write, in the step loop;
  - plain `dcp.save` into a scratch folder (fsynced files, nothing else);
  - plain `dcp.async_save` (blocking = until it returns, total = until its future resolves).

Rounds alternate the methods so the machine's load hits each alike: flopwise async next to\n`dcp.save`, `dcp.async_save` next to flopwise blocking, each pair in turn in both orders. The ratios are paired:
each round gives flopwise's time over plain DCP's in that same round, and the figure is the
median of those per-round ratios (a load spike then hits both sides of a ratio, not one
median). Before every timed save the page cache is flushed (`os.sync`) and the previous
folders are already deleted, so no save pays for another's writeback or deletion.
Targets (issue 22): flopwise's blocking <= 1.5x dcp.async_save's, its total <= 1.2x dcp.save's.
Results go to benchmarks/results/checkpoint.json; `--before PATH` embeds an earlier result
(e.g. the same script run on the code before a change) under "before".

    OMP_NUM_THREADS=1 python benchmarks/checkpoint.py [--out PATH] [--repeats 20] [--before PATH] [--dir /dev/shm]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed.checkpoint as dcp

from flopwise.config.schema import ModelConfig, TrainingConfig
from flopwise.train.checkpoint import store as ckpt
from flopwise.train.checkpoint.async_save import AsyncSaver
from flopwise.train.checkpoint.dcp_state import dcp_state_dict, load_dcp, save_dcp
from flopwise.train.checkpoint.hashing import preferred_algorithm
from flopwise.train.loop import TrainState, make_optimizer, make_scheduler
from flopwise.train.model import build_model
from flopwise.train.parallel.distributed import DistEnv

MODEL = dict(n_layers=4, hidden=288, n_heads=6)  # 8.7M parameters: ~100 MiB with AdamW state
VOCAB = 8192


class _Loader:
    """The two methods a checkpoint needs from the data loader."""

    def state_dict(self) -> dict:
        return {"split": "train", "epoch": 0, "position": 0, "seed": 0, "seq_len": 128, "num_windows": 1}

    def load_state_dict(self, state: dict) -> None:
        pass


class _Strategy:
    """The checkpoint half of the one-process strategy (`strategy_torch.py`): DCP with plain names."""

    checkpoint_format = "dcp"

    def __init__(self, model):
        self.model = model

    def save_state(self, state, folder: Path) -> None:
        save_dcp(self.model, state.optimizer, folder)

    def checkpoint_state_dict(self, state) -> dict:
        return dcp_state_dict(self.model, state.optimizer)

    def load_state(self, state, folder: Path) -> None:
        load_dcp(self.model, state.optimizer, folder)


def make_state() -> TrainState:
    """The model with real AdamW state (one step on random tokens)."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(**MODEL, max_seq_len=128), VOCAB)
    training = TrainingConfig()
    optimizer = make_optimizer(model, training)
    tokens = torch.randint(0, VOCAB, (2, 65))
    torch.nn.functional.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return TrainState(built=SimpleNamespace(model=model, module=model), optimizer=optimizer,
                      scheduler=make_scheduler(optimizer, training), scaler=None, train_loader=_Loader(), step=1,
                      strategy=_Strategy(model))


def cpu_seconds() -> float:
    """CPU time of this process, every thread (user + system): what a save costs whatever else the machine runs."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "checkpoint.json"))
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--dir", help="where to write the checkpoints (default: the system's temporary folder; "
                        "/dev/shm leaves the disk out and measures what the saves cost the CPU)")
    parser.add_argument("--before", help="an earlier result of this script, embedded under 'before'")
    args = parser.parse_args()
    torch.set_num_threads(1)
    env = DistEnv(rank=0, world_size=1, local_rank=0, backend=None, device=torch.device("cpu"), distributed=False)
    state = make_state()
    times: dict[str, list[float]] = {key: [] for key in (
        "flopwise_async_blocking", "flopwise_async_total", "flopwise_async_total_with_retention", "flopwise_blocking", "dcp_save",
        "dcp_async_save_blocking", "dcp_async_save_total", "cpu_flopwise_async_with_retention", "cpu_dcp_save")}
    with tempfile.TemporaryDirectory(prefix="flopwise-ckpt-bench-", dir=args.dir) as scratch:
        root = Path(scratch)
        ctx = ckpt.SaveContext(root / "async", config={}, vocab_size=VOCAB, global_batch=1, strategy="single")
        sync_ctx = ckpt.SaveContext(root / "sync", config={}, vocab_size=VOCAB, global_batch=1, strategy="single")
        saver = AsyncSaver(ctx, env, keep_last=1, pin=[])

        def flopwise_async() -> None:
            state.step += 1
            start = time.perf_counter()
            begun = time.monotonic()
            cpu = cpu_seconds()
            saver.start(state)
            times["flopwise_async_blocking"].append(time.perf_counter() - start)
            outcome = saver.wait()
            times["flopwise_async_total_with_retention"].append(time.perf_counter() - start)
            times["flopwise_async_total"].append(outcome.published_at - begun)
            times["cpu_flopwise_async_with_retention"].append(cpu_seconds() - cpu)

        def flopwise_blocking() -> None:
            state.step += 1
            start = time.perf_counter()
            ckpt.save_checkpoint(state, sync_ctx, env, verify=False)
            ckpt.prune_checkpoints(sync_ctx.run_dir, keep_last=1, pin=[])
            times["flopwise_blocking"].append(time.perf_counter() - start)

        def plain(asynchronous: bool) -> None:
            folder = root / "plain"
            start = time.perf_counter()
            with ckpt.quiet_single_process_notice():
                sd = dcp_state_dict(state.built.model, state.optimizer)
                if asynchronous:
                    future = dcp.async_save(sd, checkpoint_id=str(folder))
                    times["dcp_async_save_blocking"].append(time.perf_counter() - start)
                    future.result()
                    times["dcp_async_save_total"].append(time.perf_counter() - start)
                else:
                    cpu = cpu_seconds()
                    dcp.save(sd, checkpoint_id=str(folder))
                    times["dcp_save"].append(time.perf_counter() - start)
                    times["cpu_dcp_save"].append(cpu_seconds() - cpu)

        # each ratio's two sides run next to each other, first one then the other by turns
        pairs = [(flopwise_async, lambda: plain(False)), (lambda: plain(True), flopwise_blocking)]
        methods = [method for pair in pairs for method in pair]
        for method in methods:  # warm-up: first-call costs (imports, host buffers) are not a save's cost
            method()
        for key in times:
            times[key].clear()
        for round_ in range(args.repeats):
            order = [method for pair in pairs for method in (pair if round_ % 2 == 0 else pair[::-1])]
            for method in order:
                shutil.rmtree(root / "plain", ignore_errors=True)
                os.sync()  # nothing of the previous save (dirty pages, a deletion's journal) lands in this one
                method()
        saver.close()
        path = ckpt.published_steps(ctx.run_dir)[-1][1]
        size_bytes = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        assert ckpt.verify_checkpoint(path) is None
    median = {key: statistics.median(values) for key, values in times.items()}

    def paired(numerator: str, denominator: str) -> dict:
        ratios = [a / b for a, b in zip(times[numerator], times[denominator])]
        return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
                "rounds_within_target": None, "per_round": ratios}

    blocking_ratio = paired("flopwise_async_blocking", "dcp_async_save_blocking")
    total_ratio = paired("flopwise_async_total", "dcp_save")
    blocking_ratio["rounds_within_target"] = sum(r <= 1.5 for r in blocking_ratio["per_round"])
    total_ratio["rounds_within_target"] = sum(r <= 1.2 for r in total_ratio["per_round"])
    result = {
        "benchmark": "checkpoint",
        "torch": torch.__version__,
        "device": "cpu, 1 process, 1 thread",
        "folder": args.dir or tempfile.gettempdir(),
        "load_average_1min": os.getloadavg()[0],
        "cpus": os.cpu_count(),
        "parameters": sum(p.numel() for p in state.built.model.parameters()),
        "checkpoint_bytes": size_bytes,
        "checksum": preferred_algorithm(),
        "repeats": args.repeats,
        "median_seconds": median,
        "all_seconds": times,
        "blocking_vs_dcp_async_save": blocking_ratio["median"],
        "total_vs_dcp_save": total_ratio["median"],
        "paired_ratios": {"blocking_vs_dcp_async_save": blocking_ratio, "total_vs_dcp_save": total_ratio,
                          "flopwise_blocking_vs_dcp_save": paired("flopwise_blocking", "dcp_save"),
                          "cpu_flopwise_async_with_retention_vs_dcp_save": paired("cpu_flopwise_async_with_retention",
                                                                                  "cpu_dcp_save")},
        "ratio_of_medians": {
            "blocking_vs_dcp_async_save": median["flopwise_async_blocking"] / median["dcp_async_save_blocking"],
            "total_vs_dcp_save": median["flopwise_async_total"] / median["dcp_save"]},
        "targets": {"blocking_vs_dcp_async_save": 1.5, "total_vs_dcp_save": 1.2},
        "notes": "flopwise async: blocking = staging into host memory + trainer state; total = until published "
                 "(staging + write + fsync + checksums while writing + manifest + rename + latest); "
                 "with_retention adds deleting the checkpoint that falls out of keep_last=1 (plain DCP's folder "
                 "is deleted outside its timing). "
                 "flopwise blocking = checkpoint.async=false with verify_on_save=false (DCP writes with torch's "
                 "zip CRC32, then the manifest's checksums are computed by reading each file back). "
                 "Before each timed save the previous folders are deleted and os.sync() runs (outside the timing).",
    }
    if args.before:
        result["before"] = json.loads(Path(args.before).read_text())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"{result['parameters'] / 1e6:.1f}M parameters, {size_bytes / 2**20:.1f} MiB, checksums {result['checksum']}, "
          f"load {result['load_average_1min']:.1f} on {result['cpus']} CPUs")
    for key, value in median.items():
        print(f"  {key:<26} {value:.3f} s")
    print(f"  blocking / dcp.async_save blocking = {result['blocking_vs_dcp_async_save']:.2f} (median of "
          f"{args.repeats} paired rounds; target <= 1.5)")
    print(f"  total / dcp.save                  = {result['total_vs_dcp_save']:.2f} (median of paired rounds, "
          f"{total_ratio['min']:.2f}-{total_ratio['max']:.2f}; {total_ratio['rounds_within_target']} of "
          f"{args.repeats} rounds <= 1.2; target <= 1.2)")
    cpu = result["paired_ratios"]["cpu_flopwise_async_with_retention_vs_dcp_save"]["median"]
    print(f"  CPU seconds, flopwise async (with retention) / dcp.save = {cpu:.2f} (median of paired rounds)")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
