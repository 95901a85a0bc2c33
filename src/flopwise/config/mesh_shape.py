"""The mesh shape of a run: pipeline × replicate × shard × tensor, checked against the processes.

The world is split as torchtitan does (`ParallelDims`): `pp` outermost, then data
parallelism as `dp_replicate` (HSDP's replicas, or DDP) × `dp_shard` (FSDP2's shards),
then `tp` innermost so tensor-parallel peers are neighbours (same node on real clusters,
where the fastest link is). The product must equal the world size; `dp_shard = -1` means
"whatever is left". Torch-free, so the launcher and the planner read the shape the trainer
builds (`train/parallel/mesh.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from flopwise.errors import UserError

DIMS = ("pp", "dp_replicate", "dp_shard", "tp")


@dataclass(frozen=True)
class MeshShape:
    """Sizes of the four parallel dimensions; their product is the world size."""

    pp: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1

    @property
    def dp(self) -> int:
        """Data-parallel degree: how many different batches one step sees."""
        return self.dp_replicate * self.dp_shard

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.tp

    def dp_rank_of(self, rank: int) -> int:
        """The data-parallel replica global `rank` belongs to: who reads which batch.

        Mesh ranks are row-major over (pp, dp_replicate, dp_shard, tp): the `tp` neighbours of
        one data-parallel rank, and its peers in the other pipeline stages, read the same batch.
        """
        return (rank // self.tp) % self.dp

    def describe(self) -> str:
        """e.g. 'pp 2 x dp_shard 2 x tp 2' (dimensions of size 1 left out)."""
        parts = [f"{name} {getattr(self, name)}" for name in DIMS if getattr(self, name) > 1]
        return " x ".join(parts) or "single process"


def mesh_shape(world_size: int, *, pp: int = 1, dp_replicate: int = 1, dp_shard: int = -1, tp: int = 1) -> MeshShape:
    """The shape for `world_size` processes; `dp_shard=-1` takes what the others leave."""
    for name, value in (("parallel.pp", pp), ("parallel.dp_replicate", dp_replicate), ("parallel.tp", tp)):
        if value < 1:
            raise UserError(f"{name} must be >= 1 (got {value})")
    fixed = pp * dp_replicate * tp
    if dp_shard == -1:
        if world_size % fixed:
            raise UserError(
                f"parallel.pp x parallel.dp_replicate x parallel.tp = {fixed} must divide the "
                f"{world_size} processes (nnodes x nproc_per_node)"
            )
        dp_shard = world_size // fixed
    elif dp_shard < 1:
        raise UserError(f"parallel.dp_shard must be >= 1 or -1 (got {dp_shard})")
    shape = MeshShape(pp=pp, dp_replicate=dp_replicate, dp_shard=dp_shard, tp=tp)
    if shape.world_size != world_size:
        raise UserError(
            f"parallel: pp {pp} x dp_replicate {dp_replicate} x dp_shard {dp_shard} x tp {tp} = "
            f"{shape.world_size}, but there are {world_size} processes"
        )
    return shape


def mesh_shape_of(parallel, world_size: int) -> MeshShape:
    """The shape `parallel.{pp, dp_replicate, dp_shard, tp}` asks for on `world_size` processes, checked.

    A pipeline without `parallel.pp` takes every process the other dimensions leave; with
    `dp_shard` > 1 its stages are FSDP2-sharded (PP x FSDP2), with `tp` > 1 tensor-parallel.
    Tensor parallelism and HSDP replicas compose with FSDP2 and pipelines only; DDP,
    DeepSpeed and a single process keep every process a whole-model data-parallel replica.
    """
    # strategy None (not chosen yet: plan/default_strategy.py) reads as what the layout asks for: pipeline
    # stages mean a pipeline, tensor parallelism and replicas FSDP2
    pipeline = parallel.strategy == "pipeline" or (parallel.strategy is None and (parallel.pp or 1) > 1)
    if pipeline:
        pp = parallel.pp if parallel.pp is not None else world_size // (parallel.tp * parallel.dp_replicate)
    else:
        pp = 1 if parallel.pp is None else parallel.pp
    if pp > 1 and not pipeline:
        raise UserError(f"parallel.pp={pp} needs parallel.strategy=pipeline (got {parallel.strategy})")
    if parallel.strategy not in ("fsdp", "pipeline", None):
        for key in ("tp", "dp_replicate"):
            if getattr(parallel, key) > 1:
                raise UserError(
                    f"parallel.{key}={getattr(parallel, key)} composes with FSDP2 only; set parallel.strategy=fsdp "
                    f"(got {parallel.strategy}) or parallel.{key}=1"
                )
    if pipeline and parallel.sequence_parallel:
        raise UserError("parallel.sequence_parallel=true is not supported with a pipeline (stages pass whole "
                        "sequences); set it to false")
    if parallel.sequence_parallel and parallel.tp == 1:
        raise UserError("parallel.sequence_parallel=true needs parallel.tp > 1")
    return mesh_shape(world_size, pp=pp, dp_replicate=parallel.dp_replicate, dp_shard=parallel.dp_shard,
                      tp=parallel.tp)
