"""Data-parallel strategies on torch.distributed: single process, DDP, FSDP2.

The model knows nothing about distribution; this module wraps it from outside
(torchtitan's `parallelize` idea). A new strategy (DeepSpeed ZeRO, pipeline 1F1B) is an
addition here: a branch in `wrap_model` and, if it syncs gradients differently, in
`gradient_sync`. Nothing here re-implements a collective or a sharding scheme.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Iterator

import torch
import torch.distributed as dist
from torch import nn

from flopwise.errors import UserError
from flopwise.train.config import ParallelConfig

STRATEGIES_AVAILABLE = ("single", "ddp", "fsdp", "deepspeed", "pipeline")


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


def check_strategy(cfg: ParallelConfig) -> None:
    """Fail before any process starts when the strategy has no implementation yet."""
    if cfg.strategy not in STRATEGIES_AVAILABLE:
        raise UserError(
            f"parallel.strategy: {cfg.strategy} is not available in this version "
            f"(allowed: {', '.join(STRATEGIES_AVAILABLE)})"
        )
    if cfg.strategy == "deepspeed":
        from flopwise.train.strategy_deepspeed import check_deepspeed_config

        check_deepspeed_config(cfg)


def data_parallel_shape(cfg: ParallelConfig, env: "DistEnv") -> tuple[int, int, int]:
    """(data-parallel rank, data-parallel size, micro-batches per pass) of this process.

    Data-parallel strategies split each batch over all ranks, one micro-batch per rank per
    pass. A pipeline splits the model instead: every stage sees the same batch, and one
    pass feeds `pipeline_microbatches` micro-batches through the stages.
    """
    if cfg.strategy == "pipeline":
        return 0, 1, cfg.pipeline_microbatches
    return env.rank, env.world_size, 1


def init_distributed(cfg: ParallelConfig) -> DistEnv:
    """Join the process group (from torchrun or Slurm variables) or stay a single process.

    A process group of size one is still created for DDP and FSDP2, which need one. The
    group timeout is `parallel.timeout_minutes`: a collective waiting on a dead rank
    fails after it, so a lost rank brings the job down instead of hanging it.
    """
    check_strategy(cfg)
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


def wrap_model(
    model: nn.Module,
    blocks: nn.ModuleList,
    cfg: ParallelConfig,
    env: DistEnv,
    mp_policy=None,
) -> nn.Module:
    """Apply the data-parallel strategy; returns the module the loop calls.

    FSDP2: `fully_shard` on each transformer block, then on any other direct child
    holding at least `fsdp_min_params` parameters (a size-based policy; modules sharing
    a parameter, such as tied embeddings, stay with the root), then on the root. The
    root is not resharded after forward because backward needs it at once (as in
    torchtitan). `mp_policy` is a `MixedPrecisionPolicy` for the `*-params` modes.
    """
    if not any(p.is_meta for p in model.parameters()):  # a meta model (pretrained, FSDP2) is filled after sharding
        model.to(env.device)
    if cfg.strategy == "single":
        return model
    if cfg.strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [env.device.index] if env.device.type == "cuda" else None
        # Non-persistent buffers (RoPE tables) are derived from the config and equal on every rank:
        # broadcasting them before each forward would only add a collective (and a hidden wait).
        return DistributedDataParallel(model, device_ids=device_ids, bucket_cap_mb=cfg.ddp_bucket_mb,
                                       broadcast_buffers=_has_persistent_buffers(model))
    if cfg.strategy == "fsdp":
        return _apply_fsdp(model, blocks, cfg, env, mp_policy)
    if cfg.strategy == "deepspeed":
        return model  # the DeepSpeed engine needs the optimizer: `attach_step_runner` builds it
    if cfg.strategy == "pipeline":
        from flopwise.train.strategy_pipeline import stage_module

        return stage_module(model, env)
    raise UserError(f"parallel.strategy: {cfg.strategy} is not available (allowed: {', '.join(STRATEGIES_AVAILABLE)})")


def _apply_fsdp(model: nn.Module, blocks: nn.ModuleList, cfg: ParallelConfig, env: DistEnv, mp_policy) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(env.device.type, (env.world_size,))
    options = {"mesh": mesh, "mp_policy": mp_policy or MixedPrecisionPolicy()}
    for block in blocks:
        fully_shard(block, reshard_after_forward=cfg.fsdp_reshard_after_forward, **options)
    shared = _shared_parameter_ids(model)
    block_ids = {id(block) for block in blocks}
    for child in model.children():
        if id(child) in block_ids or child is blocks or any(id(m) in block_ids for m in child.modules()):
            continue
        params = list(child.parameters())
        if not params or any(id(p) in shared for p in params):
            continue
        if sum(p.numel() for p in params) >= cfg.fsdp_min_params:
            fully_shard(child, reshard_after_forward=cfg.fsdp_reshard_after_forward, **options)
    fully_shard(model, reshard_after_forward=False, **options)
    return model


def _has_persistent_buffers(model: nn.Module) -> bool:
    """Whether any buffer is state (e.g. running statistics) rather than a table derived from the config."""
    return any(
        name not in module._non_persistent_buffers_set
        for module in model.modules()
        for name, _ in module.named_buffers(recurse=False)
    )


def _shared_parameter_ids(model: nn.Module) -> set[int]:
    owners: dict[int, int] = {}
    for module in model.modules():
        for param in module.parameters(recurse=False):
            owners[id(param)] = owners.get(id(param), 0) + 1
    return {pid for pid, count in owners.items() if count > 1}


def attach_step_runner(state, cfg, env: DistEnv):
    """The strategy's own step runner, for strategies that drive forward, backward and the
    optimizer step themselves (DeepSpeed's engine, a pipeline schedule); None for the rest.

    A runner has `train_step(state, cfg, env, grad_accum, measure)` returning the loop's
    `StepResult`, and `evaluate(loader, batches, cfg, env)` returning the mean loss.
    """
    if cfg.parallel.strategy == "deepspeed":
        from flopwise.train.strategy_deepspeed import DeepSpeedRunner

        return DeepSpeedRunner(state, cfg, env)
    if cfg.parallel.strategy == "pipeline":
        from flopwise.train.strategy_pipeline import PipelineRunner

        return PipelineRunner(state, cfg, env)
    return None


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


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Turn gradient synchronisation off for non-final accumulation micro-steps.

    DDP: `no_sync()`; FSDP2: `set_requires_gradient_sync(False)` (gradients stay
    unsharded and accumulate locally until the final micro-step reduce-scatters them).
    """
    if enabled:
        yield
        return
    if hasattr(model, "no_sync"):
        with model.no_sync():
            yield
        return
    if hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
        return
    yield


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module under a DDP wrapper (FSDP2 shards in place, so it is the module itself)."""
    return model.module if hasattr(model, "no_sync") and hasattr(model, "module") else model


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


SLOW_RANK_ENV = "FLOPWISE_TEST_SLOW_RANK"


def simulated_straggler_delay(env: DistEnv) -> None:
    """Sleep on one rank, to make a straggler on purpose (tests, diagnose demos).

    `FLOPWISE_TEST_SLOW_RANK=R:SECONDS` makes rank R sleep SECONDS before its final
    forward of each optimizer step; unset (always, in real runs) it does nothing.
    """
    value = os.environ.get(SLOW_RANK_ENV)
    if not value:
        return
    rank, _, seconds = value.partition(":")
    if int(rank) == env.rank:
        time.sleep(float(seconds or 0.1))
