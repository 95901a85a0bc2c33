"""Mamba-2 mixer layers and the layer mix of hybrid Mamba-2 / Transformer models (NVIDIA Nemotron-H).

A hybrid model (Megatron-Core `megatron/core/models/hybrid/`, NeMo's `NemotronHConfig*`) is a stack of
single-mixer layers named by one character each of `hybrid_override_pattern`: "M" a Mamba-2 mixer, "*"
self-attention, "-" an MLP (`hybrid_layer_allocation.py`). Every layer is pre-norm with its own residual,
the norm fused into its first linear (`hybrid_layer_specs.py`: TELayerNormColumnParallelLinear for the
mixer's in_proj, the attention's linear_qkv and the MLP's linear_fc1). Megatron's `num_layers` counts
the characters, so `ModelSpec.n_layers` does too.

How the planner plans them: the average layer. Parameters, FLOPs, per-layer time, saved activations and
tensor-parallel collectives per layer are the count-weighted mean over the three kinds of layer
(`LayerMix`), and every other formula keeps treating the n_layers layers as alike. That is exact for a
whole model on one pipeline stage (pp = 1, how NeMo's `nemotronh` recipes run these models:
`scripts/performance/recommended_model_configs/model_configs_h100.csv`); with pp > 1 each stage is
assumed to hold the same mix, where the real split gives a stage whichever layers the pattern puts there.

The Mamba-2 mixer as Megatron-Core's `MambaMixer` builds and trains it (`megatron/core/ssm/mamba_mixer.py`,
the memory-efficient `_ssm_training` path), with h the hidden size, H heads of P channels (d = H·P the
inner width), G groups of the state size N, conv width W and t the tensor-parallel size:

    in_proj   column-parallel GEMM h -> (2d + 2GN + H)/t: z, x, B, C and dt, each split over t
    conv1d    depthwise causal conv (W taps) over x, B, C: d + 2GN channels, split over t
    SSD scan  the chunked state-space-duality algorithm over chunks of Q tokens (Dao & Gu 2024,
              "Transformers are SSMs", §6), gated by silu(z): `mamba_split_conv1d_scan_combined`
    norm      a grouped RMSNorm over the d/t channels (weight d)
    out_proj  row-parallel GEMM d/t -> h
    plus dt_bias, A_log and D (H each).

Tensor parallelism splits heads and groups (Megatron asserts both divide by t), so the scan, conv and
norm run on a t-th of the channels without communication: a Mamba layer has the one forward reduction
after out_proj and the one backward reduction of in_proj's input gradient of any column/row-parallel
pair (all-gather and reduce-scatter under sequence parallelism), as the attention and MLP layers do.
"""

from __future__ import annotations

from dataclasses import dataclass

from flopwise.catalog.models import ModelSpec, is_hybrid

SSD_BACKWARD_FACTOR = 2.5
"""The SSD backward's work over its forward's, in matmul FLOPs and in bytes moved. Its backward
(`_mamba_chunk_scan_combined_bwd` of mamba_ssm's `ops/triton/ssd_combined.py`, as understood) first
recomputes C·Bᵀ and the chunk states, then runs two products for each of the forward's four: 2 + 2·4 = 10
against 4, FlashAttention's 2.5 as well (its backward recomputes Q·Kᵀ)."""


@dataclass(frozen=True)
class LayerMix:
    """How many layers of each kind a hybrid stack holds ("M", "*" and "-" of its pattern)."""

    mamba: int
    attention: int
    mlp: int

    @property
    def layers(self) -> int:
        """All layers: the pattern's length."""
        return self.mamba + self.attention + self.mlp


def layer_mix(spec: ModelSpec) -> LayerMix | None:
    """The layer counts of a hybrid model's pattern, or None for a model of uniform blocks."""
    if not is_hybrid(spec):
        return None
    pattern = spec.hybrid_pattern
    return LayerMix(pattern.count("M"), pattern.count("*"), pattern.count("-"))


def attention_layers(spec: ModelSpec) -> int:
    """Layers that run self-attention: every block of a uniform model, the "*" layers of a hybrid one."""
    mix = layer_mix(spec)
    return spec.n_layers if mix is None else mix.attention


def inner_width(spec: ModelSpec) -> int:
    """d = heads × head_dim: the Mamba-2 mixer's x, z and y width (`MambaMixer.d_inner`)."""
    return spec.mamba_heads * spec.mamba_head_dim


def in_proj_width(spec: ModelSpec) -> int:
    """in_proj's output: z and x (d each), B and C (G·N each) and dt (one per head): 2d + 2GN + H."""
    return 2 * inner_width(spec) + 2 * spec.mamba_groups * spec.mamba_state + spec.mamba_heads


def conv_channels(spec: ModelSpec) -> int:
    """The conv1d's channels, x, B and C: d + 2GN (`MambaMixer` conv_dim)."""
    return inner_width(spec) + 2 * spec.mamba_groups * spec.mamba_state


def mixer_params(spec: ModelSpec) -> int:
    """One Mamba-2 mixer's parameters, without the layer's pre-norm (counted with the norms): in_proj
    h × (2d + 2GN + H); conv1d weight (d + 2GN) × W and bias (d + 2GN); dt_bias, A_log and D, H each;
    the gated RMSNorm's weight d; out_proj d × h. No linear biases (Megatron asserts `not bias`)."""
    h, d, channels = spec.hidden, inner_width(spec), conv_channels(spec)
    return h * in_proj_width(spec) + channels * spec.mamba_conv + channels + 3 * spec.mamba_heads + d + d * h


def megatron_scan_flops_forward(spec: ModelSpec) -> float:
    """The SSD scan's forward FLOPs per token and Mamba layer as Megatron counts them for MFU: 7·d·N
    (`megatron/training/training.py`, `mamba_layer_flops`, "scan"; there with d = 2h, here the mixer's
    own d = H·P, which is 2h in every Nemotron-H)."""
    return 7.0 * inner_width(spec) * spec.mamba_state


def scan_flops_forward(spec: ModelSpec) -> float:
    """The SSD scan's forward FLOPs per token summed over the model's Mamba layers (0 without any)."""
    mix = layer_mix(spec)
    return mix.mamba * megatron_scan_flops_forward(spec) if mix is not None and mix.mamba else 0.0


def ssd_products(spec: ModelSpec, seq_len: int, micro_batch: int, tp: int) -> list[tuple[int, int, int, int]]:
    """(M, N, K, count) of the SSD forward's chunk matmuls on one rank (Dao & Gu 2024, §6; the kernels of
    Megatron-Core's `ssm/ops/mamba2/ssd_combined.py` `_mamba_chunk_scan_combined_fwd`), with Q the chunk,
    c = b·⌈s/Q⌉ chunks, H/t heads and G/t groups on the rank:

        C·Bᵀ           per chunk and group: Q × Q over N           (`_bmm_chunk_fwd`)
        chunk states   per chunk and head:  N × P over Q            (`_chunk_state_fwd`: Bᵀ·x)
        intra-chunk    per chunk and head:  Q × P over Q            (`_chunk_scan_fwd`: (L ∘ C·Bᵀ)·x)
        inter-chunk    per chunk and head:  Q × P over N            (`_chunk_scan_fwd`: C·state)

    The intra-chunk product is counted whole (the causal mask L is applied element-wise), the sequential
    pass of the states between chunks (`_state_passing_fwd`) is not a matmul and is left to the bytes."""
    q = spec.mamba_chunk
    chunks = micro_batch * -(-seq_len // q)
    heads, groups = spec.mamba_heads // tp, spec.mamba_groups // tp
    n, p = spec.mamba_state, spec.mamba_head_dim
    return [(q, q, n, chunks * groups), (n, p, q, chunks * heads), (q, p, q, chunks * heads),
            (q, p, n, chunks * heads)]


def ssd_bytes_forward(spec: ModelSpec, tp: int, e: float) -> tuple[float, int]:
    """(bytes per token, kernels) the SSD forward moves on one rank, kernel by kernel as
    `_mamba_chunk_scan_combined_fwd` runs them: chunk states read x and B and write fp32 states (d·N/Q per
    token); the state pass reads them and writes them in the 16-bit dtype; C·Bᵀ reads B and C and writes
    fp32 (G·Q per token); the chunk scan reads C·Bᵀ, x, z, C and the passed states and writes the gated
    output and the pre-gate output the backward keeps (`out_x`); dt's cumulative sums are O(H) and left out."""
    d, gn = inner_width(spec) / tp, spec.mamba_groups * spec.mamba_state / tp
    q = spec.mamba_chunk
    states = d * spec.mamba_state / q
    cb = spec.mamba_groups / tp * q
    chunk_state = (d + gn) * e + 4.0 * states
    state_pass = 4.0 * states + e * states
    bmm = 2.0 * gn * e + 4.0 * cb
    chunk_scan = 4.0 * cb + (2.0 * d + gn) * e + e * states + 2.0 * d * e
    return chunk_state + state_pass + bmm + chunk_scan, 5


def elementwise_bytes_forward(spec: ModelSpec, tp: int, e: float, micro_batch: int) -> tuple[float, int]:
    """(bytes per token, kernels) of the mixer's memory-bound work outside the scan, forward, on one rank:
    the causal conv1d over x, B and C (read + write d + 2GN; the fused path runs it in its own kernel) and
    the grouped RMSNorm (read + write d); with more than one sequence per micro-batch also
    `_ssm_training`'s `rearrange(...).contiguous()` copies of in_proj's output (2d + 2GN + H) from
    [s, b] to [b, s] order and of the scan's output (d) back, which with b = 1 are views."""
    width, channels, d = in_proj_width(spec) / tp, conv_channels(spec) / tp, inner_width(spec) / tp
    if micro_batch > 1:
        return 2.0 * e * (channels + d + width + d), 4
    return 2.0 * e * (channels + d), 2


def saved_widths(spec: ModelSpec) -> tuple[int, int]:
    """(elements per token the mixer's fused scan keeps for backward, elements per token its norm keeps),
    across all tensor-parallel ranks: `MambaSplitConv1dScanCombinedFn` saves in_proj's whole output zxBCdt
    (2d + 2GN + H) and the pre-gate scan output `out_x` (d), recomputing the conv; the RMSNorm keeps its
    input (d). out_proj keeps its own input (d), counted with the GEMM inputs."""
    return in_proj_width(spec) + inner_width(spec), inner_width(spec)
