"""`parallel.strategy` left unset: the strategy this device and this model call for, with the reason.

One rule, used by the trainer before it starts any process and by `flopwise plan --config`, so
both run and plan the same strategy on the same device:

1. one process: `single`;
2. something only FSDP2 or a pipeline does: 16-bit parameters (`precision.mode=*-params`),
   offloading, tensor parallelism, HSDP replicas or an explicit `dp_shard` (FSDP2), pipeline
   stages (`parallel.pp` > 1: `pipeline`);
3. otherwise the memory the planner predicts for a whole replica per process (weights,
   gradients, optimizer states, activations: `plan_memory` of the DDP layout): when it fits
   the device, `ddp`, which sends each gradient once per step in buckets (on a CPU over gloo
   every extra collective costs, and FSDP2 gathers every unit's weights twice a step and
   scatters its gradients); when it does not, `fsdp` (FSDP2 shards weights, gradients and
   optimizer states over the processes). Several nodes: `fsdp`, since each node's launcher
   chooses on its own and must not depend on its own memory.

An explicit `parallel.strategy` always wins. Torch-free: the caller says what the device is.
"""

from __future__ import annotations

from dataclasses import dataclass

from flopwise.catalog.hardware import HardwareSpec
from flopwise.config.precision import precision_of

GIB = 2**30


@dataclass(frozen=True)
class StrategyChoice:
    """The strategy a run uses and why; `chosen` is False when the config named it."""

    strategy: str
    reason: str
    chosen: bool = True

    def line(self) -> str:
        """The one line the trainer prints before step 1."""
        how = "chosen" if self.chosen else "set in the config"
        return f"parallel.strategy: {self.strategy} ({how}: {self.reason})"


def memory_only_hardware(device_kind: str, memory_bytes: float | None, name: str = "") -> HardwareSpec:
    """A stand-in HardwareSpec that carries only what the memory verdict reads: the device's memory."""
    return HardwareSpec(
        key=f"{device_kind}-memory", name=name or device_kind, vendor=device_kind, peak_tflops={},
        sparse_factor=None, memory_gb=memory_bytes / GIB if memory_bytes else None, memory_unit="GiB",
        memory_bandwidth_gbs=None, scale_up_gbs=None, devices_per_node=1, scale_out_gbs=None, tdp_w=None,
        notes="memory only: for the default-strategy verdict",
    )


def choose_strategy(cfg, hardware: HardwareSpec, device_kind: str, processes: int | None = None,
                    vocab_size: int | None = None) -> StrategyChoice:
    """The strategy for `cfg` on `processes` processes (the config's by default) of `hardware`
    (`device_kind` "cpu" or "cuda"), and why, in words."""
    par = cfg.parallel
    if par.strategy is not None:
        return StrategyChoice(par.strategy, "parallel.strategy", chosen=False)
    world = processes if processes is not None else par.nproc_per_node * par.nnodes
    if world == 1:
        return StrategyChoice("single", "one process")
    if par.pp is not None and par.pp > 1:
        return StrategyChoice("pipeline", f"parallel.pp={par.pp} pipeline stages")
    precision = precision_of(cfg.precision.mode)
    if precision.param_dtype != "fp32" and not precision.pure:
        return StrategyChoice("fsdp", f"precision.mode={cfg.precision.mode} keeps 16-bit parameters through FSDP2")
    needs_fsdp = [f"parallel.{key}={getattr(par, key)}" for key in ("tp", "dp_replicate") if getattr(par, key) > 1]
    if par.dp_shard > 1:
        needs_fsdp.append(f"parallel.dp_shard={par.dp_shard}")
    if par.offload != "none":
        needs_fsdp.append(f"parallel.offload={par.offload}")
    if needs_fsdp:
        return StrategyChoice("fsdp", f"{', '.join(needs_fsdp)} composes with FSDP2")
    if par.nnodes > 1:  # each node's launcher chooses alone: the verdict must not hang on one node's memory
        return StrategyChoice("fsdp", f"{par.nnodes} nodes choose without talking to each other, and FSDP2 "
                                      "fits on each whatever its memory")
    link = "gloo on a CPU" if device_kind == "cpu" else "NCCL"
    replica = replica_memory(cfg, hardware, world, vocab_size)
    if replica is None:
        return StrategyChoice("fsdp", f"{world} processes; the memory of a whole replica is unknown, so FSDP2 shards it")
    need, capacity, fits = replica
    have = f"{need / GIB:,.2f} of {capacity / GIB:,.1f} GiB per process"
    if fits:
        cost = ("over gloo every collective is slow, and DDP sends each gradient once a step where FSDP2 gathers "
                "every unit's weights twice" if device_kind == "cpu" else "DDP sends each gradient once a step")
        return StrategyChoice("ddp", f"{world} processes, {link}; a whole replica fits ({have}): {cost}")
    return StrategyChoice("fsdp", f"{world} processes, {link}; a whole replica does not fit ({have}): "
                                  "FSDP2 shards weights, gradients and optimizer states")


def replica_memory(cfg, hardware: HardwareSpec, world: int,
                   vocab_size: int | None = None) -> tuple[float, float, bool] | None:
    """(bytes, capacity, fits) the planner predicts per process when every process holds the whole
    model (DDP); None when the planner cannot plan the model (its memory is unknown)."""
    from flopwise.config.resolve import resolve_run
    from flopwise.plan.from_config import planned_config
    from flopwise.plan.planner import plan_memory

    as_ddp = cfg.model_copy(update={"parallel": cfg.parallel.model_copy(update={"strategy": "ddp"})})
    try:
        planned = planned_config(as_ddp, resolve_run(as_ddp, world), vocab_size)
        memory = plan_memory(planned.on(hardware), check=False)  # peaks play no part in memory
    except Exception:  # an HF model the catalog cannot read, a shape the planner refuses: no verdict
        return None
    return memory.total_bytes, memory.capacity_bytes, memory.fits


def settle_strategy(cfg, hardware: HardwareSpec, device_kind: str, processes: int | None = None,
                    vocab_size: int | None = None) -> StrategyChoice:
    """Choose the strategy when `parallel.strategy` is unset and write it into `cfg` (so the run's
    config.yaml, its resume and `plan --config` on it read the same); returns the choice."""
    choice = choose_strategy(cfg, hardware, device_kind, processes, vocab_size)
    cfg.parallel.strategy = choice.strategy
    return choice
