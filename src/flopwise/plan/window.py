"""Sliding-window attention: how much of a causal layer's score work a window keeps.

A causal layer's query at position i (1-based) attends to the i keys before it and itself; a layer
with a window of w keys (`ModelSpec.sliding_window`: transformers' `sliding_window`, Megatron-Core's
`window_size` (w - 1, 0)) attends to min(w, i) of them (Beltagy et al. 2020, "Longformer", §3.1;
Jiang et al. 2023, "Mistral 7B", §2; OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card", §2:
a 128-token band on every other layer). Over a sequence of s tokens that is

    full causal:  s(s + 1) / 2 query-key pairs
    windowed:     s·w - w(w - 1) / 2 pairs for w < s, the full causal count for w >= s

Megatron-Bridge's MFU formula counts the same average context per token for a windowed layer,
w - w(w - 1) / (2s) (`training/utils/flop_utils.py`, `calculate_swa_context`).

flopwise counts a full layer's scores over the whole s×s matrix without causal halving (plan/flops.py,
PaLM's 12·L·s·d), and times a flash kernel on the causal half (plan/ops.py). A windowed layer keeps
both conventions by scaling them by the share of the causal pairs its window keeps (`kept_share`):
the FLOP count becomes 12·s·d·share per layer and token (≈ 24·w·d for w << s: the band's w keys,
doubled as a full layer's s/2 causal keys are doubled to s), the flash kernel's work the same share
of its causal half. So the windowed-to-full ratio is Megatron-Bridge's, a window no shorter than
the sequence changes nothing, and the count is continuous in w.
"""

from __future__ import annotations

from flopwise.catalog.models import ModelSpec, windowed_layers
from flopwise.plan.mamba import attention_layers


def kept_share(window: int, seq_len: int) -> float:
    """Share of a causal s×s score matrix's query-key pairs that a window of `window` keys (the query's
    own included) keeps: (s·w - w(w-1)/2) / (s(s+1)/2) for w < s, else 1."""
    s, w = float(seq_len), float(window)
    if window <= 0 or window >= seq_len:
        return 1.0
    return (s * w - w * (w - 1) / 2) / (s * (s + 1) / 2)


def attention_work_share(spec: ModelSpec, seq_len: int) -> float:
    """The model's attention-score work over what every attention layer attending to the whole causal
    prefix would do: the mean over its attention layers of 1 (full) and `kept_share` (windowed)."""
    windowed = windowed_layers(spec)
    layers = attention_layers(spec)
    if not windowed or not layers:
        return 1.0
    return 1.0 - windowed / layers * (1.0 - kept_share(spec.sliding_window, seq_len))
