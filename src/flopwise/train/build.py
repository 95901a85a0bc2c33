"""The one place that turns a config into the module the loop trains.

Techniques are applied in this fixed order, each by its own unit and each only when its
switch is on (turning one off leaves no trace):

1. build the fp32 model            `model.build_model`; with `model.pretrained`, on the meta
                                   device (`hf_pretrained`), filled here, or after step 6 for FSDP2
2. fp32 norms                      `precision.apply_fp32_norm`            (precision.fp32_norm)
   pure bf16                       `precision.apply_pure_bf16`             (precision.mode=bf16-true)
   LoRA / QLoRA adapters           `lora.apply_lora`: freeze the base      (finetune.method)
                                   (QLoRA: NF4), inject PEFT adapters; the
                                   pretrained base is loaded whole first
   tensor parallelism              `parallelize.apply_tensor_parallel` over  (parallel.tp,
                                   the run's one DeviceMesh                  parallel.sequence_parallel)
3. activation checkpointing        `activation_checkpointing.apply_activation_checkpointing`
                                                                         (training.gradient_checkpointing)
   activation offload              `activation_offload.apply_activation_offload`: the first N
                                   blocks' saved tensors in host memory  (training.offload_activations)
4. activation compression (int8)   `activation_compression.int8_saved_activations`
                                   entered around each forward          (training.activation_compression)
5. torch.compile, per block        `nn.Module.compile`                    (training.compile)
6. parallelism                     `parallelize.parallelize_model`: DDP,  (parallel.strategy,
                                   FSDP2 / HSDP over the mesh's dp part,  parallel.dp_replicate,
                                   or this rank's pipeline stage          parallel.offload)
7. the step's strategy             `parallelize.attach_strategy`, once the optimizer exists:
                                   plain torch, DeepSpeed's engine or the pipeline schedule

Why this order (torchtitan's: TP, then checkpointing, compile, FSDP2): norms must be patched before anything wraps the blocks; checkpointing
wraps whole blocks, and compression only affects what checkpointing still saves;
compile sees the final block code; FSDP2 shards last so that each checkpointed,
compiled block is one FSDP unit (as in torchtitan's `parallelize_llama`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, ContextManager

import torch
from torch import nn

from flopwise.train.techniques import activation_compression
from flopwise.train.techniques.activation_checkpointing import apply_activation_checkpointing
from flopwise.train.techniques.activation_offload import apply_activation_offload
from flopwise.config.resolve import ResolvedRun
from flopwise.config.schema import RunConfig
from flopwise.train.parallel.distributed import DistEnv
from flopwise.errors import UserError
from flopwise.train.model import build_model, transformer_blocks
from flopwise.train.parallel.parallelize import (
    apply_tensor_parallel, attach_strategy, build_device_mesh, parallelize_model, unwrap,
)
from flopwise.train.techniques.precision import (
    PURE_BF16_TRADE_OFF, apply_fp32_norm, apply_pure_bf16, frozen_base_dtype, fsdp_mixed_precision_policy,
)


@dataclass
class BuiltModel:
    """The trainable module and what the loop needs to know about how it was built.

    `model` is what the loop calls (DDP wrapper or FSDP2 module); `module` is the user's
    module underneath (for parameter counts and, later, checkpoints). `forward_context`
    is entered around every forward (activation compression), and `saved_tensor_hooks`
    is its (pack, unpack) pair so memory measurement can count the packed form.
    """

    model: nn.Module
    module: nn.Module
    blocks: nn.ModuleList
    forward_context: Callable[[], ContextManager] = contextlib.nullcontext
    saved_tensor_hooks: tuple[Callable, Callable] | None = None
    notes: list[str] = field(default_factory=list)
    pp_group: object | None = None  # the pipeline stages' process group when the mesh has other dimensions


def build_training_model(cfg: RunConfig, vocab_size: int, env: DistEnv, run: ResolvedRun) -> BuiltModel:
    """Build the model and apply techniques 1-6 in the documented order (7 needs the optimizer: `build_strategy`)."""
    notes: list[str] = []
    pretrained = cfg.model.pretrained
    adapters = cfg.finetune is not None and cfg.finetune.adapters
    if pretrained is not None:  # weights from a save_pretrained folder (train/hf_pretrained.py)
        from flopwise.train.hf_pretrained import build_pretrained_skeleton, materialize_pretrained

        model = build_pretrained_skeleton(cfg.model, vocab_size)
        if adapters:  # the base is loaded whole, frozen (and for QLoRA quantised) before any wrapping
            _hold_parameters_in(model, frozen_base_dtype(run.precision))  # read as bf16, never fp32
            materialize_pretrained(model, pretrained, _base_load_device(cfg, env))
        elif cfg.parallel.strategy != "fsdp":  # FSDP2 shards the meta model first, then loads per rank
            materialize_pretrained(model, pretrained, env.device)
        notes.append(f"pretrained weights: {pretrained}")
    else:
        model = build_model(cfg.model, vocab_size)

    if cfg.precision.fp32_norm:
        changed = apply_fp32_norm(model)
        notes.append(f"fp32 norms: {changed} norm layers compute in fp32")

    pure = run.precision.pure
    if adapters:
        from flopwise.train.techniques.lora import apply_lora

        notes += apply_lora(model, cfg.finetune, env.device, frozen_base_dtype(run.precision),
                            adapter_dtype=torch.bfloat16 if pure else torch.float32,
                            shards=env.world_size if cfg.parallel.strategy == "fsdp" else 1)
    if pure:
        apply_pure_bf16(model)
        notes.append(PURE_BF16_TRADE_OFF)

    mesh, shape = build_device_mesh(cfg.parallel, env, run.mesh)  # the run's one DeviceMesh
    if shape.tp > 1:
        apply_tensor_parallel(model, cfg.parallel, env, mesh)
        notes.append(f"tensor parallel: tp {shape.tp}"
                     f"{' with sequence parallelism' if cfg.parallel.sequence_parallel else ''}")

    every = cfg.training.checkpoint_every
    if every:
        apply_activation_checkpointing(model, every)
        notes.append(f"activation checkpointing: every {every} block(s)")
    if cfg.training.offload_activations:
        if cfg.parallel.strategy == "pipeline" and cfg.training.offload_activations != "all":
            raise UserError("training.offload_activations: with parallel.strategy=pipeline use 'all' (a count of "
                            "blocks would offload only the first stages' blocks)")
        offloaded = apply_activation_offload(model, cfg.training.offload_activations)
        notes.append(f"activation offload: the saved activations of {offloaded} block(s) in host memory")

    forward_context: Callable[[], ContextManager] = contextlib.nullcontext
    hooks = None
    if cfg.training.activation_compression == "int8":
        forward_context, hooks = _int8_activation_compression()
        notes.append("activation compression: int8 saved activations")

    blocks = transformer_blocks(model)
    if cfg.training.compile:
        for block in blocks:
            block.compile()
        notes.append("torch.compile: each transformer block")

    mp_policy = fsdp_mixed_precision_policy(run.precision) if cfg.parallel.strategy == "fsdp" else None
    wrapped = parallelize_model(model, blocks, cfg.parallel, env, mp_policy=mp_policy, mesh=mesh, shape=shape)
    if pretrained is not None and cfg.parallel.strategy == "fsdp" and not adapters:
        materialize_pretrained(wrapped, pretrained, env.device)
    notes.append(f"strategy: {cfg.parallel.strategy} on {env.world_size} process(es), {env.device.type}"
                 f"{f' (mesh {shape.describe()})' if mesh is not None and env.world_size > 1 else ''}"
                 f"{f', CPU offload ({cfg.parallel.offload})' if cfg.parallel.offload != 'none' and cfg.parallel.strategy == 'fsdp' else ''}")
    return BuiltModel(
        model=wrapped,
        module=unwrap(wrapped),
        blocks=blocks,
        forward_context=forward_context,
        saved_tensor_hooks=hooks,
        notes=notes,
        pp_group=mesh["pp"].get_group() if mesh is not None and cfg.parallel.strategy == "pipeline" else None,
    )


def _hold_parameters_in(model: nn.Module, dtype: torch.dtype) -> None:
    """Give the (meta) parameters `dtype`, so a frozen base is read straight into it: a 7B base takes
    14 GB in bf16 instead of 28 GB in fp32. Buffers (rotary tables) keep their dtype."""
    for param in model.parameters():
        if param.dtype.is_floating_point and param.dtype != dtype:
            param.data = param.data.to(dtype)


def _base_load_device(cfg: RunConfig, env: DistEnv):
    """QLoRA reads the 16-bit base into host memory and sends each weight to the device as NF4;
    LoRA reads it straight onto the device."""
    return torch.device("cpu") if cfg.finetune.method == "qlora" else env.device


def _int8_activation_compression() -> tuple[Callable[[], ContextManager], tuple[Callable, Callable] | None]:
    """The compression unit's context, and its pack/unpack pair when the unit exposes one."""
    context = activation_compression.int8_saved_activations
    pack = getattr(activation_compression, "pack_int8", None)
    unpack = getattr(activation_compression, "unpack_int8", None)
    hooks = (pack, unpack) if pack is not None and unpack is not None else None
    return context, hooks


def build_strategy(state, cfg: RunConfig, env: DistEnv, run: ResolvedRun):
    """Technique 7: the step's `Strategy`, built once the optimizer and loss scaler exist."""
    return attach_strategy(state, cfg, env, run)
