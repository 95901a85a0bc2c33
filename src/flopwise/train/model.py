"""The network: the built-in decoder (llama- or gpt2-style) and HuggingFace causal LMs.

The built-in decoder follows nanoGPT (Karpathy) for structure and initialisation and
LLaMA (Touvron et al. 2023, arXiv:2302.13971) for the "llama" variant: pre-norm RMSNorm,
rotary position embeddings (Su et al. 2021, arXiv:2104.09864), SwiGLU MLP (Shazeer 2020,
arXiv:2002.05202), grouped-query attention (Ainslie et al. 2023, arXiv:2305.13245) and no
biases. The "gpt2" variant is GPT-2 (Radford et al. 2019): LayerNorm with bias, learned
positions, GELU MLP of width 4h, biases everywhere.

The model knows nothing about distribution or precision: parallelism, autocast and
activation checkpointing are applied from outside (see `train/parallel/parallelize.py`,
`train/techniques/precision.py`, `train/techniques/activation_checkpointing.py`). Every model's `forward(input_ids)`
returns logits `[B, T, V]`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from flopwise.errors import UserError
from flopwise.config.model_shape import check_shape, ffn_hidden_of, hf_config_path, kv_heads_of
from flopwise.rotary import apply_rotary, rotary_tables
from flopwise.config.schema import ModelConfig

INIT_STD = 0.02  # GPT-2 / nanoGPT initialisation
class CausalSelfAttention(nn.Module):
    """Multi-head causal attention with grouped key/value heads and optional RoPE."""

    def __init__(self, cfg: ModelConfig, bias: bool):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.n_kv_heads = kv_heads_of(cfg)
        self.head_dim = cfg.hidden // cfg.n_heads
        self.dropout = cfg.dropout
        self.wq = nn.Linear(cfg.hidden, self.n_heads * self.head_dim, bias=bias)
        self.wk = nn.Linear(cfg.hidden, self.n_kv_heads * self.head_dim, bias=bias)
        self.wv = nn.Linear(cfg.hidden, self.n_kv_heads * self.head_dim, bias=bias)
        self.wo = nn.Linear(self.n_heads * self.head_dim, cfg.hidden, bias=bias)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        B, T, _ = x.shape
        # Head counts come from the projections' widths (-1), so a tensor-parallel rank that
        # owns n_heads/tp of them runs this same code.
        q = self.wq(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        if rope is not None:
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        if k.shape[1] != q.shape[1]:
            # GQA: each key/value head serves n_heads / n_kv_heads query heads.
            repeat = q.shape[1] // k.shape[1]
            k = k.repeat_interleave(repeat, dim=1)
            v = v.repeat_interleave(repeat, dim=1)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        y = y.transpose(1, 2).reshape(B, T, -1)
        return self.resid_dropout(self.wo(y))


class SwiGLU(nn.Module):
    """LLaMA's MLP: w2(silu(w1 x) * w3 x) (Shazeer 2020)."""

    def __init__(self, hidden: int, ffn_hidden: int, dropout: float):
        super().__init__()
        self.w1 = nn.Linear(hidden, ffn_hidden, bias=False)
        self.w3 = nn.Linear(hidden, ffn_hidden, bias=False)
        self.w2 = nn.Linear(ffn_hidden, hidden, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.w2(F.silu(self.w1(x)) * self.w3(x)))


class GeluMLP(nn.Module):
    """GPT-2's MLP: c_proj(gelu(c_fc x)), with biases."""

    def __init__(self, hidden: int, ffn_hidden: int, dropout: float):
        super().__init__()
        self.c_fc = nn.Linear(hidden, ffn_hidden)
        self.c_proj = nn.Linear(ffn_hidden, hidden)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


def make_norm(cfg: ModelConfig) -> nn.Module:
    """RMSNorm (weight only) for llama, LayerNorm (weight + bias) for gpt2."""
    if cfg.kind == "llama":
        return nn.RMSNorm(cfg.hidden, eps=cfg.norm_eps)
    return nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps)


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        llama = cfg.kind == "llama"
        self.attn_norm = make_norm(cfg)
        self.attn = CausalSelfAttention(cfg, bias=not llama)
        self.mlp_norm = make_norm(cfg)
        mlp = SwiGLU if llama else GeluMLP
        self.mlp = mlp(cfg.hidden, ffn_hidden_of(cfg), cfg.dropout)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rope)
        return x + self.mlp(self.mlp_norm(x))


class Decoder(nn.Module):
    """The built-in decoder-only language model (llama or gpt2 variant)."""

    def __init__(self, cfg: ModelConfig, vocab_size: int):
        super().__init__()
        check_shape(cfg)
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.tok_emb = nn.Embedding(vocab_size, cfg.hidden)
        self.pos_emb = nn.Embedding(cfg.max_seq_len, cfg.hidden) if cfg.kind == "gpt2" else None
        self.emb_dropout = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.final_norm = make_norm(cfg)
        self.lm_head = nn.Linear(cfg.hidden, vocab_size, bias=False)
        if cfg.kind == "llama":
            cos, sin = rotary_tables(cfg.hidden // cfg.n_heads, cfg.max_seq_len, cfg.rope_theta)
            # Not persistent: derived from the config, so checkpoints hold only learned weights.
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight

    def reset_parameters(self) -> None:
        """nanoGPT's init: N(0, 0.02), zero biases, residual projections scaled by 1/sqrt(2L) (GPT-2 paper, sec. 2.3)."""
        residual_std = INIT_STD / math.sqrt(2 * self.cfg.n_layers)
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                last = name.rsplit(".", 1)[-1]
                std = residual_std if last in ("wo", "w2", "c_proj") else INIT_STD
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
                module.reset_parameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids in, logits out.

        A pipeline stage is this same module with some layers set to None (torchtitan's
        pattern): without `tok_emb` it takes hidden states, without `final_norm` /
        `lm_head` it returns them.
        """
        T = x.shape[1]
        if T > self.cfg.max_seq_len:
            raise UserError(
                f"sequence length {T} exceeds model.max_seq_len={self.cfg.max_seq_len}; raise model.max_seq_len or lower data.seq_len"
            )
        rope = (self.rope_cos[:T], self.rope_sin[:T]) if self.cfg.kind == "llama" else None
        if self.tok_emb is not None:
            ids = x
            x = self.tok_emb(ids)
            if self.pos_emb is not None:
                x = x + self.pos_emb(torch.arange(T, device=ids.device))
            x = self.emb_dropout(x)
        for block in self.blocks:
            x = block(x, rope)
        if self.final_norm is not None:
            x = self.final_norm(x)
        if self.lm_head is not None:
            x = self.lm_head(x)
        return x


class HFCausalLM(nn.Module):
    """A HuggingFace causal LM whose forward returns the logits tensor, like the built-in one."""

    def __init__(self, hf_model: nn.Module):
        super().__init__()
        self.hf = hf_model
        self.vocab_size = hf_model.config.vocab_size

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                segment_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Logits; with `segment_ids` (packed documents) attention stays inside each document
        and `position_ids` restart per document (train/data/packing.py)."""
        if segment_ids is None:
            return self.hf(input_ids=input_ids, use_cache=False).logits
        from flopwise.train.data.packing import attention_inputs

        device = input_ids.device.type  # the mask is added to the scores: give it their dtype
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) \
            else self.hf.get_input_embeddings().weight.dtype
        boundaries = attention_inputs(segment_ids, position_ids, dtype=dtype)
        return self.hf(input_ids=input_ids, use_cache=False, **boundaries).logits


def load_hf_config(cfg: ModelConfig):
    """Read a local config.json into a `transformers` config; never touches the hub."""
    path = hf_config_path(cfg)
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"model.hf_config: {path} is not valid JSON ({exc})") from None
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise UserError(f"model.hf_config: {path} has no \"model_type\" key; is it a HuggingFace config.json?")
    from transformers import AutoConfig

    refuse_remote_code_without_switch(cfg, raw, path)
    try:
        if raw.get("auto_map") and cfg.trust_remote_code:
            # Remote code lives next to config.json; AutoConfig needs the folder.
            return AutoConfig.from_pretrained(
                str(path.parent), trust_remote_code=True, local_files_only=True
            )
        raw.pop("auto_map", None)
        return AutoConfig.for_model(raw.pop("model_type"), **raw)
    except Exception as exc:  # noqa: BLE001  (transformers' checks raise what they like: ZeroDivisionError, ...)
        raise UserError(f"model.hf_config: {path} cannot be read by transformers: {root_cause(exc)}") from None


def refuse_remote_code_without_switch(cfg: ModelConfig, raw: dict | None = None, path: Path | None = None) -> None:
    """One line when the HF config needs its own Python files (auto_map) and the command line did not allow them.

    Called by the launcher before any data is prepared, and again when the model is built.
    """
    if cfg.kind != "hf" or cfg.trust_remote_code:
        return
    if raw is None:
        path = hf_config_path(cfg)
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            return  # load_hf_config says what is wrong with the file
    if not isinstance(raw, dict) or not raw.get("auto_map"):
        return
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if raw.get("model_type") not in CONFIG_MAPPING:
        raise UserError(
            f"model.hf_config: {path} needs its own code (model_type {raw.get('model_type')!r}, auto_map); "
            "to run the Python files next to it, say so on the command line: model.trust_remote_code=true for "
            "`flopwise train`, --trust-remote-code for export / compress / generate (a file cannot switch it on)"
        )


def root_cause(exc: BaseException) -> str:
    """The innermost cause's first line (transformers wraps its validators' ValueErrors), with its kind."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    text = str(exc).strip()
    first = text.splitlines()[0][:300] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def build_hf_model(cfg: ModelConfig, vocab_size: int) -> HFCausalLM:
    """A randomly initialised HF causal LM (fp32) from a local config.json."""
    from transformers import AutoModelForCausalLM

    hf_config = load_hf_config(cfg)
    model_vocab = getattr(hf_config, "vocab_size", None)
    if model_vocab is not None and vocab_size > model_vocab:
        raise UserError(
            f"the tokenizer has {vocab_size} tokens but model.hf_config vocab_size is {model_vocab}; "
            f"lower data.vocab_size to <= {model_vocab} or raise vocab_size in the config.json"
        )
    try:
        hf_model = AutoModelForCausalLM.from_config(
            hf_config, trust_remote_code=cfg.trust_remote_code, dtype=torch.float32
        )
    except (ValueError, TypeError, ZeroDivisionError, RuntimeError) as exc:  # RuntimeError: the allocator
        raise UserError(f"model.hf_config: cannot build a causal LM from it: {root_cause(exc)}") from None
    return HFCausalLM(hf_model)


def build_model(cfg: ModelConfig, vocab_size: int) -> nn.Module:
    """The network named by `cfg`, fp32 on CPU, initialised from the torch RNG (seed it first)."""
    if cfg.kind == "hf":
        return build_hf_model(cfg, vocab_size)
    return Decoder(cfg, vocab_size)


def transformer_blocks(model: nn.Module) -> nn.ModuleList:
    """The repeated decoder layers, for per-block wrapping (FSDP2 units, checkpointing).

    Built-in models keep them in `model.blocks`; for HF models (and anything wrapping
    them) it is the ModuleList holding the most parameters (`model.layers`,
    `transformer.h`, `gpt_neox.layers`, ...).
    """
    blocks = getattr(model, "blocks", None)
    if isinstance(blocks, nn.ModuleList):
        return blocks
    best, best_params = None, -1
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) > 0:
            n = sum(p.numel() for p in module.parameters())
            if n > best_params:
                best, best_params = module, n
    if best is None:
        raise UserError(f"{type(model).__name__} has no list of transformer blocks to wrap")
    return best
