"""The run configuration: one typed schema, one section per module.

Loaded from YAML (safe loader) with dotted `key=value` overrides; every mistake is
reported as one line naming the key path and what is allowed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from flopwise.plan.precision_mode import precision_of


class Section(BaseModel):
    """Base for config sections: unknown keys are errors, values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(Section):
    """The network: the built-in decoder (llama- or gpt2-style) or a HF config.json."""

    kind: Literal["llama", "gpt2", "hf"] = "llama"
    hf_config: Path | None = None
    trust_remote_code: bool = False
    n_layers: int = Field(4, ge=1)
    hidden: int = Field(192, ge=8)
    n_heads: int = Field(6, ge=1)
    n_kv_heads: int | None = Field(None, ge=1)
    ffn_hidden: int | None = Field(None, ge=1)
    max_seq_len: int = Field(256, ge=8)
    tie_embeddings: bool = False
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    norm_eps: float = Field(1e-5, gt=0)
    rope_theta: float = Field(10000.0, gt=0)


class DataConfig(Section):
    """Where the tokens come from. Empty `paths` means the Python standard library's source."""

    paths: list[str] = Field(default_factory=list)
    format: Literal["auto", "text", "jsonl", "tfrecord", "tokens"] = "auto"
    text_field: str = "text"
    token_dtype: Literal["uint16", "uint32"] = "uint16"
    tokenizer: Path | None = None
    vocab_size: int = Field(4096, ge=260)
    seq_len: int = Field(128, ge=8)
    val_fraction: float = Field(0.02, gt=0.0, lt=0.5)
    cache_dir: Path = Path(".cache/flopwise")
    max_bytes: int | None = Field(None, ge=1)  # cap on the text (or token bytes) read; None = all
    tokenizer_train_bytes: int = Field(4_000_000, ge=1)  # BPE is learned on a sample this large
    prefetch: int = Field(4, ge=0)


class ParallelConfig(Section):
    """How processes split the work. `nproc_per_node` > 1 makes `flopwise train` start torchrun."""

    strategy: Literal["single", "ddp", "fsdp", "deepspeed", "pipeline"] = "fsdp"
    nproc_per_node: int = Field(2, ge=1)
    nnodes: int = Field(1, ge=1)
    node_rank: int = Field(0, ge=0)
    rdzv_endpoint: str = "localhost:29500"
    rdzv_id: str = "flopwise"
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    ddp_bucket_mb: float = Field(25.0, gt=0)
    fsdp_reshard_after_forward: bool = True
    fsdp_min_params: int = Field(100_000, ge=0)
    zero_stage: int = Field(3, ge=0, le=3)
    offload: Literal["none", "optimizer", "params"] = "none"
    pipeline_microbatches: int = Field(4, ge=1)
    pipeline_schedule: Literal["1f1b", "gpipe"] = "1f1b"
    zero3_persistence_threshold: int = Field(100_000, ge=0)  # DeepSpeed: smaller parameters stay whole on every rank
    timeout_minutes: float = Field(10.0, gt=0)
    max_restarts: int = Field(0, ge=0)


class PrecisionConfig(Section):
    """Numerics. `bf16`/`fp16` autocast; `*-params` keeps 16-bit parameters (FSDP2) with fp32 reduction."""

    mode: Literal["fp32", "bf16", "fp16", "bf16-params", "fp16-params"] = "fp32"
    fp32_norm: bool = True
    initial_scale: float = Field(2.0**16, gt=0)
    growth_interval: int = Field(2000, ge=1)


class PruningConfig(Section):
    """The seed's `training.pruning` block; carried out by `flopwise compress`."""

    method: Literal["magnitude"] = "magnitude"
    sparsity: float = Field(0.5, ge=0.0, lt=1.0)
    scope: Literal["layer", "global"] = "layer"


class TrainingConfig(Section):
    """The optimisation loop."""

    max_steps: int = Field(150, ge=1)
    seed: int = 1234
    micro_batch_size: int = Field(8, ge=1)
    global_batch_size: int | None = Field(None, ge=1)
    optimizer: Literal["adamw", "sgd"] = "adamw"
    lr: float = Field(3e-3, gt=0)
    min_lr: float = Field(3e-4, ge=0)
    warmup_steps: int = Field(15, ge=0)
    weight_decay: float = Field(0.1, ge=0)
    betas: tuple[float, float] = (0.9, 0.95)
    momentum: float = Field(0.9, ge=0)
    grad_clip: float | None = Field(1.0, gt=0)
    gradient_checkpointing: bool | int = False
    activation_compression: Literal["none", "int8"] = "none"
    compile: bool = False
    eval_every: int = Field(50, ge=1)
    eval_batches: int = Field(8, ge=1)
    measure_sync_wait: bool | None = None  # time the wait for other ranks before gradient sync; None = when > 1 rank
    pruning: PruningConfig | None = None

    @model_validator(mode="after")
    def _check(self) -> "TrainingConfig":
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr: {self.min_lr} is above lr {self.lr} (allowed: 0 <= min_lr <= lr)")
        if self.gradient_checkpointing is not True and self.gradient_checkpointing is not False:
            if self.gradient_checkpointing < 0:
                raise ValueError("gradient_checkpointing: must be true, false or k >= 0 (checkpoint every k-th block)")
        for beta in self.betas:
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"betas: {beta} is outside [0, 1)")
        return self

    @property
    def checkpoint_every(self) -> int:
        """Checkpoint every k-th block: 0 = off, 1 = every block (`true`)."""
        if self.gradient_checkpointing is True:
            return 1
        if self.gradient_checkpointing is False:
            return 0
        return int(self.gradient_checkpointing)


class CheckpointConfig(Section):
    """When checkpoints are written into `run_dir/checkpoints/`, how many are kept, and how faults are met.

    Intervals by steps and/or minutes (the first due wins; ranks agree). `resume` picks up the
    latest valid checkpoint automatically; `resume_from` names one (`step-1200`, `1200` or a path).
    On SIGTERM/SIGUSR1 a checkpoint is written at the next step boundary and the run exits with
    code 75; `grace_seconds` is the time the scheduler allows for that (a warning when exceeded).
    `nan_patience`: consecutive non-finite losses tolerated under an fp16 loss scaler before the
    run stops (without a scaler the first one stops it).
    """

    every_steps: int | None = Field(None, ge=1)
    every_minutes: float | None = Field(None, gt=0)
    at_end: bool = True
    keep_last: int = Field(3, ge=1)
    pin: list[int] = Field(default_factory=list)
    resume: bool = True
    resume_from: str | None = None
    grace_seconds: float = Field(25.0, gt=0)
    nan_patience: int = Field(3, ge=1)
    verify_on_save: bool = True


class LoggingConfig(Section):
    """Where results go."""

    run_dir: Path = Path("runs/default")
    log_every: int = Field(10, ge=1)
    tensorboard: bool = False
    wandb: bool = False
    wandb_project: str = "flopwise"
    progress: bool = True


class RunConfig(Section):
    """A whole run."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    precision: PrecisionConfig = Field(default_factory=PrecisionConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    compress: dict | None = None  # validated by flopwise.compress.config

    @model_validator(mode="after")
    def _check_across_sections(self) -> "RunConfig":
        if self.model.kind != "hf" and self.data.seq_len > self.model.max_seq_len:
            raise ValueError(
                f"data.seq_len: {self.data.seq_len} exceeds model.max_seq_len {self.model.max_seq_len} "
                "(allowed: seq_len <= max_seq_len)"
            )
        if precision_of(self.precision.mode).param_dtype != "fp32" and self.parallel.strategy != "fsdp":
            raise ValueError(
                f"precision.mode: {self.precision.mode} keeps 16-bit parameters through FSDP2 and needs "
                f"parallel.strategy=fsdp (got {self.parallel.strategy}; allowed otherwise: fp32, bf16, fp16)"
            )
        return self
