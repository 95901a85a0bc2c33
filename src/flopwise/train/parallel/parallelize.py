"""How a strategy is applied to the model, from outside (torchtitan's `parallelize`).

`build.py` calls these, and only it, in its fixed order: `parallelize_model` wraps the
built model (DDP, FSDP2, or this rank's pipeline stage); `attach_strategy` adds what
needs the optimizer first (DeepSpeed's engine, the pipeline schedule) and returns the
`Strategy` the one `train_step` drives. Nothing here re-implements a collective, a
sharding scheme or a schedule.
"""

from __future__ import annotations

import copy

from torch import nn

from flopwise.errors import UserError
from flopwise.plan.fsdp_units import MIB, group_blocks
from flopwise.plan.timing import split_layers
from flopwise.config.mesh_shape import MeshShape, mesh_shape_of
from flopwise.config.resolve import ResolvedRun, processes_of
from flopwise.config.schema import ParallelConfig, RunConfig
from flopwise.train.parallel.distributed import DistEnv
from flopwise.train.parallel.mesh import dp_mesh_of
from flopwise.train.step import Strategy
from flopwise.train.parallel.strategy_deepspeed import DeepSpeedStrategy
from flopwise.train.parallel.strategy_pipeline import PipelineStrategy
from flopwise.train.parallel.strategy_torch import TorchStrategy

STRATEGIES_AVAILABLE = ("single", "ddp", "fsdp", "deepspeed", "pipeline")


def check_strategy(cfg: ParallelConfig) -> None:
    """Fail before any process starts when the strategy has no implementation or cannot run as set."""
    if cfg.strategy not in STRATEGIES_AVAILABLE:
        raise UserError(
            f"parallel.strategy: {cfg.strategy} is not available in this version "
            f"(allowed: {', '.join(STRATEGIES_AVAILABLE)})"
        )
    if cfg.strategy == "deepspeed":
        check_deepspeed_config(cfg)
    mesh_shape_of(cfg, processes_of(cfg))
    if cfg.pipeline_virtual_stages > 1 and cfg.pipeline_schedule not in MULTI_STAGE_SCHEDULES:
        raise UserError(
            f"parallel.pipeline_virtual_stages={cfg.pipeline_virtual_stages} needs a schedule with several "
            f"stages per process (parallel.pipeline_schedule: {', '.join(MULTI_STAGE_SCHEDULES)}; got {cfg.pipeline_schedule})"
        )
    if cfg.offload != "none" and cfg.strategy not in ("fsdp", "deepspeed"):
        raise UserError(f"parallel.offload: {cfg.offload} needs parallel.strategy fsdp or deepspeed "
                        f"(got {cfg.strategy}; allowed here: none)")


def check_deepspeed_config(cfg: ParallelConfig) -> None:
    """Reject ZeRO / offload combinations DeepSpeed cannot run, before any process starts."""
    if cfg.offload == "params" and cfg.zero_stage != 3:
        raise UserError(
            f"parallel.offload: params offloads ZeRO-3 parameter shards and needs parallel.zero_stage=3 "
            f"(got {cfg.zero_stage}; allowed with stage {cfg.zero_stage}: none"
            f"{', optimizer' if cfg.zero_stage else ''})"
        )
    if cfg.offload == "optimizer" and cfg.zero_stage == 0:
        raise UserError("parallel.offload: optimizer offload needs parallel.zero_stage >= 1 (allowed at stage 0: none)")


def build_device_mesh(cfg: ParallelConfig, env: DistEnv, shape: MeshShape):
    """The run's one DeviceMesh of `shape` (`ResolvedRun.mesh`), for FSDP2 over a process group; (None, shape) otherwise."""
    from flopwise.train.parallel.mesh import build_mesh

    composed_pipeline = cfg.strategy == "pipeline" and shape.pp < env.world_size
    if not env.distributed or not (cfg.strategy == "fsdp" or composed_pipeline):
        return None, shape
    return build_mesh(shape, env.device.type), shape


def apply_tensor_parallel(model: nn.Module, cfg: ParallelConfig, env: DistEnv, mesh) -> nn.Module:
    """Shard the linear layers over the mesh's `tp` dimension (`tensor_parallel.apply_tp`), before anything wraps them."""
    from flopwise.train.parallel.tensor_parallel import apply_tp

    import warnings

    if not any(p.is_meta for p in model.parameters()):
        model.to(env.device)  # DTensors are placed on the mesh's device
    # The replicated LM-head output is a view of the gathered logits; the loss reads it out of
    # place, so FSDP2's warning about in-place ops on a view (once per step) does not apply.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    return apply_tp(model, mesh["tp"], sequence_parallel=cfg.sequence_parallel)


def parallelize_model(model: nn.Module, blocks: nn.ModuleList, cfg: ParallelConfig, env: DistEnv,
                      mp_policy=None, mesh=None, shape: MeshShape | None = None) -> nn.Module:
    """Apply the strategy's wrapping; returns the module the step calls.

    `mp_policy` is FSDP2's `MixedPrecisionPolicy` for the `*-params` modes; `mesh` the run's
    DeviceMesh (`build_device_mesh`). DeepSpeed's engine needs the optimizer, so
    `attach_strategy` builds it later.
    """
    if not any(p.is_meta for p in model.parameters()):  # a meta model (pretrained, FSDP2) is filled after sharding
        model.to(env.device)
    if cfg.strategy == "ddp":
        return apply_ddp(model, cfg, env)
    if cfg.strategy == "fsdp":
        return apply_fsdp(model, blocks, cfg, env, mp_policy, mesh, shape)
    if cfg.strategy == "pipeline":
        stages = apply_pipeline_stage(model, cfg, env, mesh)
        if shape is not None and shape.dp > 1:  # PP x FSDP2: each stage sharded over its data-parallel peers
            # torch's schedule keeps a stage unsharded from its first backward to the last
            # (`backward_maybe_with_nosync`): resharding after each forward would only gather
            # the stage again for every micro-batch (torchtitan does not reshard under PP)
            stage_cfg = cfg.model_copy(update={"fsdp_reshard_after_forward": False})
            for chunk in stages.chunks:
                apply_fsdp(chunk, chunk.blocks, stage_cfg, env, mp_policy, mesh, shape)
        return stages
    return model  # single, deepspeed


def apply_ddp(model: nn.Module, cfg: ParallelConfig, env: DistEnv) -> nn.Module:
    """`DistributedDataParallel` with the configured bucket size."""
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [env.device.index] if env.device.type == "cuda" else None
    frozen = [name for name, p in model.named_parameters() if not p.requires_grad]
    if frozen:  # a LoRA/QLoRA base: the same pretrained weights on every rank, never updated, so
        # DDP neither broadcasts it at start (NF4 tensors cannot be) nor reduces anything for it
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, frozen)
    # Non-persistent buffers (RoPE tables) are derived from the config and equal on every rank:
    # broadcasting them before each forward would only add a collective (and a hidden wait).
    return DistributedDataParallel(model, device_ids=device_ids, bucket_cap_mb=cfg.ddp_bucket_mb,
                                   broadcast_buffers=_has_persistent_buffers(model))


def apply_fsdp(model: nn.Module, blocks: nn.ModuleList, cfg: ParallelConfig, env: DistEnv, mp_policy,
               mesh=None, shape: MeshShape | None = None) -> nn.Module:
    """FSDP2 `fully_shard`: the transformer blocks in units, then large other children, then the root.

    Shards over the mesh's data-parallel part: "dp_shard", or ("dp_replicate", "dp_shard")
    for HSDP (replicas of a sharded group; gradients reduce-scattered within a group, then
    all-reduced across groups). Tensor-parallel DTensors become 2-D (dp, tp) shards.
    `parallel.offload` (params or optimizer) is FSDP2's `CPUOffloadPolicy`: parameter
    shards, their gradients and so the optimizer step live in host memory (FSDP2 offloads
    the three together; there is no optimizer-only mode).

    Consecutive blocks share a unit until it holds `fsdp_unit_mb` MiB of parameters
    (`plan.fsdp_units.group_blocks`; 0 = one unit per block): fewer units pay the fixed cost
    of each all-gather and reduce-scatter fewer times, and two units are gathered at once.
    Grouping changes no parameter's name, so checkpoints load across unit sizes.

    Other direct children holding at least `fsdp_min_params` parameters get their own
    unit (a size-based policy; modules sharing a parameter, such as tied embeddings,
    stay with the root). The root is not resharded after forward because backward
    needs it at once (as in torchtitan).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    dp_mesh = dp_mesh_of(mesh, shape) if mesh is not None else init_device_mesh(env.device.type, (env.world_size,))
    offload = CPUOffloadPolicy(pin_memory=env.device.type == "cuda") if cfg.offload != "none" else OffloadPolicy()
    options = {"mesh": dp_mesh, "mp_policy": mp_policy or MixedPrecisionPolicy(), "offload_policy": offload}
    ordered = list(blocks)
    for group in group_blocks([_parameter_bytes(block) for block in ordered], cfg.fsdp_unit_mb * MIB):
        members = [ordered[i] for i in group]
        fully_shard(members if len(members) > 1 else members[0],
                    reshard_after_forward=cfg.fsdp_reshard_after_forward, **options)
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


MULTI_STAGE_SCHEDULES = ("interleaved-1f1b", "looped-bfs", "interleaved-zero-bubble")


def stage_layer_ranges(n_layers: int, stages: int, virtual: int = 1) -> list[tuple[int, int]]:
    """[start, stop) block ranges of the `stages x virtual` pipeline stages, in stage order.

    The counts are the planner's one split rule (`plan.timing.split_layers`: even, the
    remainder to the middle stages first), so the trained split is the planned one.
    Stage s runs on process s mod `stages`.
    """
    chunks = stages * virtual
    if chunks > n_layers:
        raise UserError(
            f"parallel.strategy: pipeline needs at least one transformer block per stage, but "
            f"model.n_layers={n_layers} is fewer than the {chunks} stages (processes x "
            f"parallel.pipeline_virtual_stages); raise model.n_layers or use fewer stages"
        )
    per_device = split_layers(n_layers, stages, virtual)
    counts = [per_device[c % stages][c // stages] for c in range(chunks)]
    ranges, start = [], 0
    for count in counts:
        ranges.append((start, start + count))
        start += count
    return ranges


class StageBlocks(nn.ModuleList):
    """A stage's blocks, named by their index in the whole model (`blocks.3`, not `blocks.0`).

    So every stage's parameter names are the whole model's (torchtitan keeps its layers in a
    dict for the same reason): the stages' checkpoint keys are disjoint, and DCP, which
    keeps one copy of a key that several ranks write, never mixes two stages' blocks.
    Iteration and `len` are ModuleList's; indexing is by position within the stage.
    """

    def __init__(self, blocks, start: int):
        super().__init__()
        for offset, block in enumerate(blocks):
            self.add_module(str(start + offset), block)

    def __getitem__(self, index):
        return list(self._modules.values())[index]


class PipelineChunks(nn.Module):
    """The stages one process runs (several under an interleaved schedule), as one module for the optimizer."""

    def __init__(self, chunks: list[nn.Module], stage_indices: list[int], total_parameters: int):
        super().__init__()
        self.chunks = nn.ModuleList(chunks)
        self.stage_indices = stage_indices
        self.total_parameters = total_parameters  # the whole model, for the run header


def apply_pipeline_stage(model: nn.Module, cfg: ParallelConfig, env: DistEnv, mesh=None) -> nn.Module:
    """This rank's stage(s): the same decoder with the other stages' layers removed.

    The embedding stays on the first stage, the final norm and LM head on the last; the
    decoder's own forward skips what is absent (torchtitan's pipeline pattern), so no
    second forward exists to drift from the first. With `pipeline_virtual_stages` v > 1
    the process runs v such chunks, stages rank, rank + p, ... (Narayanan et al. 2021, §2.2).
    """
    if not hasattr(model, "tok_emb") or not hasattr(model, "blocks"):
        raise UserError(
            "parallel.strategy: pipeline splits the built-in decoder (model.kind llama or gpt2); "
            "for model.kind=hf use ddp, fsdp or deepspeed"
        )
    pp_rank, pp = (mesh["pp"].get_local_rank(), mesh["pp"].size()) if mesh is not None else (env.rank, env.world_size)
    if model.cfg.tie_embeddings and pp > 1:
        raise UserError(
            "model.tie_embeddings: a pipeline puts the embedding and the LM head on different stages, "
            "so they cannot share a weight (set model.tie_embeddings=false, or use ddp, fsdp or deepspeed)"
        )
    virtual = cfg.pipeline_virtual_stages
    total = sum(p.numel() for p in model.parameters())
    ranges = stage_layer_ranges(len(model.blocks), pp, virtual)
    indices = [pp_rank + c * pp for c in range(virtual)]
    chunks = [_keep_stage(copy.deepcopy(model) if virtual > 1 else model, ranges, index) for index in indices]
    return PipelineChunks(chunks, indices, total).to(env.device)


def _keep_stage(model: nn.Module, ranges: list[tuple[int, int]], index: int) -> nn.Module:
    start, stop = ranges[index]
    if index > 0:
        model.tok_emb = None
        model.pos_emb = None
    model.blocks = StageBlocks(model.blocks[start:stop], start)
    if index < len(ranges) - 1:
        model.final_norm = None
        model.lm_head = None
    model.stage_blocks = (start, stop)
    return model


def attach_strategy(state, cfg: RunConfig, env: DistEnv, run: ResolvedRun) -> Strategy:
    """The `Strategy` that drives this run's step: DeepSpeed's engine, a pipeline schedule, or plain torch.

    DeepSpeed and the pipeline schedule need the optimizer (and the loss scaler), so
    they are attached once the `TrainState` exists.
    """
    if cfg.parallel.strategy == "deepspeed":
        return DeepSpeedStrategy(state, cfg, env, run)
    if cfg.parallel.strategy == "pipeline":
        return PipelineStrategy(state, cfg.parallel, run.precision, cfg.training.grad_clip, env,
                                state.built.pp_group)
    every = cfg.parallel.strategy == "fsdp" and cfg.parallel.fsdp_grad_sync == "every_micro_step"
    return TorchStrategy(state, run.precision, cfg.training.grad_clip, env, sync_every_micro_step=every)


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module under a DDP wrapper (FSDP2 shards in place, so it is the module itself)."""
    return model.module if hasattr(model, "no_sync") and hasattr(model, "module") else model


def _has_persistent_buffers(model: nn.Module) -> bool:
    """Whether any buffer is state (e.g. running statistics) rather than a table derived from the config."""
    return any(
        name not in module._non_persistent_buffers_set
        for module in model.modules()
        for name, _ in module.named_buffers(recurse=False)
    )


def _parameter_bytes(module: nn.Module) -> int:
    """Bytes of a module's parameters as built (meta tensors included): what one FSDP2 unit shards."""
    return sum(p.numel() * p.element_size() for p in module.parameters())


def _shared_parameter_ids(model: nn.Module) -> set[int]:
    owners: dict[int, int] = {}
    for module in model.modules():
        for param in module.parameters(recurse=False):
            owners[id(param)] = owners.get(id(param), 0) + 1
    return {pid for pid, count in owners.items() if count > 1}
