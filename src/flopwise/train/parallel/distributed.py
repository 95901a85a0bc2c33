"""Where this process sits in the job: environment, process group, Slurm variables, collectives.

Distribution is torch.distributed, launched by torchrun (or Slurm's `srun`); this module
joins the group and offers the few small collectives the trainer needs (barrier, mean,
max, the sync-wait probe). How the model is wrapped for a strategy lives in
`parallelize.py`; nothing here re-implements a collective or a sharding scheme.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from flopwise.errors import UserError
from flopwise.config.schema import ParallelConfig

@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the job. `distributed` is True when a process group is up."""

    rank: int
    world_size: int
    local_rank: int
    backend: str | None
    device: torch.device
    distributed: bool

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that writes shared files and prints."""
        return self.rank == 0


def launched_externally() -> bool:
    """True inside torchrun (RANK/WORLD_SIZE) or a Slurm task (SLURM_PROCID)."""
    return ("RANK" in os.environ and "WORLD_SIZE" in os.environ) or "SLURM_PROCID" in os.environ


def resolve_backend(cfg: ParallelConfig) -> str:
    """`auto` means NCCL when CUDA is present, gloo otherwise."""
    if cfg.backend != "auto":
        if cfg.backend == "nccl" and not torch.cuda.is_available():
            raise UserError("parallel.backend: nccl needs CUDA GPUs and none is visible (allowed here: gloo, auto)")
        return cfg.backend
    return "nccl" if torch.cuda.is_available() else "gloo"


def init_distributed(cfg: ParallelConfig) -> DistEnv:
    """Join the process group (from torchrun or Slurm variables) or stay a single process.

    A process group of size one is still created for DDP and FSDP2, which need one. The
    group timeout is `parallel.timeout_minutes`: a collective waiting on a dead rank
    fails after it, so a lost rank brings the job down instead of hanging it. The strategy
    itself is checked before any process starts (`parallelize.check_strategy`).
    """
    _adopt_slurm_variables()
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if cfg.strategy == "single" and world_size > 1:
        raise UserError(
            f"parallel.strategy: single runs one process but this launch has {world_size} "
            "(set parallel.nproc_per_node=1, or choose ddp or fsdp)"
        )
    backend = resolve_backend(cfg)
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    needs_group = world_size > 1 or cfg.strategy in ("ddp", "fsdp", "deepspeed", "pipeline")
    if not needs_group:
        return DistEnv(rank, world_size, local_rank, None, device, False)
    if not dist.is_initialized():
        if "MASTER_ADDR" not in os.environ:
            os.environ["MASTER_ADDR"] = "127.0.0.1"
            os.environ["MASTER_PORT"] = str(_free_port())
        dist.init_process_group(
            backend=backend,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(minutes=cfg.timeout_minutes),
            device_id=device if device.type == "cuda" else None,
        )
    return DistEnv(rank, world_size, local_rank, backend, device, True)


def shutdown(env: DistEnv) -> None:
    """Leave the process group cleanly (avoids gloo/NCCL warnings at exit)."""
    if env.distributed and dist.is_initialized():
        dist.destroy_process_group()


def barrier(env: DistEnv) -> None:
    """Wait for every rank (no-op for a single process)."""
    if env.distributed:
        dist.barrier()


def all_reduce_mean(values: list[float], env: DistEnv) -> list[float]:
    """Average a few scalars over ranks (loss, timings) with one collective."""
    if not env.distributed or env.world_size == 1:
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64, device=env.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return (tensor / env.world_size).tolist()


def all_reduce_max(values: list[float], env: DistEnv) -> list[float]:
    """Maximum of a few scalars over ranks (the slowest rank's step time)."""
    if not env.distributed or env.world_size == 1:
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64, device=env.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


def agree_max(values: list[int], env: DistEnv) -> list[int]:
    """Element-wise maximum of a few integers over ranks (flags and steps every rank must agree on)."""
    if not env.distributed or env.world_size == 1:
        return list(values)
    tensor = torch.tensor(values, dtype=torch.int64, device=env.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [int(v) for v in tensor.tolist()]


def wait_for_other_ranks(env: DistEnv, enabled: bool) -> float | None:
    """Seconds this rank waits for the others just before the gradient-synchronising backward.

    A tiny all-reduce every rank must reach: the last rank to arrive waits ~0, the others
    wait for it, which is how a straggler becomes visible to `flopwise diagnose`. Cost:
    one extra small collective per optimizer step (microseconds on NVLink, ~0.1-1 ms on
    gloo), plus, on CUDA, a device synchronisation before it that stops the host from
    running ahead of the GPU. None when off or with a single process.
    """
    if not enabled or not env.distributed or env.world_size == 1:
        return None
    if env.device.type == "cuda":
        torch.cuda.synchronize(env.device)
    flag = torch.zeros(1, device=env.device)
    start = time.perf_counter()
    dist.all_reduce(flag)
    if env.device.type == "cuda":
        torch.cuda.synchronize(env.device)
    return time.perf_counter() - start


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor: the local shard of an FSDP2 DTensor, else the tensor."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _adopt_slurm_variables() -> None:
    """Inside `srun` without torchrun, derive torchrun's variables from Slurm's."""
    if "RANK" in os.environ or "SLURM_PROCID" not in os.environ:
        return
    os.environ["RANK"] = os.environ["SLURM_PROCID"]
    os.environ["WORLD_SIZE"] = os.environ.get("SLURM_NTASKS", "1")
    os.environ["LOCAL_RANK"] = os.environ.get("SLURM_LOCALID", "0")
    if "MASTER_ADDR" not in os.environ:
        nodelist = os.environ.get("SLURM_JOB_NODELIST", "127.0.0.1")
        os.environ["MASTER_ADDR"] = _first_slurm_host(nodelist)
        os.environ.setdefault("MASTER_PORT", "29500")


def _first_slurm_host(nodelist: str) -> str:
    """First host of a Slurm node list like `node[01-04],gpu7` (no scontrol needed)."""
    head = nodelist.split(",")[0]
    if "[" in head:
        prefix, rest = head.split("[", 1)
        head = prefix + rest.split("-")[0].split(",")[0].rstrip("]")
    return head


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
