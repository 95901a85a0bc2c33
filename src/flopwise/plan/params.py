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
  Qwen2-MoE; gpt-oss's has one, E more, `router_bias`); a token uses `experts_per_token` of them, plus any shared expert (Qwen2-MoE's
  with a sigmoid gate h→1, DeepSeek's without). DeepSeek's first `dense_layers` blocks have a
  dense MLP of `dense_ffn_hidden` instead (DeepSeek-AI 2024, "DeepSeek-V3", §4.2).
- hybrid Mamba-2 / Transformer stacks (`ModelSpec.hybrid_pattern`; plan/mamba.py): each layer is one
  mixer — a Mamba-2 mixer (`mamba.mixer_params`), an attention block or an MLP — and one pre-norm; the
  per-layer fields then hold the average layer (the sequence mixers, Mamba and attention, under
  `attention_per_layer`), while `total` and `active` are exact.
- multi-head latent attention (DeepSeek-AI 2024, "DeepSeek-V2", §2.1; transformers'
  `DeepseekV3Attention`): q_a h→r_q, its RMSNorm (r_q), q_b r_q→a·(n+r) (or one q h→a·(n+r)
  without a query latent); kv_a h→(r_kv+r), its RMSNorm (r_kv), kv_b r_kv→a·(n+v); o a·v→h;
  with n, r, v the nope, rope and value head widths. `attn_bias` puts biases on q_a, kv_a
  and o only.
- attention sinks (gpt-oss, `attn_sinks`; transformers' `GptOssAttention.sinks`): one learned logit
  per head that joins each softmax, a parameters per layer and no matmul. A sliding window
  (`sliding_window`) adds no parameter.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from flopwise.catalog.models import ModelSpec, is_mla, norm_tensors, query_key_head_dim
from flopwise.plan import mamba


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
    dense_layers: int = 0  # leading blocks whose MLP is dense, not MoE (DeepSeek's first_k_dense_replace)
    dense_mlp_per_layer: int = 0  # the MLP of one of those blocks
    moe_layer_step: int = 1  # 1: the dense blocks lead; K: blocks K-1, 2K-1, ... are MoE (Llama 4)

    @property
    def per_layer(self) -> int:
        """All parameters of one MoE (or uniform) transformer block, every expert included."""
        return self.attention_per_layer + self.mlp_per_layer + self.norms_per_layer

    @property
    def moe_layers(self) -> int:
        """Blocks that hold routed experts: all but the leading dense ones."""
        return self.n_layers - self.dense_layers

    def experts_elsewhere_per_layer(self, ep: int) -> float:
        """Routed-expert parameters of one block that the other ranks of an ep group hold."""
        return self.experts_per_layer * (1 - 1 / ep)

    def dense_blocks_in(self, first: int, count: int) -> int:
        """How many of blocks first .. first + count - 1 are dense: the leading ones, or with an
        interleaved MoE (`moe_layer_step` K) every block but K-1, 2K-1, ..."""
        if not self.dense_layers:
            return 0
        if self.moe_layer_step > 1:
            step = self.moe_layer_step
            return count - ((first + count) // step - first // step)
        return max(0, min(first + count, self.dense_layers) - first)

    def blocks_held(self, first: int, count: int, ep: int = 1) -> float:
        """Parameters of blocks first .. first + count - 1 that one rank holds: every block's
        attention and norms, a dense block's MLP, and 1/ep of an MoE block's routed experts."""
        if not self.dense_layers:  # every block alike (the search asks this many thousand times)
            return count * (self.per_layer - self.experts_elsewhere_per_layer(ep))
        dense = self.dense_blocks_in(first, count)
        moe = count - dense
        return (count * (self.attention_per_layer + self.norms_per_layer) + dense * self.dense_mlp_per_layer
                + moe * (self.mlp_per_layer - self.experts_elsewhere_per_layer(ep)))

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
        router = h * spec.n_experts + (spec.n_experts if spec.router_bias else 0)
        shared = 0
        if spec.shared_expert_ffn_hidden:
            # Qwen2-MoE: a SwiGLU shared expert and its sigmoid gate (h -> 1), both bias-free;
            # DeepSeek: the shared expert(s) alone, always added
            shared = mlp_params(h, spec.shared_expert_ffn_hidden, spec.mlp, spec.mlp_bias)
            shared += h if spec.shared_expert_gate else 0
        mlp = spec.n_experts * expert + router + shared
        mlp_active = spec.experts_per_token * expert + router + shared
    else:
        mlp = mlp_active = expert
    dense_mlp = mlp_params(h, spec.dense_ffn_hidden, spec.mlp, spec.mlp_bias) if spec.dense_layers else 0
    norms = spec.norms_per_layer * norm_size
    if spec.qk_norm:  # qwen3: q_norm and k_norm, one head_dim weight each, shared by the heads
        norms += 2 * (spec.head_dim or h // spec.n_heads)
    if is_mla(spec):  # RMSNorms over the query latent (when there is one) and the KV latent
        norms += spec.q_lora_rank + spec.kv_lora_rank

    has_final_norm = spec.final_norm if spec.final_norm is not None else spec.arch != "encoder"
    final_norm = norm_size if has_final_norm else 0
    other = 0
    if spec.embedding_norm:
        other += norm_size
    if spec.pooler:
        other += h * h + h  # BERT pooler: dense h -> h with bias

    shared_terms = embedding + output_head + final_norm + other
    mix = mamba.layer_mix(spec)
    if mix is not None:
        return _hybrid_count(spec, mix, shared_terms, embedding, output_head, final_norm, other, attention,
                             expert, norm_size)
    moe_layers = spec.n_layers - spec.dense_layers
    blocks = spec.n_layers * (attention + norms) + spec.dense_layers * dense_mlp
    total = shared_terms + blocks + moe_layers * mlp
    active = shared_terms + blocks + moe_layers * mlp_active
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
        dense_layers=spec.dense_layers,
        dense_mlp_per_layer=dense_mlp,
        moe_layer_step=spec.moe_layer_step,
    )


def _hybrid_count(spec: ModelSpec, mix: mamba.LayerMix, shared_terms: int, embedding: int, output_head: int,
                  final_norm: int, other: int, attention: int, mlp: int, norm: int) -> ParamCount:
    """A hybrid stack: its Mamba, attention and MLP layers each counted exactly, one pre-norm per layer
    (Megatron-Core fuses it into the layer's first linear, TELayerNormColumnParallelLinear); the per-layer
    fields are the average layer, sequence mixers (Mamba and attention) under `attention_per_layer`."""
    layers = spec.n_layers
    mixers = mix.mamba * mamba.mixer_params(spec) + mix.attention * attention
    mlps = mix.mlp * mlp
    total = shared_terms + mixers + mlps + layers * norm
    return ParamCount(
        total=total, active=total, embedding=embedding, output_head=output_head,
        attention_per_layer=mixers / layers, mlp_per_layer=mlps / layers, mlp_active_per_layer=mlps / layers,
        norms_per_layer=norm, final_norm=final_norm, other=other, non_embedding=total - embedding - output_head,
        n_layers=layers,
    )


def attention_params(spec: ModelSpec) -> int:
    """One attention block: q, k, v, o projections and their biases (GQA-aware).

    With a heads of size d and g KV heads (Ainslie et al. 2023, "GQA"): q is h×(a·d),
    k and v are h×(g·d) each, o is (a·d)×h. Multi-head attention is g = a, multi-query
    attention (Shazeer 2019) is g = 1. Multi-head latent attention: `mla_attention_params`.
    gpt-oss's sinks add one logit per head (module docstring).
    """
    if is_mla(spec):
        return mla_attention_params(spec)
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
    sinks = spec.n_heads if spec.attn_sinks else 0
    return weights + biases + sinks


def mla_attention_params(spec: ModelSpec) -> int:
    """One multi-head latent attention block without its latent norms (counted with the
    norms): the projections of transformers' `DeepseekV3Attention` (module docstring)."""
    h, a, r_kv, rope = spec.hidden, spec.n_heads, spec.kv_lora_rank, spec.qk_rope_head_dim
    qk = query_key_head_dim(spec)
    bias = spec.attn_bias
    out_bias = spec.attn_bias if spec.attn_out_bias is None else spec.attn_out_bias
    if spec.q_lora_rank:
        query = h * spec.q_lora_rank + (spec.q_lora_rank if bias else 0) + spec.q_lora_rank * a * qk
    else:
        query = h * a * qk  # q_proj has no bias, whatever attention_bias says
    latent = r_kv + rope
    key_value = h * latent + (latent if bias else 0) + r_kv * a * (spec.qk_nope_head_dim + spec.v_head_dim)
    output = a * spec.v_head_dim * h + (h if out_bias else 0)
    return query + key_value + output


def mlp_params(hidden: int, ffn_hidden: int, mlp: str, bias: bool) -> int:
    """One dense MLP (or one expert): 2 matrices for GELU/ReLU, 3 for SwiGLU (Shazeer 2020)."""
    if mlp == "swiglu":
        return 3 * hidden * ffn_hidden + ((2 * ffn_hidden + hidden) if bias else 0)
    return 2 * hidden * ffn_hidden + ((ffn_hidden + hidden) if bias else 0)
