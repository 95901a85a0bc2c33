"""The run configuration: one typed schema, one section per module.

Loaded from YAML (safe loader) with dotted `key=value` overrides; every mistake is
reported as one line naming the key path and what is allowed.
"""

from __future__ import annotations

import functools
import os
import typing
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BaseModel, ConfigDict, Field, PrivateAttr, StrictFloat, StrictInt, ValidationInfo, field_validator, model_validator,
)

# Practical ceilings: far above any real run, low enough that no value reaches torch or the
# allocator as an absurd size. Seeds must fit numpy's and torch's 32-bit seeding.
MAX_SEED = 2**32 - 1
MAX_STEPS = 10**12
MAX_COUNT = 2**20  # layers, heads, batch sizes, processes, micro-batches
MAX_WIDTH = 2**20  # hidden sizes
MAX_SEQ = 2**24  # tokens per sequence
MAX_VOCAB = 2**24
MAX_BYTES = 2**50  # 1 PiB
MAX_LR = 10.0

from flopwise.config.hub_models import looks_like_hub_id, resolve_hub_model
from flopwise.config.precision import precision_of


@functools.lru_cache(maxsize=None)
def _accepted_types(annotation) -> frozenset:
    """The plain types an annotation admits (`int | None` -> {int, NoneType}), through Annotated and unions."""
    if isinstance(annotation, type):
        return frozenset({annotation})
    found: set = set()
    for arg in typing.get_args(annotation):
        found |= _accepted_types(arg)
    return frozenset(found)


def refuse_booleans_for_numbers(model: type[BaseModel], value, info: ValidationInfo):
    """A YAML boolean (`on`, `yes`, `no`, `true`) given for a number field is a mistake, not 1 or 0.

    pydantic's lax mode reads `True` as 1 for `int` and `float` fields, so `max_steps: on`
    trained one step and exited 0. Fields that admit a boolean themselves
    (`gradient_checkpointing: bool | int`) keep it.
    """
    if isinstance(value, bool) and info.field_name is not None:
        types = _accepted_types(model.model_fields[info.field_name].annotation)
        if types & {int, float} and bool not in types:
            raise ValueError("must be a number; yes/no, on/off and true/false are booleans in YAML")
    return value


class Section(BaseModel):
    """Base for config sections: unknown keys are errors, values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value, info: ValidationInfo):
        """Numbers refuse YAML booleans (`refuse_booleans_for_numbers`)."""
        return refuse_booleans_for_numbers(cls, value, info)

    @field_validator("*", mode="after")
    @classmethod
    def _plain_text(cls, value):
        """Paths and names: no NUL character (the OS refuses them later with a traceback), at most 4096 chars."""
        for text in value if isinstance(value, list) else [value]:
            if isinstance(text, (str, Path)) and ("\x00" in str(text) or len(str(text)) > 4096):
                raise ValueError("must be text without NUL characters, at most 4096 characters")
        return value


class ModelConfig(Section):
    """The network: the built-in decoder (llama- or gpt2-style) or a HF config.json."""

    kind: Literal["llama", "gpt2", "hf"] = "llama"
    hf_config: Path | None = None
    pretrained: Path | None = None  # a save_pretrained folder (weights, config.json, tokenizer) or a cached hub id
    trust_remote_code: bool = False
    n_layers: int = Field(4, ge=1, le=4096)
    hidden: int = Field(192, ge=8, le=MAX_WIDTH)
    n_heads: int = Field(6, ge=1, le=MAX_COUNT)
    n_kv_heads: int | None = Field(None, ge=1, le=MAX_COUNT)
    ffn_hidden: int | None = Field(None, ge=1, le=MAX_WIDTH * 8)
    max_seq_len: int = Field(256, ge=8, le=MAX_SEQ)
    tie_embeddings: bool = False
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    norm_eps: float = Field(1e-5, gt=0, lt=1)
    rope_theta: float = Field(10000.0, gt=0, le=1e12)


class HFDatasetConfig(Section):
    """A `datasets` source read offline: local data files, a `save_to_disk` folder, or either streamed.

    Each record becomes one document: its `text_field`, or its `messages_field` rendered with
    the tokenizer's chat template.
    """

    path: Path
    format: Literal["auto", "json", "csv", "parquet", "text", "disk"] = "auto"
    split: str = "train"
    text_field: str = "text"
    messages_field: str | None = None
    streaming: bool = False
    max_records: int | None = Field(None, ge=1)


class MixSource(Section):
    """One chat/instruction JSONL file of a weighted mixture (train/data/mixing.py)."""

    path: Path
    weight: float = Field(1.0, gt=0, le=1e6)


class DataConfig(Section):
    """Where the tokens come from. Empty `paths` means the Python standard library's source.

    `mix` names chat/instruction JSONL files (`messages` or `prompt`/`response`) with weights;
    `loss_on` says which tokens are trained on: the assistant's turns (default) or all.
    """

    paths: list[str] = Field(default_factory=list)
    hf_dataset: HFDatasetConfig | None = None
    format: Literal["auto", "text", "jsonl", "tfrecord", "tokens"] = "auto"
    text_field: str = "text"
    token_dtype: Literal["uint16", "uint32"] = "uint16"
    tokenizer: Path | None = None  # a tokenizer.json or a model folder's tokenizer; None = a BPE trained on the data
    vocab_size: int = Field(4096, ge=260, le=MAX_VOCAB)
    seq_len: int = Field(128, ge=8, le=MAX_SEQ)
    val_fraction: float = Field(0.02, gt=0.0, lt=0.5)
    cache_dir: Path = Path(".cache/flopwise")
    max_bytes: int | None = Field(None, ge=1, le=MAX_BYTES)  # cap on the text (or token bytes) read; None = all
    tokenizer_train_bytes: int = Field(4_000_000, ge=1, le=MAX_BYTES)  # BPE is learned on a sample this large
    prefetch: int = Field(4, ge=0, le=1024)
    mix: list[MixSource] | None = None
    loss_on: Literal["assistant", "all"] = "assistant"

    @field_validator("hf_dataset", mode="before")
    @classmethod
    def _path_alone(cls, value):
        """`data.hf_dataset=FILE_OR_FOLDER` is short for `data.hf_dataset.path=FILE_OR_FOLDER`."""
        return {"path": value} if isinstance(value, (str, Path)) else value


class ParallelConfig(Section):
    """How processes split the work. `nproc_per_node` > 1 makes `flopwise train` start torchrun."""

    # None: chosen for the device and the model when the run starts (plan/default_strategy.py), printed with
    # the reason and written into the run's config.yaml
    strategy: Literal["single", "ddp", "fsdp", "deepspeed", "pipeline"] | None = None
    nproc_per_node: int = Field(2, ge=1, le=1024)
    nnodes: int = Field(1, ge=1, le=MAX_COUNT)
    node_rank: int = Field(0, ge=0, lt=MAX_COUNT)
    rdzv_endpoint: str = "localhost:29500"
    rdzv_id: str = "flopwise"
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    ddp_bucket_mb: float = Field(25.0, gt=0, le=65536)
    fsdp_reshard_after_forward: bool = True
    # when FSDP reduce-scatters gradients under accumulation: on the last micro-step only (one reduce-scatter
    # per step; every rank holds the whole model's gradients, fp32, between micro-steps) or on every one
    # (a reduce-scatter per micro-step; only the shard is held), as torchtitan does. plan.json counts either
    fsdp_grad_sync: Literal["last_micro_step", "every_micro_step"] = "last_micro_step"
    fsdp_min_params: int = Field(100_000, ge=0, le=2**62)
    # MiB of parameters per FSDP2 unit: consecutive blocks are grouped up to it; 0 = one unit per block.
    # 4: blocks under it share units (measured 1.18-1.27x on thin blocks), larger ones keep their own (BENCHMARKS.md)
    fsdp_unit_mb: float = Field(4.0, ge=0, le=2**30)
    zero_stage: int = Field(3, ge=0, le=3)
    offload: Literal["none", "optimizer", "params"] = "none"
    pipeline_microbatches: int = Field(4, ge=1, le=4096)
    # torch.distributed.pipelining's schedules; the last three run `pipeline_virtual_stages` stages per process
    pipeline_schedule: Literal["1f1b", "gpipe", "interleaved-1f1b", "looped-bfs", "interleaved-zero-bubble"] = "1f1b"
    pipeline_virtual_stages: int = Field(1, ge=1, le=1024)
    zero3_persistence_threshold: int = Field(100_000, ge=0, le=2**62)  # DeepSpeed: smaller parameters stay whole on every rank
    timeout_minutes: float = Field(10.0, gt=0, le=7 * 24 * 60)  # a week
    # a rank whose heartbeat is this old is stalled (stopped, hung): the job ends with one line (train/launch/heartbeat.py)
    stall_seconds: float = Field(300.0, ge=2, le=7 * 24 * 3600)
    max_restarts: int = Field(0, ge=0, le=1000)
    # The mesh (train/parallel/mesh.py): pp x dp_replicate x dp_shard x tp = processes; dp_shard -1 = what is left.
    tp: int = Field(1, ge=1, le=MAX_COUNT)
    sequence_parallel: bool = False
    dp_replicate: int = Field(1, ge=1, le=MAX_COUNT)
    dp_shard: int = Field(-1, ge=-1, le=MAX_COUNT)
    pp: int | None = Field(None, ge=1, le=MAX_COUNT)  # pipeline stages; None = every process (pipeline) or 1

    @model_validator(mode="after")
    def _check_layout(self) -> "ParallelConfig":
        if self.node_rank >= self.nnodes:
            raise ValueError(f"node_rank: {self.node_rank} is not below nnodes {self.nnodes}")
        host, sep, port = self.rdzv_endpoint.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"rdzv_endpoint: {self.rdzv_endpoint!r} is not HOST:PORT with a port in 1-65535")
        if self.dp_shard == 0:
            raise ValueError("dp_shard: must be >= 1, or -1 for the processes the other dimensions leave")
        return self


class PrecisionConfig(Section):
    """Numerics. `bf16`/`fp16` autocast; `*-params` keeps 16-bit parameters (FSDP2) with fp32 reduction;
    `bf16-true` holds parameters, gradients and optimizer states in bf16 with no fp32 master copy."""

    mode: Literal["fp32", "bf16", "fp16", "bf16-params", "fp16-params", "bf16-true"] = "fp32"
    fp32_norm: bool = True
    initial_scale: float = Field(2.0**16, gt=0, le=2.0**64)
    growth_interval: int = Field(2000, ge=1, le=10**9)
    # fp16: this many optimizer steps in a row skipped by the loss scaler (inf/nan gradients) stop the run
    max_skipped_steps: int = Field(20, ge=1, le=10**6)


class PruningConfig(Section):
    """The seed's `training.pruning` block; carried out by `flopwise compress`."""

    method: Literal["magnitude"] = "magnitude"
    sparsity: float = Field(0.5, ge=0.0, lt=1.0)
    scope: Literal["layer", "global"] = "layer"


class TrainingConfig(Section):
    """The optimisation loop."""

    max_steps: int = Field(150, ge=1, le=MAX_STEPS)
    seed: int = Field(1234, ge=0, le=MAX_SEED)
    micro_batch_size: int = Field(8, ge=1, le=MAX_COUNT)
    global_batch_size: int | None = Field(None, ge=1, le=2**24)
    optimizer: Literal["adamw", "sgd"] = "adamw"
    lr: float = Field(3e-3, gt=0, le=MAX_LR)
    min_lr: float = Field(3e-4, ge=0, le=MAX_LR)
    warmup_steps: int = Field(15, ge=0, le=MAX_STEPS)
    weight_decay: float = Field(0.1, ge=0, le=100)
    betas: tuple[StrictFloat, StrictFloat] = (0.9, 0.95)
    momentum: float = Field(0.9, ge=0, lt=1)
    grad_clip: float | None = Field(1.0, gt=0, le=1e9)
    gradient_checkpointing: bool | int = False
    activation_compression: Literal["none", "int8"] = "none"
    # saved activations of the first N blocks (or all) kept in host memory from their forward to their
    # backward (train/techniques/activation_offload.py); 0 = none
    offload_activations: StrictInt | Literal["all"] = 0
    compile: bool = False
    eval_every: int = Field(50, ge=1, le=MAX_STEPS)
    eval_batches: int = Field(8, ge=1, le=MAX_COUNT)
    eval_at_start: bool = False  # a validation loss at step 0 (before training): costs start-up time, so only when asked
    measure_sync_wait: bool | None = None  # time the wait for other ranks before gradient sync; None = when > 1 rank
    # meters (saved-tensor memory, sync wait) on the first steps after start/resume, then every N-th step and the
    # last (train/meter_schedule.py): every step they cost up to ~8 % of a step on a CPU; 1 = every step
    measure_every: int = Field(20, ge=1, le=MAX_STEPS)
    pruning: PruningConfig | None = None

    @model_validator(mode="after")
    def _check(self) -> "TrainingConfig":
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr: {self.min_lr} is above lr {self.lr} (allowed: 0 <= min_lr <= lr)")
        if self.gradient_checkpointing is not True and self.gradient_checkpointing is not False:
            if not 0 <= self.gradient_checkpointing <= MAX_COUNT:
                raise ValueError("gradient_checkpointing: must be true, false or k >= 0 (checkpoint every k-th block)")
        for beta in self.betas:
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"betas: {beta} is outside [0, 1)")
        if self.offload_activations != "all" and not 0 <= self.offload_activations <= MAX_COUNT:
            raise ValueError("offload_activations: must be 'all' or a number of blocks >= 0")
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

    every_steps: int | None = Field(None, ge=1, le=MAX_STEPS)
    every_minutes: float | None = Field(None, gt=0, le=10**6)
    at_end: bool = True
    keep_last: int = Field(3, ge=1, le=10**6)
    pin: list[Annotated[StrictInt, Field(ge=0, le=MAX_STEPS)]] = Field(default_factory=list)
    resume: bool = True
    resume_from: str | None = None
    overwrite: bool = False  # resume=false in a used run_dir: move the old run aside to <run_dir>.old-<time>
    grace_seconds: float = Field(25.0, gt=0, le=86400)
    nan_patience: int = Field(3, ge=1, le=10**6)
    # re-read every file after the rename: the checksums already come from the bytes as written, and a
    # read right after the write comes from the page cache, not the disk, so it is off by default
    verify_on_save: bool = False
    # `checkpoint.async` (a Python keyword, hence the alias): stage to host memory and write in the
    # background; strategies whose engine writes its own files (DeepSpeed) save while the run waits
    async_: bool = Field(True, alias="async")

    model_config = ConfigDict(validate_by_name=True, validate_by_alias=True, serialize_by_alias=True)


class FinetuneConfig(Section):
    """How a pretrained model is fine-tuned: all weights (`full`), low-rank adapters (`lora`, Hu et al.
    2021, arXiv:2106.09685) or adapters on a frozen 4-bit NF4 base (`qlora`, Dettmers et al. 2023,
    arXiv:2305.14314). `alpha / rank` scales the adapters' update; `target_modules` is PEFT's:
    `all-linear` (every linear of the blocks), `qkvo` (the attention projections) or a list of
    module names. Carried out by `train/techniques/lora.py`, planned by `plan/finetune.py`."""

    method: Literal["full", "lora", "qlora"] = "full"
    rank: int = Field(16, ge=1, le=MAX_WIDTH)
    alpha: float = Field(32.0, gt=0, le=1e6)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: str | list[str] = "all-linear"

    @field_validator("target_modules")
    @classmethod
    def _known_targets(cls, value):
        if isinstance(value, str) and value not in ("all-linear", "qkvo"):
            raise ValueError(f"{value!r} is not all-linear, qkvo or a list of module names")
        if isinstance(value, list) and (not value or not all(name.strip() for name in value)):
            raise ValueError("must name at least one module, none of them empty")
        return value

    @property
    def adapters(self) -> bool:
        """Whether the base is frozen and only adapters train."""
        return self.method != "full"


class LoggingConfig(Section):
    """Where results go."""

    run_dir: Path = Path("runs/default")
    log_every: int = Field(10, ge=1, le=MAX_STEPS)
    tensorboard: bool = False
    wandb: bool = False
    wandb_project: str = "flopwise"
    progress: bool = True

    @field_validator("run_dir", mode="before")
    @classmethod
    def _normalised_folder(cls, value):
        """An empty path is refused (it would train into the current folder); `a/b/..` becomes `a`,
        so the lock, the reuse checks and moving an old run aside all see the folder the OS means."""
        if isinstance(value, (str, Path)):
            if not str(value).strip():
                raise ValueError("must name a folder, not an empty path")
            if "\x00" not in str(value):
                return Path(os.path.normpath(str(value)))
        return value


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
    finetune: FinetuneConfig | None = None  # LoRA / QLoRA of a pretrained model; None = train every weight
    # lines the trainer prints: fine-tuning defaults set on fields the user left unset (finetune_defaults.py)
    _default_notes: list[str] = PrivateAttr(default_factory=list)

    @property
    def default_notes(self) -> list[str]:
        """The fine-tuning defaults this config received, each with its reason."""
        return list(self._default_notes)

    @model_validator(mode="after")
    def _check_across_sections(self) -> "RunConfig":
        if self.model.pretrained is not None:
            _resolve_pretrained(self)
            from flopwise.config.finetune_defaults import apply_finetune_defaults

            self._default_notes = apply_finetune_defaults(self)
        if self.data.hf_dataset is not None and self.data.paths:
            raise ValueError("data.hf_dataset: set either data.hf_dataset or data.paths, not both")
        if self.data.mix and (self.data.paths or self.data.hf_dataset is not None):
            raise ValueError("data.mix: chat files are mixed on their own; leave data.paths and data.hf_dataset unset")
        if self.data.mix and self.model.kind != "hf":
            raise ValueError(f"data.mix: chat data trains a HuggingFace model (model.kind=hf, model.pretrained); "
                             f"the built-in {self.model.kind} decoder has no per-document attention mask")
        if self.data.mix and self.parallel.strategy in ("deepspeed", "pipeline"):
            raise ValueError(f"data.mix: packed chat rows train with parallel.strategy single, ddp or fsdp "
                             f"(got {self.parallel.strategy})")
        if self.model.kind != "hf" and self.data.seq_len > self.model.max_seq_len:
            raise ValueError(
                f"data.seq_len: {self.data.seq_len} exceeds model.max_seq_len {self.model.max_seq_len} "
                "(allowed: seq_len <= max_seq_len)"
            )
        if self.finetune is not None and self.finetune.adapters:
            _check_adapters(self)
        precision = precision_of(self.precision.mode)
        if precision.param_dtype != "fp32" and not precision.pure and self.parallel.strategy not in ("fsdp", None):
            raise ValueError(
                f"precision.mode: {self.precision.mode} keeps 16-bit parameters through FSDP2 and needs "
                f"parallel.strategy=fsdp (got {self.parallel.strategy}; allowed otherwise: fp32, bf16, fp16, bf16-true)"
            )
        return self


def _check_adapters(cfg: RunConfig) -> None:
    """LoRA/QLoRA adapt a pretrained HF model under the torch strategies (PEFT injects into HF modules)."""
    method = cfg.finetune.method
    if cfg.model.pretrained is None:
        raise ValueError(f"finetune.method: {method} adapts a pretrained model; set model.pretrained "
                         "(a save_pretrained folder) or use finetune.method=full")
    if cfg.parallel.strategy not in ("single", "ddp", "fsdp", None):
        raise ValueError(f"finetune.method: {method} runs under parallel.strategy single, ddp or fsdp "
                         f"(got {cfg.parallel.strategy})")
    if cfg.parallel.tp > 1:
        raise ValueError(f"finetune.method: {method} does not combine with tensor parallelism (parallel.tp=1)")
    if method == "qlora" and precision_of(cfg.precision.mode).compute_dtype == "fp16":
        # torchao's NF4 base dequantises to bf16: under fp16 autocast the matmul meets a bf16 weight
        # and torch stops with "Unexpected floating ScalarType" (single process and FSDP2 alike)
        raise ValueError(f"precision.mode: {cfg.precision.mode} does not combine with finetune.method=qlora "
                         "(QLoRA's NF4 base dequantises to bf16); use bf16, bf16-true, bf16-params (fsdp) or fp32")


def _resolve_pretrained(cfg: RunConfig) -> None:
    """`model.pretrained` supplies the architecture and, unless `data.tokenizer` is set, the tokenizer:
    its tokenizer.json, else the folder itself (the data pipeline loads it with transformers, or
    refuses in one line), so a pretrained model never gets a tokenizer newly trained on the data."""
    if looks_like_hub_id(cfg.model.pretrained):
        cfg.model.pretrained = resolve_hub_model(str(cfg.model.pretrained))
    folder = Path(cfg.model.pretrained).expanduser()
    if cfg.model.kind != "hf":
        raise ValueError(f"model.pretrained: needs model.kind=hf (got {cfg.model.kind})")
    if not folder.exists():
        raise ValueError(f"model.pretrained: {folder} does not exist (expected a save_pretrained folder)")
    if folder.is_file():
        raise ValueError(f"model.pretrained: {folder} is a file, not a folder; name the save_pretrained folder "
                         f"(model.pretrained={folder.parent}?)")
    if not (folder / "config.json").is_file():
        raise ValueError(f"model.pretrained: {folder} has no config.json (expected a save_pretrained folder)")
    if cfg.model.hf_config is None:
        cfg.model.hf_config = folder / "config.json"
    if cfg.data.tokenizer is None:
        own = folder / "tokenizer.json"
        cfg.data.tokenizer = own if own.is_file() else folder
