"""`ResolvedRun`: every number a run derives from its config, computed once after loading.

torchtitan's `ParallelDims` idea: the launcher (how many processes), the planner bridge
(`plan/from_config.py`, the layout it plans) and the trainer (the mesh it builds, how many
micro-steps make an optimizer step) read one frozen value instead of each re-deriving it,
so they cannot disagree. Torch-free.

`parallel.strategy=single` is one process, whatever `parallel.nproc_per_node` says.
"""

from __future__ import annotations

from dataclasses import dataclass

from flopwise.config.mesh_shape import MeshShape, mesh_shape_of
from flopwise.config.model_shape import check_shape, ffn_hidden_of, kv_heads_of
from flopwise.config.precision import Precision, precision_of
from flopwise.errors import UserError


@dataclass(frozen=True)
class ModelShape:
    """The built-in decoder's dimensions (`model.kind` llama or gpt2), defaults filled in."""

    kind: str
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    ffn_hidden: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_heads


@dataclass(frozen=True)
class ResolvedRun:
    """What a config means once its defaults and layout rules are applied."""

    processes: int  # in the whole job
    processes_per_node: int
    mesh: MeshShape  # pp x dp_replicate x dp_shard x tp = processes
    global_batch: int  # sequences per optimizer step
    grad_accum: int  # passes per optimizer step (a pass: one micro-batch per data-parallel rank, or a pipeline schedule)
    micro_batches_per_pass: int  # 1, or `parallel.pipeline_microbatches` for a pipeline
    precision: Precision
    seq_len: int
    model: ModelShape | None  # None for `model.kind=hf`: its shape is in its config.json

    @property
    def micro_batches_per_step(self) -> int:
        """Micro-batches one data-parallel rank runs per optimizer step (the planner's accumulation count)."""
        return self.grad_accum * self.micro_batches_per_pass

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len


def processes_of(parallel) -> int:
    """Processes the config launches: one for `single`, else `nproc_per_node x nnodes`."""
    return 1 if parallel.strategy == "single" else parallel.nproc_per_node * parallel.nnodes


def processes_per_node_of(parallel) -> int:
    """Processes on each node: one for `single`, else `nproc_per_node`."""
    return 1 if parallel.strategy == "single" else parallel.nproc_per_node


def batch_layout(training, world_size: int, micro_batches_per_pass: int = 1) -> tuple[int, int]:
    """(global batch in sequences, accumulation passes); the global batch defaults to one pass.

    A pass is one micro-batch on each of `world_size` data-parallel ranks, or, for a
    pipeline, `micro_batches_per_pass` micro-batches through the stages.
    """
    per_pass = training.micro_batch_size * world_size * micro_batches_per_pass
    global_batch = training.global_batch_size or per_pass
    if global_batch % per_pass:
        what = "processes" if micro_batches_per_pass == 1 else "parallel.pipeline_microbatches"
        count = world_size if micro_batches_per_pass == 1 else micro_batches_per_pass
        raise UserError(
            f"training.global_batch_size: {global_batch} is not a multiple of micro_batch_size x {what} "
            f"= {training.micro_batch_size} x {count} (allowed e.g. {per_pass}, {2 * per_pass}, {4 * per_pass})"
        )
    return global_batch, global_batch // per_pass


def model_shape_of(model) -> ModelShape | None:
    """The built-in decoder's dimensions, checked; None for an HF model."""
    if model.kind == "hf":
        return None
    check_shape(model)
    return ModelShape(kind=model.kind, n_layers=model.n_layers, hidden=model.hidden, n_heads=model.n_heads,
                      n_kv_heads=kv_heads_of(model), ffn_hidden=ffn_hidden_of(model))


def resolve_run(cfg, processes: int | None = None) -> ResolvedRun:
    """The run `cfg` describes; `processes` is the world actually joined (a trainer rank), else the config's."""
    parallel = cfg.parallel
    world = processes if processes is not None else processes_of(parallel)
    mesh = mesh_shape_of(parallel, world)
    per_pass = parallel.pipeline_microbatches if parallel.strategy == "pipeline" else 1
    global_batch, grad_accum = batch_layout(cfg.training, mesh.dp, per_pass)
    return ResolvedRun(
        processes=world,
        processes_per_node=processes_per_node_of(parallel) if processes is None else max(1, world // parallel.nnodes),
        mesh=mesh,
        global_batch=global_batch,
        grad_accum=grad_accum,
        micro_batches_per_pass=per_pass,
        precision=precision_of(cfg.precision.mode),
        seq_len=cfg.data.seq_len,
        model=model_shape_of(cfg.model),
    )
