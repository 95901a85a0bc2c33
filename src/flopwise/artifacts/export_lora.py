"""A LoRA/QLoRA run out: its adapter in PEFT's format, or the base with the adapter merged in.

A fine-tune's checkpoint holds only the adapters (the frozen base is the pretrained folder).
The export reads the base from `model.pretrained` in full precision, wraps it in a PEFT
`PeftModel` with the run's `LoraConfig`, and fills the adapters from the checkpoint:

- `--adapter`: `PeftModel.save_pretrained` (adapter_config.json + adapter_model.safetensors),
  which `peft.PeftModel.from_pretrained(base, folder)` loads; its `base_model_name_or_path` is
  the pretrained folder;
- merged (the default): `merge_and_unload` adds `B·A·alpha/rank` into each base weight, giving a
  plain transformers model (HF folder, and the `model.safetensors` that `flopwise compress` reads).
  A QLoRA adapter was trained against the NF4-rounded base and is merged into the original
  weights, as QLoRA's and PEFT's own merge does; the difference is NF4's rounding error.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from flopwise.errors import UserError

WRAPPER_PREFIX = "hf."  # the trainer's HFCausalLM keeps the transformers model as `.hf`
PEFT_PREFIX = "base_model.model."


def adapted_model(cfg, vocab_size: int, checkpoint: Path):
    """(the trainer's model wrapper, its PeftModel) with the pretrained base and the checkpoint's adapters."""
    import torch
    from peft import get_peft_model

    from flopwise.train.checkpoint.safe_read import LOAD_ERRORS, safe_dcp_load
    from flopwise.train.checkpoint.store import quiet_single_process_notice
    from flopwise.train.hf_pretrained import build_pretrained_skeleton, materialize_pretrained
    from flopwise.train.techniques.lora import lora_config

    model = build_pretrained_skeleton(cfg.model, vocab_size)
    materialize_pretrained(model, cfg.model.pretrained, torch.device("cpu"))
    peft_model = get_peft_model(model.hf, lora_config(cfg.finetune))
    peft_model.peft_config["default"].base_model_name_or_path = str(Path(cfg.model.pretrained).expanduser())
    adapters = {WRAPPER_PREFIX + name.removeprefix(PEFT_PREFIX): tensor
                for name, tensor in peft_model.state_dict().items() if "lora_" in name}
    try:
        with quiet_single_process_notice():
            safe_dcp_load({"model": adapters}, checkpoint)  # in place: the tensors share the parameters' storage
    except UserError:
        raise
    except LOAD_ERRORS as exc:
        raise UserError(f"checkpoint {checkpoint} does not hold this run's adapters: "
                        f"{str(exc).splitlines()[0][:160]}") from None
    return model, peft_model


def write_adapter(peft_model, folder: Path) -> Path:
    """The adapter in PEFT's own format (adapter_config.json + adapter_model.safetensors)."""
    folder = Path(folder)
    peft_model.save_pretrained(str(folder), safe_serialization=True)
    return folder


def merge_adapters(model: nn.Module, peft_model) -> nn.Module:
    """The wrapper holding the base with every adapter merged in (a plain transformers model)."""
    model.hf = peft_model.merge_and_unload()
    return model
