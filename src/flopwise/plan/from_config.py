"""The only bridge from a training config to a RunSpec: what `flopwise train run.yaml` will run.

`flopwise plan --config run.yaml` and the trainer's `plan.json` both come from
`runspec_from_config`, so the plan describes the run, not a look-alike. Torch-free: it
reads the pydantic `RunConfig` (duck-typed, so the planner does not import the trainer)
and plain numbers.

FSDP2 is planned as FSDP (`framework="fsdp"`, full sharding = ZeRO stage 3), DeepSpeed as
DeepSpeed, and activation checkpointing of every k-th block as `every:K`; what the planner
does not model is said in `notes_for`. The measured figures are allocated bytes, so the plan
of a run carries no caching-allocator reserve.
"""

from __future__ import annotations

import math
from pathlib import Path

from flopwise.catalog.hardware import HardwareSpec
from flopwise.catalog.models import ModelSpec, from_hf_config
from flopwise.errors import UserError
from flopwise.config.precision import precision_of
from flopwise.plan.finetune import config_fields
from flopwise.plan.spec import Cluster, Layout, RunSpec, Workload

FFN_MULTIPLE_OF = 64


def runspec_from_config(cfg, hardware: HardwareSpec, world_size: int | None = None,
                        vocab_size: int | None = None) -> RunSpec:
    """The RunSpec of the run `cfg` describes: same model, layout, precision, optimizer and token budget.

    `world_size` defaults to the processes the config launches (`nproc_per_node x nnodes`,
    one for `single`); `vocab_size` to `data.vocab_size` (the trainer passes the size its
    tokenizer actually has).
    """
    world = world_size if world_size is not None else processes_of(cfg.parallel)
    vocab = vocab_size if vocab_size is not None else cfg.data.vocab_size
    strategy = cfg.parallel.strategy
    pipeline = strategy == "pipeline"
    micro_per_pass = cfg.parallel.pipeline_microbatches if pipeline else 1
    par = cfg.parallel
    tp = par.tp
    # a pipeline takes what tp and the replicas leave unless parallel.pp says otherwise (train/parallel/mesh.py)
    pp = (par.pp or world // (tp * par.dp_replicate)) if pipeline else 1
    dp = max(1, world // (tp * pp))  # tensor-parallel peers and pipeline stages read the same batch
    _, grad_accum = batch_layout(cfg.training, dp, micro_per_pass)
    every = cfg.training.checkpoint_every
    layout = Layout(
        dp=dp,
        tp=tp,
        sequence_parallel=cfg.parallel.sequence_parallel and tp > 1,
        dp_replicate=par.dp_replicate,
        pp=pp,
        micro_batch_size=cfg.training.micro_batch_size,
        # a pipeline pass is `pipeline_microbatches` micro-batches: the planner's accumulation count
        grad_accum=grad_accum * micro_per_pass,
        # FSDP2's full sharding shards parameters, gradients and optimizer states: ZeRO stage 3
        zero_stage=3 if strategy == "fsdp" or (pipeline and dp > 1) else (cfg.parallel.zero_stage if strategy == "deepspeed" else 0),
        framework="deepspeed" if strategy == "deepspeed" else "fsdp",
        offload=_offload_of(cfg.parallel),
        pipeline_schedule=_planned_schedule(cfg.parallel.pipeline_schedule),
        virtual_stages=par.pipeline_virtual_stages if pipeline else 1,
        interleaved_variant=_interleaved_variant(cfg.parallel.pipeline_schedule),
        # training.gradient_checkpointing: every block (full), every k-th block, or none
        recompute="none" if every == 0 else ("full" if every == 1 else f"every:{every}"),
        flash_attention=True,  # F.scaled_dot_product_attention picks a fused kernel on CPU and CUDA
    )
    seq_len = cfg.data.seq_len
    workload = Workload(
        precision=precision_of(cfg.precision.mode).compute_dtype,
        optimizer=cfg.training.optimizer,
        seq_len=seq_len,
        total_tokens=float(cfg.training.max_steps * layout.global_batch_size * seq_len),
        dropout=cfg.model.dropout > 0,
        **config_fields(getattr(cfg, "finetune", None)),  # LoRA / QLoRA (plan/finetune.py)
    )
    model = model_spec_from_config(cfg.model, vocab, seq_len)
    # the trainer measures allocated bytes: no caching-allocator reserve on top
    return RunSpec(model=model, layout=layout, workload=workload,
                   cluster=Cluster(hardware=hardware, allocator_reserve=0.0))


def notes_for(cfg) -> list[str]:
    """What the plan of `cfg` does not model exactly (shown next to the prediction)."""
    notes = []
    if cfg.training.activation_compression != "none":
        notes.append("prediction: int8 activation compression is not modelled by the planner")
    return notes


def _planned_schedule(schedule: str) -> str:
    """The planner's word for a trainer schedule. Looped BFS (Lamy-Poirier 2023, arXiv:2211.05953)
    and interleaved zero-bubble (Qi et al. 2024, arXiv:2401.10241) are planned as interleaved
    1F1B: the same (p-1)/(m*v) bubble, an upper bound for zero-bubble, which fills part of it;
    their memory differs and is told apart by `Layout.interleaved_variant`."""
    return "interleaved" if schedule in ("interleaved-1f1b", "looped-bfs", "interleaved-zero-bubble") else schedule


def _interleaved_variant(schedule: str) -> str:
    """Which interleaved schedule the trainer runs: the planner's memory model tells them apart."""
    return {"looped-bfs": "looped-bfs", "interleaved-zero-bubble": "zero-bubble"}.get(schedule, "1f1b")


def _offload_of(parallel) -> str:
    """What the run offloads: DeepSpeed as asked; FSDP2's CPUOffloadPolicy moves parameter shards,
    gradients and optimizer state together, which is the planner's "params"."""
    if parallel.offload == "none" or parallel.strategy not in ("deepspeed", "fsdp"):
        return "none"
    return parallel.offload if parallel.strategy == "deepspeed" else "params"


def processes_of(parallel) -> int:
    """Processes the config launches: one for `single`, else `nproc_per_node x nnodes`."""
    if parallel.strategy == "single":
        return 1
    return parallel.nproc_per_node * parallel.nnodes


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


# ------------------------------------------------------------------------- the model's numbers


def model_spec_from_config(model, vocab_size: int, seq_len: int) -> ModelSpec:
    """The planner's description of the network `train.model.build_model(model, vocab_size)` builds."""
    if model.kind == "hf":
        return from_hf_config(hf_config_path(model), seq_len=seq_len)
    check_shape(model)
    llama = model.kind == "llama"
    return ModelSpec(
        key=f"builtin-{model.kind}",
        name=f"built-in {model.kind} decoder ({model.n_layers}x{model.hidden})",
        arch="decoder",
        n_layers=model.n_layers,
        hidden=model.hidden,
        n_heads=model.n_heads,
        n_kv_heads=kv_heads_of(model),
        ffn_hidden=ffn_hidden_of(model),
        vocab_size=vocab_size,
        seq_len=seq_len,
        max_positions=model.max_seq_len,
        mlp="swiglu" if llama else "gelu",
        norm="rmsnorm" if llama else "layernorm",
        position="rope" if llama else "learned",
        tied_embeddings=model.tie_embeddings,
        attn_bias=not llama,
        mlp_bias=not llama,
        head_dim=model.hidden // model.n_heads,
        source="flopwise built-in decoder (train/model.py)",
    )


def llama_ffn_hidden(hidden: int, multiple_of: int = FFN_MULTIPLE_OF) -> int:
    """SwiGLU width that keeps the MLP's parameters at ~8h^2, as a 4h GELU MLP has.

    LLaMA's rule (Meta `llama/model.py`, FeedForward): int(2 * 4h / 3), rounded up to a
    multiple of `multiple_of` (Meta uses 256; 64 here so small models stay close to 8h/3).
    """
    width = int(2 * 4 * hidden / 3)
    return multiple_of * math.ceil(width / multiple_of)


def ffn_hidden_of(model) -> int:
    """The MLP width: `model.ffn_hidden`, else the LLaMA rule (llama) or 4h (gpt2)."""
    if model.ffn_hidden is not None:
        return model.ffn_hidden
    return llama_ffn_hidden(model.hidden) if model.kind == "llama" else 4 * model.hidden


def kv_heads_of(model) -> int:
    """Key/value heads: `model.n_kv_heads`, else one per query head (plain multi-head)."""
    return model.n_kv_heads if model.n_kv_heads is not None else model.n_heads


def check_shape(model) -> None:
    """Reject head layouts the attention cannot split, naming the config keys."""
    if model.hidden % model.n_heads:
        raise UserError(f"model.hidden={model.hidden} must be divisible by model.n_heads={model.n_heads}")
    n_kv = kv_heads_of(model)
    if model.n_heads % n_kv:
        raise UserError(f"model.n_heads={model.n_heads} must be a multiple of model.n_kv_heads={n_kv}")
    if model.kind == "llama" and (model.hidden // model.n_heads) % 2:
        raise UserError(
            f"model.hidden / model.n_heads = {model.hidden // model.n_heads} must be even for rotary embeddings"
        )


def hf_config_path(model) -> Path:
    """The config.json named by `model.hf_config` (a file, or a folder holding config.json)."""
    if model.hf_config is None:
        raise UserError("model.hf_config is required when model.kind=hf (path to a config.json)")
    path = Path(model.hf_config).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise UserError(f"model.hf_config: {path} does not exist")
    return path
