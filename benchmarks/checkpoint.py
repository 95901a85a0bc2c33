"""Checkpoint save / load time and size against model size, on this machine (one process, CPU).

For three sizes of the built-in decoder (AdamW state included, so a checkpoint holds about
3x the fp32 weights) it measures:
  - flopwise save: DCP write + fsync + sha256 manifest + rename + re-verification (`save_checkpoint`)
  - plain `dcp.save` (synchronous) and `dcp.async_save` (time until training could continue,
    then time until the write finished) into a scratch folder, for the cost of our extras
    and what an asynchronous save would hide
  - load: verify (sha256) + DCP load into a fresh model and optimizer (`load_checkpoint`)
Timings are the median of `--repeats` runs. Results go to benchmarks/results/checkpoint.json.

    OMP_NUM_THREADS=1 python benchmarks/checkpoint.py [--out PATH] [--repeats 3] [--sizes small,medium,large]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict

from flopwise.train.checkpoint import resume as ckpt_resume
from flopwise.train.checkpoint import store as ckpt
from flopwise.config.schema import ModelConfig, TrainingConfig
from flopwise.train.loop import TrainState, make_optimizer, make_scheduler
from flopwise.train.model import build_model
from flopwise.train.parallel.distributed import DistEnv

SIZES = {
    "small": dict(n_layers=2, hidden=128, n_heads=4),
    "medium": dict(n_layers=4, hidden=384, n_heads=6),
    "large": dict(n_layers=8, hidden=768, n_heads=12),
}
VOCAB = 8192


class _Loader:
    """The two methods a checkpoint needs from the data loader."""

    def state_dict(self) -> dict:
        return {"split": "train", "epoch": 0, "position": 0, "seed": 0, "seq_len": 128, "num_windows": 1}

    def load_state_dict(self, state: dict) -> None:
        pass


def make_state(size: str) -> TrainState:
    """A model of `size` with real AdamW state (one step on random tokens)."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(**SIZES[size], max_seq_len=128), VOCAB)
    training = TrainingConfig()
    optimizer = make_optimizer(model, training)
    tokens = torch.randint(0, VOCAB, (2, 65))
    torch.nn.functional.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    built = SimpleNamespace(model=model, module=model)
    return TrainState(built=built, optimizer=optimizer, scheduler=make_scheduler(optimizer, training), scaler=None,
                      train_loader=_Loader(), step=1)


def timed(action, repeats: int) -> float:
    """Median seconds of `action()` over `repeats` runs."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(size: str, repeats: int, scratch: Path) -> dict:
    env = DistEnv(rank=0, world_size=1, local_rank=0, backend=None, device=torch.device("cpu"), distributed=False)
    state = make_state(size)
    params = sum(p.numel() for p in state.built.model.parameters())
    run_dir = scratch / size
    ctx = ckpt.SaveContext(run_dir, config={}, vocab_size=VOCAB, global_batch=1, strategy="single")

    def save():
        state.step += 1
        ckpt.save_checkpoint(state, ctx, env)
        ckpt.prune_checkpoints(run_dir, keep_last=1, pin=[])

    save_s = timed(save, repeats)
    path = ckpt.published_steps(run_dir)[-1][1]
    size_bytes = sum(f.stat().st_size for f in path.iterdir())

    def plain(asynchronous: bool) -> tuple[float, float]:
        folder = scratch / f"{size}-plain"
        shutil.rmtree(folder, ignore_errors=True)
        model_sd, optim_sd = get_state_dict(state.built.model, state.optimizer)
        start = time.perf_counter()
        with ckpt.quiet_single_process_notice():
            if asynchronous:
                future = dcp.async_save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(folder))
                blocked = time.perf_counter() - start
                future.result()
            else:
                dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(folder))
                blocked = time.perf_counter() - start
        return blocked, time.perf_counter() - start

    sync = [plain(False) for _ in range(repeats)]
    asyn = [plain(True) for _ in range(repeats)]

    def load():
        fresh = make_state(size)
        assert ckpt.verify_checkpoint(path) is None
        ckpt_resume.load_checkpoint(fresh, path, env)

    load_s = timed(load, repeats)
    build_s = timed(lambda: make_state(size), repeats)
    return {
        "size": size,
        "parameters": params,
        "checkpoint_bytes": size_bytes,
        "flopwise_save_seconds": save_s,
        "dcp_save_seconds": statistics.median(t for _, t in sync),
        "dcp_async_save_blocking_seconds": statistics.median(b for b, _ in asyn),
        "dcp_async_save_total_seconds": statistics.median(t for _, t in asyn),
        "verify_and_load_seconds": max(0.0, load_s - build_s),
        "save_mb_per_second": size_bytes / 2**20 / save_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "checkpoint.json"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes", default=",".join(SIZES))
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="flopwise-ckpt-bench-") as scratch:
        rows = [measure(size, args.repeats, Path(scratch)) for size in args.sizes.split(",")]
    result = {
        "benchmark": "checkpoint",
        "torch": torch.__version__,
        "device": "cpu, 1 process, 1 thread",
        "notes": "flopwise save = DCP write + fsync + sha256 manifest + atomic rename + re-verify; "
                 "async blocking = time until training could continue with dcp.async_save (not used by the "
                 "trainer yet); load includes the sha256 verification and excludes building the model",
        "rows": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    for row in rows:
        print(f"{row['size']:>6}: {row['parameters'] / 1e6:6.1f}M params, {row['checkpoint_bytes'] / 2**20:7.1f} MiB | "
              f"save {row['flopwise_save_seconds']:.2f} s (plain DCP {row['dcp_save_seconds']:.2f} s, async blocks "
              f"{row['dcp_async_save_blocking_seconds']:.2f} s) | verify+load {row['verify_and_load_seconds']:.2f} s")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
