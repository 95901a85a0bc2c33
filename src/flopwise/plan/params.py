"""Exact parameter counts of transformer models from their architecture numbers.

Pure arithmetic over a `ModelSpec` (no torch): the planner calls `count_params` inside
its layout search, so it must stay cheap. Every term mirrors a weight tensor of the
HuggingFace implementation of the family (tests compare against models that
`transformers` builds on the meta device), so the counts are exact, not "12·L·h²".

Conventions (Vaswani et al. 2017 block; Shazeer 2020 for SwiGLU; Ainslie et al. 2023 for
grouped-query attention; Fedus et al. 2022 / Jiang et al. 2024 for top-k MoE):

- attention: q h→a·d, k and v h→g·d, o a·d→h, with a heads, g KV heads, d head_dim
  (a·d = h unless `head_dim` is set); biases on q/k/v (`attn_bias`) and o (`attn_out_bias`).
- MLP: GELU/ReLU has 2 matrices (h→f, f→h), SwiGLU 3 (gate, up: h→f; down: f→h).
- norms: LayerNorm has weight and bias (2h; h without bias, as MPT's), RMSNorm a weight (h).
- embeddings: token (V·h), learned positions (P·h), token types (T·h); the output head
  is V·h unless tied to the token embedding, in which case it is counted once.
- MoE: `n_experts` copies of the MLP plus a router h→E (no bias, as in Mixtral and
  Qwen2-MoE); a token uses `experts_per_token` of them, plus any shared expert.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from flopwise.catalog.models import ModelSpec, norm_tensors


@dataclass(frozen=True)
class ParamCount:
    """Parameters of a model, split the way the planner's memory and FLOPs formulas need.

    Per-layer figures are for one transformer block; `*_per_layer` times `n_layers`
    plus the embedding, head, final norm and `other` terms gives `total`.
    `active` is what one token touches in a forward pass (MoE: the routed experts only).
    """

    total: int
    active: int
    embedding: int
    output_head: int
    attention_per_layer: int
    mlp_per_layer: int
    mlp_active_per_layer: int
    norms_per_layer: int
    final_norm: int
    other: int
    non_embedding: int
    n_layers: int
    experts_per_layer: int = 0  # the routed experts' parameters in one block (expert parallelism splits them)

    @property
    def per_layer(self) -> int:
        """All parameters of one transformer block (every expert included)."""
        return self.attention_per_layer + self.mlp_per_layer + self.norms_per_layer

    def experts_elsewhere_per_layer(self, ep: int) -> float:
        """Routed-expert parameters of one block that the other ranks of an ep group hold."""
        return self.experts_per_layer * (1 - 1 / ep)

    @property
    def active_per_layer(self) -> int:
        """Parameters of one block that a single token uses."""
        return self.attention_per_layer + self.mlp_active_per_layer + self.norms_per_layer

    @property
    def active_non_embedding(self) -> int:
        """Active parameters minus embeddings and head: the N in Kaplan et al.'s C = 6·N·D."""
        return self.active - self.embedding - self.output_head


def count_params(spec: ModelSpec) -> ParamCount:
    """Count a model's parameters exactly (formulas in the module docstring).

    A CNN's `params` is taken as given: it is reported as `total`, `active` and
    `other`, with no per-layer breakdown. Results are cached per spec, since specs are
    frozen and the planner asks for the same model many times.
    """
    return _count_params(spec)


@lru_cache(maxsize=1024)
def _count_params(spec: ModelSpec) -> ParamCount:
    if spec.arch == "cnn":
        n = int(spec.params)
        return ParamCount(n, n, 0, 0, 0, 0, 0, 0, 0, n, n, 0)

    h = spec.hidden
    norm_size = norm_tensors(spec) * h

    embedding = spec.vocab_size * h + spec.type_vocab_size * h
    if spec.position == "learned":
        embedding += spec.max_positions * h
    output_head = 0 if (spec.tied_embeddings or spec.arch == "encoder") else spec.vocab_size * h

    attention = attention_params(spec)
    expert = mlp_params(h, spec.ffn_hidden, spec.mlp, spec.mlp_bias)
    if spec.n_experts > 1:
        router = h * spec.n_experts
        shared = 0
        if spec.shared_expert_ffn_hidden:
            # Qwen2-MoE: a SwiGLU shared expert and its sigmoid gate (h -> 1), both bias-free.
            shared = mlp_params(h, spec.shared_expert_ffn_hidden, spec.mlp, spec.mlp_bias) + h
        mlp = spec.n_experts * expert + router + shared
        mlp_active = spec.experts_per_token * expert + router + shared
    else:
        mlp = mlp_active = expert
    norms = spec.norms_per_layer * norm_size
    if spec.qk_norm:  # qwen3: q_norm and k_norm, one head_dim weight each, shared by the heads
        norms += 2 * (spec.head_dim or h // spec.n_heads)

    has_final_norm = spec.final_norm if spec.final_norm is not None else spec.arch != "encoder"
    final_norm = norm_size if has_final_norm else 0
    other = 0
    if spec.embedding_norm:
        other += norm_size
    if spec.pooler:
        other += h * h + h  # BERT pooler: dense h -> h with bias

    shared_terms = embedding + output_head + final_norm + other
    total = shared_terms + spec.n_layers * (attention + mlp + norms)
    active = shared_terms + spec.n_layers * (attention + mlp_active + norms)
    return ParamCount(
        total=total,
        active=active,
        embedding=embedding,
        output_head=output_head,
        attention_per_layer=attention,
        mlp_per_layer=mlp,
        mlp_active_per_layer=mlp_active,
        norms_per_layer=norms,
        final_norm=final_norm,
        other=other,
        non_embedding=total - embedding - output_head,
        n_layers=spec.n_layers,
        experts_per_layer=spec.n_experts * expert if spec.n_experts > 1 else 0,
    )


def attention_params(spec: ModelSpec) -> int:
    """One attention block: q, k, v, o projections and their biases (GQA-aware).

    With a heads of size d and g KV heads (Ainslie et al. 2023, "GQA"): q is h×(a·d),
    k and v are h×(g·d) each, o is (a·d)×h. Multi-head attention is g = a, multi-query
    attention (Shazeer 2019) is g = 1.
    """
    h = spec.hidden
    kv_heads = spec.n_kv_heads or spec.n_heads
    if spec.head_dim:
        q_out = spec.n_heads * spec.head_dim
        kv_out = kv_heads * spec.head_dim
    else:  # attention width = hidden, as in every HF family without an explicit head_dim
        q_out = h
        kv_out = h * kv_heads // spec.n_heads
    weights = h * q_out + 2 * h * kv_out + q_out * h
    out_bias = spec.attn_bias if spec.attn_out_bias is None else spec.attn_out_bias
    biases = (q_out + 2 * kv_out if spec.attn_bias else 0) + (h if out_bias else 0)
    return weights + biases


def mlp_params(hidden: int, ffn_hidden: int, mlp: str, bias: bool) -> int:
    """One dense MLP (or one expert): 2 matrices for GELU/ReLU, 3 for SwiGLU (Shazeer 2020)."""
    if mlp == "swiglu":
        return 3 * hidden * ffn_hidden + ((2 * ffn_hidden + hidden) if bias else 0)
    return 2 * hidden * ffn_hidden + ((ffn_hidden + hidden) if bias else 0)
