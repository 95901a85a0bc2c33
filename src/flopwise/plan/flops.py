"""Training FLOPs: per token (transformers) or per sample (CNNs), model vs hardware FLOPs.

Conventions (stated once, used everywhere):

- A multiply-add is 2 FLOPs. Forward matmul FLOPs per token are 2·N for N weights that
  take part in a matmul; backward is twice the forward (Kaplan et al. 2020, §2.1), so a
  training step costs 6·N per token.
- N (`matmul_params`) is the *active, non-embedding* parameter count plus the output
  projection h·V (counted even when it is tied to the input embedding, because the
  logits matmul runs either way). Embedding lookups cost no matmul FLOPs. Kaplan et al.
  (2020, Table 1) drop the de-embedding term as small; Narayanan et al. (2021, eq. 3,
  the `V/(12·h·L)` term) keep it. For GPT-3 175B this N differs from the total count
  by < 0.4 %.
- Attention scores: per layer and token, Q·Kᵀ and A·V cost 2·s·d each in the forward
  pass (d = n_heads·head_dim), i.e. 4·s·d·L forward and 12·s·d·L forward+backward,
  counted over the full s×s matrix *without* causal halving, like PaLM (Chowdhery et
  al. 2022, App. B: 6N + 12·L·H·Q·T) and MosaicML's MFU formula. Multi-head latent
  attention's query/key and value heads differ (DeepSeek-V3: 192 and 128): Q·Kᵀ costs
  2·s·a·d_qk and A·V 2·s·a·d_v, so d is their mean (`attention_dim`). A layer with a sliding window
  of w keys (gpt-oss's every other layer, Mistral 7B's every layer) counts the same s×s convention
  times the share of the causal pairs its window keeps (`window.kept_share`: ≈ 2w/s for w << s, 1
  for w >= s), so its forward is ≈ 4·2w·d per token: the band's work doubled exactly as a full
  layer's causal half is doubled to s×s. The ratio of windowed to full work is then the one
  Megatron-Bridge's MFU formula counts (`calculate_swa_context`: w - w(w-1)/(2s) against s/2).
- Model FLOPs (for MFU) exclude recomputation; hardware FLOPs (for HFU and time) include
  it: full recompute runs every layer's forward again (+2N + 4·s·d·L per token, the
  "8N" rule), selective recompute (Korthikanti et al. 2022, §4.2) re-runs only the
  attention core (+4·s·d·L). Flash attention's own backward recompute of Q·Kᵀ is not
  counted (it is inside the kernel's measured speed, like MosaicML's figures).
- Hybrid Mamba-2 / Transformer stacks (plan/mamba.py): the attention-score term counts the "*" layers
  only, and each Mamba layer adds its SSD scan as Megatron counts it for MFU, 7·d·N per token forward
  (`megatron/training/training.py`, `mamba_layer_flops`), carried in `attention_per_unit` with the
  attention scores (the sequence-mixing work that is not a weight's). The conv1d's weights, like every
  norm's, stay in N. Against Megatron's `hybrid_flops` this differs only by the conventions above: no
  causal halving of the attention scores, and 6 FLOPs per token for each weight that is not a GEMM's
  (norms, conv1d, dt_bias, A_log, D), which Megatron leaves out. Full recompute re-runs the scan;
  selective recompute (Megatron's core attention) does not.
- CNN (ResNet-50): `flops_per_sample` is the forward cost of one sample; training is 3×
  forward (1 forward + 2 for backward), full recompute adds one forward (4×).
"""

from __future__ import annotations

from dataclasses import dataclass

from flopwise.catalog.models import ModelSpec, query_key_head_dim, value_head_dim
from flopwise.plan.mamba import attention_layers, layer_mix, scan_flops_forward
from flopwise.plan import recompute_modules
from flopwise.plan.memory import recompute_forward_fraction
from flopwise.plan.params import ParamCount
from flopwise.plan.window import attention_work_share

PF_DAY = 1e15 * 86_400  # FLOPs in one petaflop/s-day (Brown et al. 2020, App. D)


@dataclass(frozen=True)
class FlopsEstimate:
    """FLOPs of one training job. `unit` is "token" (transformers) or "sample" (CNNs)."""

    unit: str
    matmul_params: float
    dense_per_unit: float
    attention_per_unit: float
    model_per_unit: float
    hardware_per_unit: float
    units: float
    model_total: float
    hardware_total: float
    pf_days: float
    kaplan_6nd_total: float

    def to_dict(self) -> dict:
        """JSON-able fields."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def matmul_params(spec: ModelSpec, params: ParamCount) -> int:
    """N for the 6·N rule: active non-embedding weights plus the h·V output projection."""
    head_matmul = spec.hidden * spec.vocab_size if spec.arch == "decoder" else 0
    return params.active_non_embedding + head_matmul


def attention_dim(spec: ModelSpec) -> float:
    """d = n_heads · head_dim: the width of Q, and of the attention output; under MLA the mean
    of the query/key width a·d_qk (Q·Kᵀ) and the value width a·d_v (A·V)."""
    if not spec.n_heads:
        return 0
    return spec.n_heads * (query_key_head_dim(spec) + value_head_dim(spec)) / 2


def attention_flops_forward(n_layers: int, seq_len: int, attn_dim: int, work_share: float = 1.0) -> float:
    """Forward Q·Kᵀ + A·V FLOPs per token: 2·s·d + 2·s·d per layer, no causal halving (PaLM App. B);
    `work_share` scales it for sliding-window layers (`window.attention_work_share`)."""
    return 4.0 * n_layers * seq_len * attn_dim * work_share


def six_n_d(n_params: float, tokens: float) -> float:
    """Kaplan et al. (2020) training compute C ≈ 6·N·D."""
    return 6.0 * n_params * tokens


def pf_days(flops: float) -> float:
    """FLOPs as petaflop/s-days (1 PF-day = 1e15 FLOP/s × 86,400 s)."""
    return flops / PF_DAY


def module_recompute_flops(spec: ModelSpec, params: ParamCount, modules: frozenset[str], attn_fwd: float) -> float:
    """Forward FLOPs per token that Megatron-Core's per-module recompute runs again
    (`plan/recompute_modules.py`): the attention core, the recomputed MLPs' matmuls (a dense block's
    MLP, an MoE block's active experts and shared expert), MLA's up projections."""
    extra = attn_fwd if "core_attn" in modules else 0.0
    if spec.n_experts <= 1:
        dense_mlp, moe_mlp = params.n_layers * params.mlp_active_per_layer, 0.0
    else:
        dense_mlp = params.dense_layers * params.dense_mlp_per_layer
        moe_mlp = params.moe_layers * params.mlp_active_per_layer
    extra += 2.0 * ((dense_mlp if "mlp" in modules else 0.0) + (moe_mlp if "moe" in modules else 0.0))
    if "shared_experts" in modules and "moe" not in modules and spec.shared_expert_ffn_hidden:
        per_shared = (3 if spec.mlp == "swiglu" else 2) * spec.hidden * spec.shared_expert_ffn_hidden
        extra += 2.0 * params.moe_layers * per_shared
    if "mla_up_proj" in modules:
        a, qk, dv = spec.n_heads, query_key_head_dim(spec), value_head_dim(spec)
        up = a * (spec.qk_nope_head_dim + dv) * spec.kv_lora_rank + (a * qk * spec.q_lora_rank if spec.q_lora_rank else 0)
        extra += 2.0 * spec.n_layers * up
    return extra


def estimate_flops(
    spec: ModelSpec, params: ParamCount, seq_len: int, recompute: str, units: float, early_stop: bool = False
) -> FlopsEstimate:
    """Per-unit and total model/hardware FLOPs for `units` tokens (or samples for a CNN). `early_stop`:
    a block recompute that stops once the backward's tensors are rebuilt (`ops.layer_times`) leaves each
    dense block's down projection, 2·f·h per token, out of the hardware FLOPs."""
    if spec.arch == "cnn":
        forward = float(spec.flops_per_sample)
        model = 3.0 * forward
        hardware = model + (forward if recompute == "full" else 0.0)
        return FlopsEstimate(
            "sample", float(params.total), model, 0.0, model, hardware, units,
            model * units, hardware * units, pf_days(model * units), model * units,
        )
    n = matmul_params(spec, params)
    attn_fwd = attention_flops_forward(attention_layers(spec), seq_len, attention_dim(spec),
                                       attention_work_share(spec, seq_len))
    mixer_fwd = attn_fwd + scan_flops_forward(spec)  # a hybrid's SSD scans too (0 for other models)
    dense = 6.0 * n
    attention = 3.0 * mixer_fwd
    model = dense + attention
    dense_blocks = spec.n_experts <= 1 and layer_mix(spec) is None
    rerun = 2.0 * n + mixer_fwd - (2.0 * spec.ffn_hidden * spec.hidden * spec.n_layers
                                    if early_stop and dense_blocks else 0.0)
    if recompute == "full":
        hardware = model + rerun
    elif recompute == "selective":
        hardware = model + attn_fwd
    elif recompute == "op":  # per-op policy: every second matmul re-run, attention output kept
        hardware = model + recompute_forward_fraction(recompute) * 2.0 * n
    elif (modules := recompute_modules.parse(recompute)) is not None:
        hardware = model + module_recompute_flops(spec, params, modules, attn_fwd)
    else:  # none, or every:K (full recompute of one block in K)
        hardware = model + recompute_forward_fraction(recompute) * rerun
    model_total = model * units
    return FlopsEstimate(
        "token", float(n), dense, attention, model, hardware, units,
        model_total, hardware * units, pf_days(model_total),
        six_n_d(params.active_non_embedding, units),
    )
