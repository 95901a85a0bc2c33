"""The planner's forecast for one node of a job, for the comments of an sbatch script or a manifest.

The forecast is the one the trainer itself writes into `plan.json` before step 1
(`plan.from_config.runspec_from_config`: same model, layout, precision, optimizer and token budget),
planned for the job's GPU from the hardware catalog instead of the device found at run time.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from flopwise.config.schema import RunConfig

GIB = 2**30


@dataclass(frozen=True)
class NodeForecast:
    """Per-node figures of the planned job (memory is per GPU; the busiest one)."""

    hardware_key: str
    hardware_name: str
    nodes: int
    gpus_per_node: int
    precision: str
    memory_gib: float
    usable_gib: float
    fits: bool
    weights_gib: float
    gradients_gib: float
    optimizer_gib: float
    activations_gib: float
    step_seconds: float
    exposed_comm_seconds: float
    tokens_per_second: float  # the whole job
    mfu: float
    efficiency_source: str
    watts_per_gpu: float | None  # TDP from the catalog
    pue: float

    @property
    def tokens_per_second_per_node(self) -> float:
        """The job's throughput shared equally by its nodes (data parallelism keeps them in step)."""
        return self.tokens_per_second / self.nodes

    @property
    def watts_per_node(self) -> float | None:
        """GPUs at TDP, the planner's energy assumption (host CPUs, NICs and fans not counted)."""
        return None if self.watts_per_gpu is None else self.watts_per_gpu * self.gpus_per_node


def forecast_node(cfg: RunConfig, hardware_key: str) -> NodeForecast:
    """Plan `cfg` on `cfg.parallel.nnodes` nodes of `nproc_per_node` GPUs of `hardware_key` (a UserError if it cannot)."""
    from flopwise.catalog.hardware import get_hardware
    from flopwise.plan.from_config import runspec_from_config
    from flopwise.plan.memory import ALLOCATOR_RESERVE_FRACTION
    from flopwise.plan.planner import plan
    from flopwise.config.resolve import resolve_run

    hardware = get_hardware(hardware_key)
    if cfg.parallel.strategy is None:  # plan what the job will pick on these GPUs (plan/default_strategy.py)
        from flopwise.plan.default_strategy import settle_strategy

        cfg = cfg.model_copy(deep=True)
        settle_strategy(cfg, hardware, "cuda")
    run = resolve_run(cfg)
    runspec = runspec_from_config(cfg, run, hardware)
    # A job on real GPUs is judged by reserved memory (what nvidia-smi and published runs show): the
    # allocator's reserve goes back on top of the allocated bytes the trainer's own plan.json compares.
    runspec = dataclasses.replace(runspec, cluster=dataclasses.replace(
        runspec.cluster, devices_per_node=run.processes_per_node, allocator_reserve=ALLOCATOR_RESERVE_FRACTION))
    result = plan(runspec)
    memory, time = result.memory, result.time
    return NodeForecast(
        hardware_key=hardware.key,
        hardware_name=hardware.name,
        nodes=cfg.parallel.nnodes,
        gpus_per_node=run.processes_per_node,
        precision=runspec.workload.precision,
        memory_gib=memory.total_bytes / GIB,
        usable_gib=memory.capacity_bytes / GIB,
        fits=memory.fits,
        weights_gib=(memory.weights + memory.master_weights) / GIB,
        gradients_gib=memory.gradients / GIB,
        optimizer_gib=memory.optimizer_states / GIB,
        activations_gib=(memory.activations + memory.logits) / GIB,
        step_seconds=time.step_seconds,
        exposed_comm_seconds=time.exposed_comm_seconds,
        tokens_per_second=time.tokens_per_second,
        mfu=time.mfu,
        efficiency_source=time.efficiency_source,
        watts_per_gpu=result.energy.watts_per_device,
        pue=runspec.cluster.pue,
    )


def forecast_lines(forecast: NodeForecast) -> list[str]:
    """The forecast as comment text (no comment marker), one figure per line, each with its source."""
    f = forecast
    power = ("power per node: unknown (the catalog has no TDP for this device)" if f.watts_per_node is None else
             f"power per node: {f.gpus_per_node} x {f.watts_per_gpu:g} W = {f.watts_per_node / 1000:.1f} kW "
             f"at TDP ({f.watts_per_node * f.pue / 1000:.1f} kW with PUE {f.pue:g}); "
             f"TDP from `flopwise hardware {f.hardware_key}`")
    return [
        f"Planner forecast (`flopwise plan`, docs/planner.md) for {f.nodes} node(s) x {f.gpus_per_node} "
        f"{f.hardware_name}, {f.precision}:",
        f"  memory per GPU: {f.memory_gib:.1f} GiB of {f.usable_gib:.1f} GiB usable"
        f"{'' if f.fits else ' (DOES NOT FIT)'} = weights (with fp32 master copy) {f.weights_gib:.1f} + gradients {f.gradients_gib:.1f}"
        f" + optimizer {f.optimizer_gib:.1f} + activations {f.activations_gib:.1f} GiB (+ buffers)",
        f"  step time: {f.step_seconds:.3g} s, of which {f.exposed_comm_seconds:.3g} s exposed communication",
        f"  tokens/s per node: {f.tokens_per_second_per_node:,.0f} ({f.tokens_per_second:,.0f} for the job, "
        f"MFU {f.mfu:.0%}; efficiency: {f.efficiency_source})",
        f"  {power}",
        "The run writes the same forecast to RUN_DIR/plan.json and compares it with what it measured in "
        "RUN_DIR/predicted_vs_measured.json.",
    ]
