"""Fine-tuning defaults: what a run of a pretrained model gets for the settings the user left unset.

The schema's defaults are pre-training ones (lr 3e-3, weight decay 0.1, 128-token windows), which
damage a real model. When `model.pretrained` is set, each field below that the config and the
overrides did not give is replaced, and the run prints the value with its reason. Anything given
explicitly wins. Torch-free: it reads the model's config.json only.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

# Peak learning rates by method. Full: Stanford Alpaca's full fine-tune of LLaMA-7B (2e-5, its
# train.py recipe). LoRA / QLoRA: QLoRA (Dettmers et al. 2023, arXiv:2305.14314) Table 9, 2e-4 for
# 7B and 13B models; adapters start at zero and need a larger step than the weights themselves.
LEARNING_RATE = {"full": 2e-5, "lora": 2e-4, "qlora": 2e-4}
WARMUP_FRACTION = 0.03  # warm-up ratio of Alpaca's and QLoRA's recipes
MIN_LR_FRACTION = 0.1  # the cosine floor as a share of the peak, as in the pre-training schedule
SEQ_LEN_CAP = 2048  # longer windows are memory the user should choose to spend (override data.seq_len)
POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")


def model_context_length(config_json: Path) -> int | None:
    """The longest sequence the model was built for, from its HF config.json; None if it names none."""
    try:
        data = json.loads(Path(config_json).read_text())
    except (OSError, ValueError):
        return None
    data = data.get("text_config", data) if isinstance(data, dict) else {}
    for key in POSITION_KEYS:
        value = data.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 8:
            return value
    return None


def apply_finetune_defaults(cfg) -> list[str]:
    """Set the fine-tuning defaults on the fields of `cfg` (a RunConfig with `model.pretrained`) that
    were not given; returns one line per default set, with its reason."""
    method = cfg.finetune.method if cfg.finetune is not None else "full"
    training, given = cfg.training, cfg.training.model_fields_set
    notes: list[str] = []
    if "lr" not in given:
        lr = LEARNING_RATE[method]
        if "min_lr" not in given:
            training.min_lr = lr * MIN_LR_FRACTION
        if training.min_lr <= lr:
            training.lr = lr
            source = "Alpaca's full fine-tune" if method == "full" else "QLoRA, Table 9 (7B-13B)"
            notes.append(f"training.lr={lr:g}: {method} fine-tuning peak ({source}); min_lr {training.min_lr:g}")
    if "warmup_steps" not in given:
        training.warmup_steps = max(1, math.ceil(WARMUP_FRACTION * training.max_steps))
        notes.append(f"training.warmup_steps={training.warmup_steps}: {WARMUP_FRACTION:.0%} of max_steps "
                     "(Alpaca's and QLoRA's warm-up ratio)")
    if "weight_decay" not in given:
        training.weight_decay = 0.0
        notes.append("training.weight_decay=0: no decay pulling pretrained weights toward zero (Alpaca, QLoRA); "
                     "norms and biases never decay")
    if "seq_len" not in cfg.data.model_fields_set and cfg.model.hf_config is not None:
        context = model_context_length(cfg.model.hf_config)
        if context is not None:
            cfg.data.seq_len = min(context, SEQ_LEN_CAP)
            capped = f", capped at {SEQ_LEN_CAP}" if context > SEQ_LEN_CAP else ""
            notes.append(f"data.seq_len={cfg.data.seq_len}: the model's context length ({context}{capped})")
    return notes


def pretrained_precision_default(cfg, computes_in_bf16: bool, device: str) -> str | None:
    """bf16 autocast for a pretrained model's run on a device that computes in bf16 (CUDA GPUs from Ampere
    on), when `precision.mode` was not given; sets it on `cfg` and returns the line saying so, else None.
    The one rule the trainer applies on its device and `plan --config` on the `--hardware` it names.

    Pretrained checkpoints are published in bf16, and bf16 has fp32's range (no loss scaling). A CPU
    keeps fp32: without native bf16 instructions its bf16 matmuls are emulated and slower."""
    if cfg.model.pretrained is None or "mode" in cfg.precision.model_fields_set or not computes_in_bf16:
        return None
    cfg.precision.mode = "bf16"
    return f"precision.mode=bf16: {device} computes in bf16 and pretrained weights are published in it"

