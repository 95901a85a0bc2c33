"""Model catalog: `specs/models.yaml` and HuggingFace `config.json` files as `ModelSpec`s."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelSpec:
    """The architecture numbers the planner needs; nothing about how it is trained.

    `arch` is "decoder" (causal LM), "encoder" (BERT-style) or "cnn". For a CNN only
    `params` and `flops_per_sample` (forward, per sample) are meaningful, and the planner
    plans per sample rather than per token.
    """

    key: str
    name: str
    arch: str = "decoder"
    n_layers: int = 0
    hidden: int = 0
    n_heads: int = 0
    n_kv_heads: int = 0
    ffn_hidden: int = 0
    vocab_size: int = 0
    seq_len: int = 0
    max_positions: int = 0
    mlp: str = "gelu"  # "gelu" (2 matrices) | "swiglu" (3 matrices)
    norm: str = "layernorm"  # "layernorm" (weight+bias) | "rmsnorm" (weight only)
    position: str = "learned"  # "learned" | "rope" | "alibi"
    tied_embeddings: bool = False
    attn_bias: bool = False
    mlp_bias: bool = False
    n_experts: int = 1
    experts_per_token: int = 1
    type_vocab_size: int = 0  # BERT token-type embeddings
    pooler: bool = False  # BERT pooler dense layer
    embedding_norm: bool = False  # a norm right after the embeddings (BERT, BLOOM)
    head_dim: int = 0  # 0 means hidden // n_heads
    params: int = 0  # CNN: total parameters (decoders/encoders derive it)
    flops_per_sample: float = 0.0  # CNN: forward FLOPs per sample
    source: str = ""
