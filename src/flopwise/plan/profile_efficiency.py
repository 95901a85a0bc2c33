"""The efficiency of a step's GEMMs on a measured device profile (`plan(spec, profile=...)`).

A stand-in until the operator-level time model times each operator itself: it lists the
GEMMs one device runs per layer (and the logits GEMM), forward and backward, with their
per-rank shapes, looks each one's achieved FLOP/s up in the profile, and returns

    efficiency = (Σ FLOPs / Σ FLOPs ÷ rate(M, N, K)) / peak

i.e. the FLOP-weighted harmonic mean rate over the step's GEMMs as a fraction of the peak
the planner divides by. Everything that is not a GEMM (norms, activations, the optimizer,
framework overhead) is outside it, as it is outside the planner's FLOP count.

Shapes (T = micro-batch × sequence tokens, h hidden, tp tensor-parallel ways, d head dim):
QKV (T, (heads + 2·kv)·d / tp, h), attention output (T, h, heads·d / tp), MLP up (and
gate) (T, ffn / tp, h), MLP down (T, h, ffn / tp), attention scores and values per head
(s, s, d) and (s, d, s), logits (T, vocab / tp, h). A forward (M, N, K) has two backward
GEMMs: the input gradient (M, K, N) and the weight gradient (K, N, M).
"""

from __future__ import annotations

from flopwise.plan.calibration import Efficiency
from flopwise.plan.spec import RunSpec


def step_gemms(spec: RunSpec) -> list[tuple[int, int, int, float]]:
    """(M, N, K, FLOPs) of each GEMM one device runs for one micro-batch (forward and backward)."""
    model, lay, work = spec.model, spec.layout, spec.workload
    s, tp = work.seq_len, lay.tp
    tokens = lay.micro_batch_size * s
    h = model.hidden
    heads = model.n_heads
    kv = model.n_kv_heads or heads
    d = model.head_dim or h // max(1, heads)
    ffn = model.ffn_hidden or 4 * h
    layer = [
        ((tokens, (heads + 2 * kv) * d // tp, h), 1),
        ((tokens, h, heads * d // tp), 1),
        ((tokens, ffn // tp, h), 2 if model.mlp == "swiglu" else 1),
        ((tokens, h, ffn // tp), 1),
        ((s, s, d), lay.micro_batch_size * heads // tp),  # scores Q·Kᵀ per head
        ((s, d, s), lay.micro_batch_size * heads // tp),  # scores·V per head
    ]
    layers = model.n_layers / lay.pp
    forward = [(shape, count * layers) for shape, count in layer]
    if model.vocab_size:
        forward.append(((tokens, model.vocab_size // tp, h), 1.0 / lay.pp))
    gemms = []
    for (m, n, k), count in forward:
        if min(m, n, k) < 1:
            continue
        for shape in ((m, n, k), (m, k, n), (k, n, m)):  # forward, input gradient, weight gradient
            gemms.append((*shape, 2.0 * m * n * k * count))
    return gemms


def profile_efficiency(spec: RunSpec, profile, peak_flops: float) -> Efficiency | None:
    """The step's GEMM efficiency from a measured profile, or None (a CNN, or the dtype was not measured)."""
    if spec.model.arch == "cnn" or not peak_flops:
        return None
    dtype = spec.workload.precision
    flops = seconds = 0.0
    for m, n, k, work in step_gemms(spec):
        rate = profile.gemm_flops_per_s(m, n, k, dtype)
        if not rate:
            return None
        flops += work
        seconds += work / rate
    if not seconds:
        return None
    value = min(1.0, flops / seconds / peak_flops)
    device = getattr(profile, "device", "a measured profile")
    return Efficiency(value, f"GEMM rates of the step's shapes in the profile of {device}", "measured")
