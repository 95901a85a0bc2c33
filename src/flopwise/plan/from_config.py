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

import dataclasses
from dataclasses import dataclass

from flopwise.catalog.hardware import HardwareSpec
from flopwise.catalog.models import ModelSpec, from_hf_config
from flopwise.config.model_shape import check_shape, ffn_hidden_of, hf_config_path, kv_heads_of
from flopwise.config.resolve import ResolvedRun
from flopwise.plan.activation_offload import parse_blocks
from flopwise.plan.finetune import config_fields
from flopwise.plan.spec import Cluster, Layout, RunSpec, Workload


@dataclass(frozen=True)
class PlannedConfig:
    """What a training config means to the planner before a device is chosen, and what it does not model."""

    model: ModelSpec
    layout: Layout
    workload: Workload
    notes: tuple[str, ...]

    def on(self, hardware: HardwareSpec) -> RunSpec:
        """The RunSpec on `hardware`; the trainer measures allocated bytes, so no caching-allocator reserve."""
        return RunSpec(model=self.model, layout=self.layout, workload=self.workload,
                       cluster=Cluster(hardware=hardware, allocator_reserve=0.0))


def runspec_from_config(cfg, run: ResolvedRun, hardware: HardwareSpec, vocab_size: int | None = None) -> RunSpec:
    """The RunSpec of the run `cfg` describes: same model, layout, precision, optimizer and token budget."""
    return planned_config(cfg, run, vocab_size).on(hardware)


def planned_config(cfg, run: ResolvedRun, vocab_size: int | None = None) -> PlannedConfig:
    """The planner's model, layout and workload for `cfg`, and the notes on what it leaves out.

    Processes, mesh, batch and precision are `run`'s (`config/resolve.py`), the numbers the
    launcher and the trainer use; `vocab_size` defaults to `data.vocab_size` (the trainer
    passes the size its tokenizer actually has).
    """
    vocab = vocab_size if vocab_size is not None else cfg.data.vocab_size
    # unset and not chosen yet (the trainer and `plan --config` choose first: plan/default_strategy.py):
    # planned as FSDP2, the layout that needs the least memory
    strategy = cfg.parallel.strategy or "fsdp"
    pipeline = strategy == "pipeline"
    par = cfg.parallel
    mesh = run.mesh
    tp, pp, dp = mesh.tp, mesh.pp, mesh.dp  # tensor-parallel peers and pipeline stages read the same batch
    every = cfg.training.checkpoint_every
    layout = Layout(
        dp=dp,
        tp=tp,
        sequence_parallel=cfg.parallel.sequence_parallel and tp > 1,
        dp_replicate=mesh.dp_replicate,
        pp=pp,
        micro_batch_size=cfg.training.micro_batch_size,
        # a pipeline pass is `pipeline_microbatches` micro-batches: the planner's accumulation count
        grad_accum=run.micro_batches_per_step,
        # FSDP2's full sharding shards parameters, gradients and optimizer states: ZeRO stage 3
        zero_stage=3 if strategy == "fsdp" or (pipeline and dp > 1) else (cfg.parallel.zero_stage if strategy == "deepspeed" else 0),
        framework="deepspeed" if strategy == "deepspeed" else "fsdp",
        offload=_offload_of(cfg.parallel, strategy),
        pipeline_schedule=_planned_schedule(cfg.parallel.pipeline_schedule),
        virtual_stages=par.pipeline_virtual_stages if pipeline else 1,
        interleaved_variant=_interleaved_variant(cfg.parallel.pipeline_schedule),
        # training.gradient_checkpointing: every block (full), every k-th block, or none
        recompute="none" if every == 0 else ("full" if every == 1 else f"every:{every}"),
        flash_attention=True,  # F.scaled_dot_product_attention picks a fused kernel on CPU and CUDA
        compiled=cfg.training.compile,  # each block under torch.compile (train/build.py)
        fsdp_sync_every_micro_step=strategy == "fsdp" and par.fsdp_grad_sync == "every_micro_step",
        fsdp_unit_mb=par.fsdp_unit_mb if strategy in ("fsdp", "pipeline") else 0.0,
        # training.offload_activations: the first N blocks (a stage's, at pp 1 the model's) or all
        offload_activations=parse_blocks(cfg.training.offload_activations),
    )
    seq_len = cfg.data.seq_len
    workload = Workload(
        # pure bf16 (`bf16-true`) keeps no fp32 master copy: planned as such, not as mixed bf16
        precision="bf16-true" if run.precision.pure else run.precision.compute_dtype,
        optimizer=cfg.training.optimizer,
        seq_len=seq_len,
        total_tokens=float(cfg.training.max_steps * layout.global_batch_size * seq_len),
        dropout=cfg.model.dropout > 0,
        **config_fields(getattr(cfg, "finetune", None)),  # LoRA / QLoRA (plan/finetune.py)
    )
    if _amp(run.precision, strategy) and workload.finetune == "full":
        # plain bf16/fp16 (and `*-params` without FSDP2): fp32 parameters under torch.autocast
        # (train/techniques/precision.py), planned with AMP's fp32 weights, gradients and bf16 copies
        workload = dataclasses.replace(workload, fp32_params=True)
    return PlannedConfig(model=model_spec_from_config(cfg.model, vocab, seq_len), layout=layout,
                         workload=workload, notes=tuple(notes_for(cfg)))



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


def _amp(precision, strategy: str) -> bool:
    """Whether the trainer keeps fp32 parameters under autocast: a 16-bit mode that is not pure, whose
    FSDP2 parameter dtype is fp32 (DeepSpeed casts the model to its own 16-bit dtype)."""
    return (precision.compute_dtype in ("bf16", "fp16") and not precision.pure and precision.param_dtype == "fp32"
            and strategy != "deepspeed")


def _offload_of(parallel, strategy: str) -> str:
    """What the run offloads: DeepSpeed as asked; FSDP2's CPUOffloadPolicy moves parameter shards,
    gradients and optimizer state together, which is the planner's "params"."""
    if parallel.offload == "none" or strategy not in ("deepspeed", "fsdp"):
        return "none"
    return parallel.offload if strategy == "deepspeed" else "params"


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
