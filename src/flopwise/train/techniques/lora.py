"""LoRA and QLoRA: train low-rank adapters on a frozen pretrained model (`finetune.method`).

LoRA (Hu et al. 2021, arXiv:2106.09685) adds `B·A·x · alpha/rank` beside each targeted
linear and trains only A and B. QLoRA (Dettmers et al. 2023, arXiv:2305.14314) also stores the
frozen base's linears in 4-bit NormalFloat (NF4) with blockwise absmax constants and
dequantises each to the compute dtype for its matmul.

Libraries, not hand-rolled code:

- the adapters are PEFT's (`peft.inject_adapter_in_model` with a `LoraConfig`), so the adapter
  is saved in PEFT's own format and `peft.PeftModel.from_pretrained` loads it;
- the NF4 base is torchao's `NF4Tensor` (`to_nf4`), the tensor torchtune uses for QLoRA. It is
  plain torch code, so it runs on CPUs (the tests) as on GPUs, and it implements FSDP2's
  all-gather hooks (`fsdp_pre_all_gather` / `fsdp_post_all_gather`), so each rank keeps only its
  shard of the 4-bit base, as in FSDP-QLoRA. bitsandbytes' `Linear4bit` needs CUDA for most
  paths and its `Params4bit` is not an FSDP2 DTensor-shardable parameter, so it is not used.

Only adapter parameters require grad, so `make_optimizer` gives the optimizer nothing else
and DCP checkpoints (`ignore_frozen_params`) hold the adapters and their optimizer state: the
frozen base is the pretrained folder, re-read on resume.
"""

from __future__ import annotations

import torch
from torch import nn

from flopwise.config.schema import FinetuneConfig
from flopwise.errors import UserError
from flopwise.train.model import transformer_blocks

ADAPTER_MARKER = "lora_"
ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")  # HF llama/mistral/qwen names
NF4_BLOCK = 64  # weights per absmax constant (QLoRA sec. 3, torchtune's default)
NF4_SCALER_BLOCK = 256  # absmax constants per fp32 scale of the double quantisation (QLoRA sec. 3)


def peft_target_modules(targets: str | list[str]) -> str | list[str]:
    """`finetune.target_modules` in PEFT's terms: `all-linear`, the attention projections, or the names given."""
    if targets == "qkvo":
        return list(ATTENTION_PROJECTIONS)
    return targets


def linear_module_names(model: nn.Module) -> list[str]:
    """The dotted names of the modules PEFT can adapt as linears: `nn.Linear` and GPT-2's `Conv1D`."""
    return [name for name, module in model.named_modules()
            if isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"]


def check_target_modules(model: nn.Module, targets: str | list[str]) -> None:
    """Every name in a `finetune.target_modules` list names linears of `model`, as PEFT matches it (the
    whole dotted name or its last parts); otherwise one line listing the model's own linear names.

    The planner also reads other tools' spellings (torchtune's `wq`, NeMo's `linear_qkv`); PEFT
    adapts modules by the model's own names, so such a name gets the model's name for the same
    matrix suggested rather than silently rewritten."""
    if not isinstance(targets, list):
        return  # all-linear, qkvo: chosen by PEFT / ATTENTION_PROJECTIONS
    names = linear_module_names(model)
    unknown = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    if not unknown:
        return
    leaves = list(dict.fromkeys(name.rsplit(".", 1)[-1] for name in names))
    hints = [hint for t in unknown if (hint := _same_matrix_hint(t, leaves))]
    raise UserError(
        f"finetune.target_modules: {type(model).__name__} has no linear module named {', '.join(unknown)}; "
        f"its linear modules: {', '.join(leaves)} (the trainer adapts the model's own module names, or "
        f"all-linear, qkvo{'; ' + '; '.join(hints) if hints else ''})")


def _same_matrix_hint(name: str, leaves: list[str]) -> str | None:
    """'wq is q_proj here' when the planner reads `name` as a block matrix that one of `leaves` holds."""
    from flopwise.plan.finetune import MATRIX_NAMES, MODULE_MATRICES

    leaf = name.rsplit(".", 1)[-1].lower()
    wanted = set(MODULE_MATRICES.get(leaf, (leaf,) if leaf in MATRIX_NAMES else ()))
    if not wanted:
        return None
    same = [other for other in leaves if wanted & set(MODULE_MATRICES.get(other, ()))]
    return f"{name} is {','.join(same)} here" if same else None


def lora_config(cfg: FinetuneConfig):
    """The PEFT `LoraConfig` of the `finetune:` section."""
    from peft import LoraConfig

    return LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                      target_modules=peft_target_modules(cfg.target_modules), bias="none", task_type="CAUSAL_LM")


def is_adapter_parameter(name: str) -> bool:
    """Whether a parameter name belongs to a LoRA adapter (PEFT names them `lora_A`, `lora_B`)."""
    return ADAPTER_MARKER in name


def nf4_api():
    """torchao's (NF4Tensor, to_nf4): in `torchao.quantization` in recent releases, `torchao.dtypes.nf4tensor` in older ones."""
    try:
        from torchao.quantization import NF4Tensor, to_nf4
    except ImportError:
        from torchao.dtypes.nf4tensor import NF4Tensor, to_nf4
    return NF4Tensor, to_nf4


def nf4_scaler_block(numel: int, shards: int = 1) -> int | None:
    """The double-quantisation group for a weight of `numel` elements: 256 absmax constants, or the
    largest smaller power of two that leaves a whole number of groups on each of `shards` FSDP2
    shards (small models); None: the weight cannot be stored in NF4 this way."""
    if numel % (NF4_BLOCK * shards):
        return None
    blocks = numel // NF4_BLOCK
    size = NF4_SCALER_BLOCK
    while size > 1 and (blocks % size or (blocks // size) % shards):
        size //= 2
    return size if size > 1 else None


@torch.no_grad()
def quantize_linears_to_nf4(model: nn.Module, device: torch.device, dtype: torch.dtype = torch.bfloat16,
                            shards: int = 1) -> int:
    """Store the weight of every linear in the transformer blocks as a frozen torchao NF4Tensor on `device`.

    QLoRA quantises all block linears whether or not they carry an adapter (sec. 4); embeddings,
    the LM head and norms stay in `dtype`. Each weight goes to `device` alone, so a GPU never holds
    the whole 16-bit base. `shards`: the FSDP2 shards each NF4 weight is split into (each needs a
    whole number of blocks and scale groups). Returns the number of linears quantised.
    """
    to_nf4 = nf4_api()[1]
    quantized = 0
    for block in transformer_blocks(model):
        for module in block.modules():
            if type(module) is not nn.Linear:
                continue
            weight = module.weight.detach().to(device=device, dtype=dtype)
            scaler_block = nf4_scaler_block(weight.numel(), shards)
            if scaler_block is None:
                raise UserError(f"finetune.method: qlora cannot store a {tuple(weight.shape)} weight in NF4 "
                                f"split over {shards} shard(s) (blocks of {NF4_BLOCK}, at least 2 scale "
                                "groups per shard); use finetune.method=lora or fewer processes")
            module.weight = nn.Parameter(to_nf4(weight, NF4_BLOCK, scaler_block), requires_grad=False)
            quantized += 1
    return quantized


def freeze_base_and_cast(model: nn.Module, dtype: torch.dtype, adapter_dtype: torch.dtype = torch.float32) -> None:
    """Freeze every non-adapter parameter in `dtype`; adapters train in `adapter_dtype` (fp32, as PEFT
    keeps them by default; bf16 under `precision.mode=bf16-true`)."""
    for name, param in model.named_parameters():
        if is_adapter_parameter(name):
            param.requires_grad_(True)
            param.data = param.data.to(adapter_dtype)
        else:
            param.requires_grad_(False)
            if param.dtype.is_floating_point and param.dtype != dtype and type(param.data) is torch.Tensor:
                param.data = param.data.to(dtype)


def apply_lora(model: nn.Module, cfg: FinetuneConfig, device: torch.device, frozen_dtype: torch.dtype,
               adapter_dtype: torch.dtype = torch.float32, shards: int = 1) -> list[str]:
    """Freeze the materialised pretrained `model`, quantise its block linears for QLoRA, inject PEFT adapters.

    Call it after the pretrained weights are loaded and before activation checkpointing and
    DDP / FSDP2 (`shards`: the processes FSDP2 will shard over, else 1). Returns lines for the run header.
    """
    from peft import inject_adapter_in_model

    hf = getattr(model, "hf", model)
    check_target_modules(hf, cfg.target_modules)
    notes = []
    if cfg.method == "qlora":
        quantized = quantize_linears_to_nf4(model, device, shards=shards)
        notes.append(f"QLoRA: {quantized} block linears stored in NF4 (torchao, blocks of {NF4_BLOCK}), "
                     "dequantised to bf16 per matmul")
    model.to(device)
    try:
        inject_adapter_in_model(lora_config(cfg), hf)
    except ValueError as exc:  # PEFT: no module matched the targets
        raise UserError(f"finetune.target_modules: {str(exc).splitlines()[0]}") from None
    freeze_base_and_cast(model, frozen_dtype, adapter_dtype)
    model.to(device)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    notes.append(f"LoRA (PEFT): rank {cfg.rank}, alpha {cfg.alpha:g}, dropout {cfg.dropout:g}, targets "
                 f"{cfg.target_modules}; {trainable:,} trainable of {total:,} parameters "
                 f"({100 * trainable / total:.2f} %), base frozen in {str(frozen_dtype).removeprefix('torch.')}")
    return notes
