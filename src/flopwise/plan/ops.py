"""The operators one transformer layer runs per rank and micro-batch, with their real shapes.

For T = seq × micro-batch tokens, hidden h, a heads of size d (g KV heads), FFN width f and
tensor parallelism t, one layer's forward on one rank runs (Shoeybi et al. 2019 split):

    QKV        GEMM  M=T  N=(a+2g)·d/t  K=h
    attn out   GEMM  M=T  N=h           K=a·d/t
    MLP up     GEMM  M=T  N=f/t (×2 for SwiGLU's gate and up, fused)  K=h
    MLP down   GEMM  M=T  N=h           K=f/t
    attention  flash: one fused kernel, causal (half the s×s work; a sliding window's band on its
               layers); else two batched GEMMs (Q·Kᵀ, A·V) plus softmax / mask / dropout over the
               a/t·s² scores (memory-bound)
    memory-bound: 2 norms, 2 residual adds, activation, RoPE, dropouts (bytes / bandwidth);
               norms, residuals and dropouts act on T·h/t with sequence parallelism, T·h without

Multi-head latent attention (DeepSeek-V2/V3) replaces QKV by its projections, split as
Megatron-Core's `MLASelfAttention` splits them (`multi_latent_attention.py`, as understood:
the down projections are plain, replicated linears): q_a (M=T, N=r_q, K=h) and kv_a (M=T,
N=r_kv+r, K=h) whole on every rank, on the rank's T/t tokens with sequence parallelism and on
all T without (each rank repeats them); q_b (N=a·d_qk/t, K=r_q) and kv_b (N=a·(n+d_v)/t,
K=r_kv) column-parallel; o (N=h, K=a·d_v/t) row-parallel; the attention core with
d_qk = n + r for Q·Kᵀ and d_v for A·V. Its latents' RMSNorms, RoPE on the r-wide parts only
and the two concatenations that assemble Q and K are memory-bound.

Backward runs two GEMMs per forward GEMM (data gradient M×K×N, weight gradient K×N×M),
the attention backward (2.5× the forward's matmul work for flash: it recomputes Q·Kᵀ), and
about twice the forward's memory traffic for the element-wise operators. Recompute adds
exactly what it re-runs: the whole layer's forward (full), or the attention core
(selective, Korthikanti et al. 2022 §4.2).

Embedding (a gather; its backward writes a dense fp32 V·h/t gradient), the output
GEMM (T × V/t × h) and the cross-entropy over T·V/t logits (its traffic as the stack's loss
implementation moves it, `CROSS_ENTROPY_BYTES_PER_LOGIT`) are timed apart: they
sit on the first and last pipeline stages. The optimizer step is memory-bound over the
parameters a rank owns.

On a CPU with a measured profile (`flopwise calibrate`), the operators that are not GEMMs
are timed as that profile measured them rather than as bytes over bandwidth: eager PyTorch
on a CPU runs each norm, activation, rotary embedding and residual add as several unfused
kernels whose cost per element the profile holds (forward + backward, and the forward's
measured share of it, which a recomputed forward pays again), the cross-entropy per logit, the fused attention at its measured FLOP/s for the
sequence and head size, and the optimizer step per parameter.

Everything is closed-form per layer and cached by shape, so a layout search can call it
thousands of times.
"""

from __future__ import annotations

from dataclasses import dataclass

from flopwise.catalog.models import ModelSpec, is_mla, kv_heads, query_key_head_dim, value_head_dim, windowed_layers
from flopwise.plan import mamba, recompute_modules
from flopwise.plan.gemm import DeviceRates
from flopwise.plan.memory import mlp_width_per_token, recomputed_block_share
from flopwise.plan.window import kept_share

CROSS_ENTROPY_BYTES_PER_LOGIT = {
    # flash_attn/losses/cross_entropy.py (Triton): the forward reads the 16-bit logits once (online
    # softmax, the log-sum-exp kept); the backward reads them again and writes the gradient in place
    "single-pass": (6.0, 2),
    # torch.compile of F.cross_entropy(logits.float()): inductor's reductions read the 16-bit logits
    # for the max and again for the sum of exponentials; the backward reads them once more and writes
    # the 16-bit gradient (the upcast never materialises)
    "compiled": (8.0, 3),
    # megatron/core/fusions/fused_cross_entropy.py (jit-fused): upcast + max (2 + 4), subtract + exp +
    # sum (4 + 4), divide into the saved softmax (4 + 4); backward scale and cast (4 + 2)
    "megatron-fused": (28.0, 4),
    # megatron/core/tensor_parallel/cross_entropy.py, unfused: .float() (2 + 4), max (4), in-place
    # subtract (4 + 4), exp (4 + 4), sum (4), divide (4 + 4); backward mul_ (4 + 4), cast back (4 + 2)
    "megatron": (52.0, 8),
    # F.cross_entropy(logits.float()) in eager PyTorch: cast (2 + 4); log_softmax's kernel reads the
    # row for the max, again for the sum, and once more to write (3 x 4 + 4); nll_loss backward zeroes
    # a dense gradient (4); log_softmax backward reads the gradient for its sum, then it and the output
    # to write (4 + 4 + 4 + 4); the cast's backward (4 + 2)
    "eager": (48.0, 7),
}
"""(bytes moved per logit, kernels) of the loss over 16-bit logits, forward + backward, by how a stack
runs it (`Stack.cross_entropy`), counted from each implementation's code; the output GEMM's own read
and write of the logits are the GEMM's."""
EMBEDDING_GRAD_BYTES = 4.0
"""The embedding's gradient is a dense fp32 buffer, zeroed and scatter-added every micro-batch."""
ADAM_BYTES_PER_PARAM = 24.0
"""AdamW reads and writes the fp32 master, m and v (6 × 4 bytes) for every parameter it owns."""


@dataclass(frozen=True)
class LayerTimes:
    """Seconds for one transformer layer and one micro-batch on one rank (compute only)."""

    forward: float
    backward: float
    recompute: float
    gemm: float  # forward + backward + recompute GEMM seconds
    attention: float  # the attention core, forward + backward + recompute
    memory_bound: float  # element-wise kernels, forward + backward + recompute
    wgrad: float  # weight-gradient GEMMs of the backward (what a backward collective can hide behind)
    forward_gemm: float  # forward GEMMs (what an overlapped forward collective can hide behind)
    # an MoE's shared expert, (forward, data-gradient, weight-gradient) GEMM seconds of its up (fc1) and
    # down (fc2) projections, included above: what Megatron-Core's moe_shared_expert_overlap runs beside
    # the token dispatch and combine (plan/expert_comm.py)
    shared_up: tuple[float, float, float] = (0.0, 0.0, 0.0)
    shared_down: tuple[float, float, float] = (0.0, 0.0, 0.0)

    @property
    def total(self) -> float:
        """Forward + backward + recompute."""
        return self.forward + self.backward + self.recompute


HYBRID_AVERAGED = ("forward", "backward", "recompute", "gemm", "attention", "memory_bound", "wgrad", "forward_gemm")
"""The LayerTimes fields a hybrid stack's average layer weighs by its mix (`_hybrid_layer_times`)."""


@dataclass(frozen=True)
class EndTimes:
    """Seconds per micro-batch for the embedding (first stage) and the head + loss (last stage)."""

    embedding: float
    head: float


_LAYER_CACHE: dict[tuple, tuple[ModelSpec, LayerTimes]] = {}
_END_CACHE: dict[tuple, tuple[ModelSpec, EndTimes]] = {}
CACHE_LIMIT = 100_000  # entries; a cache this full is dropped and refilled


def measured_cpu(rates: DeviceRates, what: str):
    """A CPU profile's operator measurement `what` (a table or method), or None: on GPUs,
    without a profile, or under a flat efficiency the op model keeps its bytes-and-bandwidth form."""
    if rates.curve.family != "cpu" or rates.profile is None or rates.efficiency is not None:
        return None
    return getattr(rates.profile, what, None) or None


def _gemm_fwd_bwd(rates: DeviceRates, m: int, n: int, k: int, e: float, count: float = 1.0) -> tuple[float, float, float]:
    """(forward, data-gradient, weight-gradient) seconds of one GEMM family."""
    fwd = rates.gemm_seconds(m, n, k, count, e)
    dgrad = rates.gemm_seconds(m, k, n, count, e)
    wgrad = rates.gemm_seconds(k, n, m, count, e)
    return fwd, dgrad, wgrad


def layer_times(
    model: ModelSpec, seq_len: int, micro_batch: int, tp: int, sequence_parallel: bool, flash: bool,
    dropout: bool, recompute: str, precision: str, rates: DeviceRates, kv_len: int | None = None,
    ep: int = 1, etp: int = 0, early_stop: bool = False,
) -> LayerTimes:
    """Compute seconds of one layer per micro-batch on one rank (cached by every argument).

    `seq_len` is the rank's tokens of a sequence; `kv_len` the keys each query attends over when
    that differs (context parallelism: a cp-th of the queries against the whole sequence); `ep`
    the expert-parallel size (a rank runs E/ep experts on the tokens the ep ranks route to them:
    the same FLOPs in ep times fewer, larger GEMMs); `etp` the experts' own tensor-parallel width
    (0: tp; below tp a rank runs whole experts on the tokens of tp / etp sequence-parallel ranks);
    `early_stop`: a full recompute stops once it has rebuilt every tensor the block's backward needs
    (PyTorch's non-reentrant checkpoint, `Stack.recompute_early_stop`), so a dense block's last GEMM,
    the down projection, and the residual add after it are not run again."""
    return _cached(_LAYER_CACHE, _layer_times, model,
                   seq_len, micro_batch, tp, sequence_parallel, flash, dropout, recompute, precision, rates,
                   kv_len, ep, etp or tp, early_stop)


def _cached(cache: dict, compute, model: ModelSpec, *args):
    """`compute(model, *args)`, memoised in `cache`.

    Keyed by the model's identity (hashing a ModelSpec is slow); the entry keeps the model
    alive, so its id cannot be reused while the entry exists.
    """
    key = (id(model), *args)
    hit = cache.get(key)
    if hit is not None and hit[0] is model:
        return hit[1]
    if len(cache) > CACHE_LIMIT:
        cache.clear()
    value = compute(model, *args)
    cache[key] = (model, value)
    return value


def attention_gemms(model, T: int, tp: int, sp: bool) -> list[tuple[int, int, int, float]]:
    """(M, N, K, count) of one layer's attention projections on one rank (module docstring):
    fused QKV and the output projection, or multi-head latent attention's five."""
    h, a = model.hidden, model.n_heads
    dv = value_head_dim(model)
    out = (T, h, a * dv // tp, 1.0)
    if not is_mla(model):
        return [(T, (a + 2 * kv_heads(model)) * query_key_head_dim(model) // tp, h, 1.0), out]
    down_tokens = T // tp if sp else T  # replicated weights: a sequence shard each under SP, else all tokens
    qk = query_key_head_dim(model)
    shapes = [(down_tokens, model.kv_lora_rank + model.qk_rope_head_dim, h, 1.0),
              (T, a * (model.qk_nope_head_dim + dv) // tp, model.kv_lora_rank, 1.0), out]
    if model.q_lora_rank:
        shapes += [(down_tokens, model.q_lora_rank, h, 1.0), (T, a * qk // tp, model.q_lora_rank, 1.0)]
    else:
        shapes.append((T, a * qk // tp, h, 1.0))
    return shapes


def _layer_times(model, s, b, tp, sp, flash, dropout, recompute, precision, rates: DeviceRates,
                 kv_len: int | None = None, ep: int = 1, etp: int = 0, early_stop: bool = False) -> LayerTimes:
    mix = mamba.layer_mix(model)
    if mix is not None:
        return _hybrid_layer_times(model, mix, s, b, tp, sp, flash, dropout, recompute, precision, rates, kv_len)
    e = 4.0 if precision in ("fp32", "tf32") else 2.0
    kv = kv_len or s  # keys per query row
    ge = 1.0 if precision == "fp8" else e  # bytes of a GEMM operand
    h, a = model.hidden, model.n_heads
    d, dv = query_key_head_dim(model), value_head_dim(model)  # query/key and value head widths
    f = model.ffn_hidden
    T = s * b
    up_width = (2 if model.mlp == "swiglu" else 1) * f
    experts, topk = max(1, model.n_experts), max(1, model.experts_per_token)

    # ---- GEMMs
    fwd_g = dgrad_g = wgrad_g = 0.0
    shared_up = shared_down = (0.0, 0.0, 0.0)
    shapes = attention_gemms(model, T, tp, sp)
    n_attention = len(shapes)  # the MLP's (router, experts, shared expert) follow
    if experts > 1:
        etp = etp or tp  # folded experts (etp < tp) see the tokens of tp / etp sequence-parallel ranks, whole
        per_expert = max(1, T * etp // tp * topk * ep // experts)  # tokens one local expert sees from the ep ranks
        local = float(experts // ep)
        shapes += [(T, experts, h, 1.0)]  # the router's gating GEMM
        shapes += [(per_expert, up_width // etp, h, local), (per_expert, h, f // etp, local)]
        if model.shared_expert_ffn_hidden:
            sf = model.shared_expert_ffn_hidden
            up, down = (T, (2 if model.mlp == "swiglu" else 1) * sf // tp, h, 1.0), (T, h, sf // tp, 1.0)
            shapes += [up, down]
            shared_up, shared_down = (_gemm_fwd_bwd(rates, m, max(1, n), max(1, k), ge, count)
                                      for m, n, k, count in (up, down))
    else:
        shapes += [(T, up_width // tp, h, 1.0), (T, h, f // tp, 1.0)]
    mlp_fwd_g = 0.0
    for i, (m, n, k, count) in enumerate(shapes):
        fw, dg, wg = _gemm_fwd_bwd(rates, m, max(1, n), max(1, k), ge, count)
        fwd_g += fw
        dgrad_g += dg
        wgrad_g += wg
        mlp_fwd_g += fw if i >= n_attention else 0.0

    # ---- attention core
    attn_f, attn_b = _attention_core(model, s, b, kv, tp, flash, dropout, precision, rates, e)

    # ---- memory-bound element-wise operators (bytes per token)
    hs = h / tp if sp else float(h)
    per_token = model.norms_per_layer * 2 * hs * e  # norms: read + write
    per_token += 2 * 3 * hs * e  # two residual adds: read 2, write 1
    act = mlp_width_per_token(model) / tp  # the activation's width: k experts (+ a shared one) under MoE
    per_token += (3 if model.mlp == "swiglu" else 2) * act * e
    kernels = model.norms_per_layer + 3
    rope = rotary_width(model, tp)
    if model.position == "rope":
        per_token += 2 * rope * e
        kernels += 2
    if getattr(model, "qk_norm", False):  # qwen3: an RMSNorm over each head's q and k, read + write
        per_token += 2 * (a + kv_heads(model)) * d / tp * e
        kernels += 2
    if is_mla(model):
        mla_bytes, mla_kernels = mla_elementwise_bytes(model, tp, sp, e)
        per_token += mla_bytes
        kernels += mla_kernels
    if dropout:
        per_token += 2 * (2 * hs * e + hs)
        kernels += 2
    if precision == "fp8":  # casts of each GEMM input to fp8 (read 16-bit, write 8-bit)
        latents = model.q_lora_rank + model.kv_lora_rank  # MLA's q_b and kv_b inputs
        per_token += (2 * h + latents + a * dv / tp + f / tp) * (2.0 + 1.0)
        kernels += 4 + (1 if model.q_lora_rank else 0) + (1 if latents else 0)
    if experts > 1:
        dispatch, dispatch_kernels = moe_dispatch_bytes(h, topk, e, sorts=ep > 1 and experts // ep > 1)
        per_token += dispatch
        kernels += dispatch_kernels
    mem_f = rates.memory_seconds(T * per_token, kernels)
    mem_b = rates.memory_seconds(2.0 * T * per_token, 1.5 * kernels)
    measured = _measured_elementwise(model, rates, T, hs, act, rope)
    if measured is not None:
        both, forward_part = measured
        unmeasured = per_token - _elementwise_bytes(model, hs, act, rope, e)
        mem_f = forward_part + rates.memory_seconds(T * unmeasured, 0)
        mem_b = both - forward_part + rates.memory_seconds(2.0 * T * unmeasured, 0)

    forward = fwd_g + attn_f + mem_f
    backward = dgrad_g + wgrad_g + attn_b + mem_b
    share = full_recompute_share(recompute)
    if share:
        rerun_g, rerun_m = fwd_g, mem_f
        if early_stop and experts == 1:  # the down projection and the residual add after it are not re-run
            rerun_g -= _gemm_fwd_bwd(rates, T, h, max(1, f // tp), ge)[0]
            if measured is None:  # a measured profile's element-wise forward stays whole (its share is measured)
                rerun_m -= rates.memory_seconds(T * 3 * hs * e, 1)
        extra_g, extra_a, extra_m = share * rerun_g, share * attn_f, share * max(0.0, rerun_m)
        extra = extra_g + extra_a + extra_m
    elif recompute == "selective":
        extra, extra_g, extra_a, extra_m = attn_f, 0.0, attn_f, 0.0
    elif recompute == "op":  # torchtitan's per-op policy re-runs every second matmul (plan/memory.py)
        extra, extra_g, extra_a, extra_m = 0.5 * fwd_g, 0.5 * fwd_g, 0.0, 0.0
    elif (modules := recompute_modules.parse(recompute)) is not None:
        extra_g, extra_a, extra_m = _module_rerun(model, modules, rates, T, tp, sp, ge, e,
                                                  mlp_fwd_g, shared_up[0] + shared_down[0], attn_f, hs, act)
        extra = extra_g + extra_a + extra_m
    else:
        extra = extra_g = extra_a = extra_m = 0.0
    return LayerTimes(
        forward=forward, backward=backward, recompute=extra,
        gemm=fwd_g + dgrad_g + wgrad_g + extra_g, attention=attn_f + attn_b + extra_a,
        memory_bound=mem_f + mem_b + extra_m, wgrad=wgrad_g, forward_gemm=fwd_g,
        shared_up=shared_up, shared_down=shared_down,
    )


def _module_rerun(model, modules: frozenset[str], rates: DeviceRates, T: int, tp: int, sp: bool, ge: float,
                  e: float, mlp_fwd: float, shared_fwd: float, attn_f: float, hs: float,
                  act: float) -> tuple[float, float, float]:
    """(GEMM, attention, memory-bound) seconds that Megatron-Core's per-module recompute runs again
    for one layer and micro-batch (`plan/recompute_modules.py`): the attention core (core_attn),
    the MLP's forward GEMMs and activation on the blocks whose MLP is recomputed (mlp, moe), the shared
    expert's (shared_experts), MLA's two up projections (mla_up_proj), and the element-wise
    activation (moe_act) and pre-norms (layernorm)."""
    dense = recompute_modules.dense_share(model)
    whole = recompute_modules.mlp_rerun_share(modules, dense)
    moe_left = recompute_modules.moe_kept_share(modules, dense)
    gemm = whole * mlp_fwd + (moe_left * shared_fwd if "shared_experts" in modules else 0.0)
    if "mla_up_proj" in modules:
        dv, qk = value_head_dim(model), query_key_head_dim(model)
        a = model.n_heads
        gemm += _gemm_fwd_bwd(rates, T, max(1, a * (model.qk_nope_head_dim + dv) // tp), model.kv_lora_rank, ge)[0]
        if model.q_lora_rank:
            gemm += _gemm_fwd_bwd(rates, T, max(1, a * qk // tp), model.q_lora_rank, ge)[0]
    act_bytes = (3 if model.mlp == "swiglu" else 2) * act * e  # read the input(s), write the output
    share_act = whole + (moe_left if "moe_act" in modules else 0.0)
    elementwise = share_act * act_bytes + (model.norms_per_layer * 2 * hs * e if "layernorm" in modules else 0.0)
    kernels = (1 if share_act else 0) + (model.norms_per_layer if "layernorm" in modules else 0)
    memory = rates.memory_seconds(T * elementwise, kernels) if kernels else 0.0
    return gemm, (attn_f if "core_attn" in modules else 0.0), memory


def _hybrid_layer_times(model, mix: mamba.LayerMix, s: int, b: int, tp: int, sp: bool, flash: bool, dropout: bool,
                        recompute: str, precision: str, rates: DeviceRates, kv_len: int | None = None) -> LayerTimes:
    """The average layer of a hybrid Mamba-2 stack (plan/mamba.py): each kind of layer timed on its own,
    weighted by how many the pattern holds. Every layer runs its pre-norm, its residual add, its dropout
    and (fp8) the cast of its first GEMM's input, as `_layer_times` counts them per block; then

      attention ("*"): the QKV and output projections, the attention core, RoPE, the out-projection's cast
      MLP ("-"):       the up and down projections, the activation, the down projection's cast
      Mamba ("M"):     in_proj (M=T, N=(2d+2GN+H)/t, K=h) and out_proj (M=T, N=h, K=d/t), as Megatron-Core
                       splits them (column- and row-parallel); the SSD scan (`_ssd_scan`); conv1d, gated
                       norm and copies (`mamba.elementwise_bytes_forward`); out_proj's input cast

    An attention layer and an MLP layer together take a uniform block's time. Megatron's selective
    recompute re-runs the attention core only; full recompute re-runs every layer's forward, scan included."""
    e = 4.0 if precision in ("fp32", "tf32") else 2.0
    ge = 1.0 if precision == "fp8" else e
    fp8 = precision == "fp8"
    h, T, kv = model.hidden, s * b, kv_len or s
    hs = h / tp if sp else float(h)
    common, common_kernels = 2 * hs * e + 3 * hs * e, 2  # the pre-norm (read + write), the residual add
    if dropout:
        common, common_kernels = common + 2 * hs * e + hs, common_kernels + 1
    if fp8:  # the cast of the first GEMM's input (read 16-bit, write 8-bit)
        common, common_kernels = common + h * 3.0, common_kernels + 1
    kinds = []
    if mix.attention:
        per_token, kernels = common, common_kernels
        if model.position == "rope":
            per_token, kernels = per_token + 2 * rotary_width(model, tp) * e, kernels + 2
        if fp8:
            per_token, kernels = per_token + model.n_heads * value_head_dim(model) / tp * 3.0, kernels + 1
        core = _attention_core(model, s, b, kv, tp, flash, dropout, precision, rates, e)
        kinds.append((mix.attention, _kind_times(rates, attention_gemms(model, T, tp, sp), core, T * per_token,
                                                 kernels, recompute, ge, selective=True)))
    if mix.mlp:
        f = model.ffn_hidden
        swiglu = model.mlp == "swiglu"
        per_token, kernels = common + (3 if swiglu else 2) * f / tp * e, common_kernels + 1
        if fp8:
            per_token, kernels = per_token + f / tp * 3.0, kernels + 1
        shapes = [(T, (2 if swiglu else 1) * f // tp, h, 1.0), (T, h, f // tp, 1.0)]
        kinds.append((mix.mlp, _kind_times(rates, shapes, (0.0, 0.0), T * per_token, kernels, recompute, ge)))
    if mix.mamba:
        inner = mamba.inner_width(model)
        mixer_bytes, mixer_kernels = mamba.elementwise_bytes_forward(model, tp, e, b)
        per_token, kernels = common + mixer_bytes, common_kernels + mixer_kernels
        if fp8:
            per_token, kernels = per_token + inner / tp * 3.0, kernels + 1
        shapes = [(T, mamba.in_proj_width(model) // tp, h, 1.0), (T, h, inner // tp, 1.0)]
        kinds.append((mix.mamba, _kind_times(rates, shapes, _ssd_scan(model, s, b, tp, rates, e), T * per_token,
                                             kernels, recompute, ge)))
    n = float(mix.layers)
    # the seconds fields, averaged over the mix; a hybrid layer has no shared expert (its defaults)
    return LayerTimes(**{name: sum(count * getattr(times, name) for count, times in kinds) / n
                         for name in HYBRID_AVERAGED})


def _kind_times(rates: DeviceRates, shapes, core: tuple[float, float], nbytes: float, kernels: float,
                recompute: str, ge: float, selective: bool = False) -> LayerTimes:
    """One kind of hybrid layer: its GEMMs (forward, data and weight gradients), its sequence-mixing core
    (forward, backward), its memory-bound `nbytes` (backward twice the forward's traffic, as
    `_layer_times`) and what `recompute` re-runs; `selective`: the core is attention's, which
    Megatron's selective recompute re-runs."""
    fwd_g = dgrad_g = wgrad_g = 0.0
    for m, n, k, count in shapes:
        fw, dg, wg = _gemm_fwd_bwd(rates, m, max(1, n), max(1, k), ge, count)
        fwd_g, dgrad_g, wgrad_g = fwd_g + fw, dgrad_g + dg, wgrad_g + wg
    core_f, core_b = core
    mem_f = rates.memory_seconds(nbytes, kernels)
    mem_b = rates.memory_seconds(2.0 * nbytes, 1.5 * kernels)
    forward = fwd_g + core_f + mem_f
    share = full_recompute_share(recompute)
    if share:
        extra, extra_g, extra_c, extra_m = share * forward, share * fwd_g, share * core_f, share * mem_f
    elif recompute == "selective" and selective:
        extra, extra_g, extra_c, extra_m = core_f, 0.0, core_f, 0.0
    elif recompute == "op":
        extra, extra_g, extra_c, extra_m = 0.5 * fwd_g, 0.5 * fwd_g, 0.0, 0.0
    else:
        extra = extra_g = extra_c = extra_m = 0.0
    return LayerTimes(
        forward=forward, backward=dgrad_g + wgrad_g + core_b + mem_b, recompute=extra,
        gemm=fwd_g + dgrad_g + wgrad_g + extra_g, attention=core_f + core_b + extra_c,
        memory_bound=mem_f + mem_b + extra_m, wgrad=wgrad_g, forward_gemm=fwd_g,
    )


def _ssd_scan(model, s: int, b: int, tp: int, rates: DeviceRates, e: float) -> tuple[float, float]:
    """(forward, backward) seconds of one Mamba layer's SSD scan on one rank, a roofline over its kernels:
    the chunk matmuls (`mamba.ssd_products`) timed as the 16-bit GEMMs they are, batched over chunks and
    heads (stacked along M), so the shape curve charges their short K (N or Q, 128-256) and small tiles
    (P = 64 columns) — the reduced efficiency of a scan made of small matmuls (Dao & Gu 2024, §6: SSD's
    work is matmuls on Q-token chunks); against the bytes its five kernels move
    (`mamba.ssd_bytes_forward`), whichever takes longer. The scan runs in 16 bits under fp8 (Transformer
    Engine casts only the linear layers). Backward: `mamba.SSD_BACKWARD_FACTOR` times the forward."""
    sixteen = rates.sixteen_bit()
    products = sum(sixteen.gemm_seconds(m * count, n, k, 1.0, e)
                   for m, n, k, count in mamba.ssd_products(model, s, b, tp))
    per_token, kernels = mamba.ssd_bytes_forward(model, tp, e)
    forward = max(products, rates.memory_seconds(s * b * per_token, kernels))
    return forward, mamba.SSD_BACKWARD_FACTOR * forward


def _attention_core(model, s: int, b: int, kv: int, tp: int, flash: bool, dropout: bool, precision: str,
                    rates: DeviceRates, e: float) -> tuple[float, float]:
    """(forward, backward) seconds of one layer's attention core on one rank (module docstring): a fused
    flash kernel over the causal half, or Q·Kᵀ and A·V as batched GEMMs plus the s×s element-wise work.

    Sliding-window layers (plan/window.py): a flash kernel skips the key blocks outside the band
    (FlashAttention-2's and cuDNN's `window_size`), so its work on those layers is the share of the causal
    pairs the window keeps, at the rate of a causal sequence with as many keys per query (s × share, ≈ 2w:
    a 128-key band spans two 128-key tiles, and the kernel's per-row loop is that short); the result is the
    mean over full and windowed layers. An unfused attention computes and masks the whole s×s matrix
    (transformers' eager attention adds the window to the mask), so its time does not change."""
    full_f, full_b = _core_seconds(model, s, b, kv, tp, flash, dropout, precision, rates, e)
    windowed = windowed_layers(model)
    share = kept_share(model.sliding_window, kv) if windowed and flash else 1.0
    if share == 1.0:
        return full_f, full_b
    win_f, win_b = _core_seconds(model, s, b, kv, tp, flash, dropout, precision, rates, e, share)
    q = windowed / mamba.attention_layers(model)
    return (1.0 - q) * full_f + q * win_f, (1.0 - q) * full_b + q * win_b


def _core_seconds(model, s: int, b: int, kv: int, tp: int, flash: bool, dropout: bool, precision: str,
                  rates: DeviceRates, e: float, share: float = 1.0) -> tuple[float, float]:
    """(forward, backward) seconds of one attention core doing `share` of a causal layer's work
    (`_attention_core`; a share below 1 only for a flash kernel)."""
    d, dv = query_key_head_dim(model), value_head_dim(model)
    heads = model.n_heads // tp
    causal = 0.5 if model.arch == "decoder" else 1.0
    length = s if share == 1.0 else max(1, round(s * share))  # a causal sequence with as many keys per query
    attention_rate = measured_cpu(rates, "attention_flops_per_s")
    rate = attention_rate(length, d, "fp32" if precision == "tf32" else precision) if attention_rate else None
    full = 2.0 * b * heads * s * kv * (d + dv) * share  # Q·Kᵀ over d_qk, A·V over d_v, the whole s×s
    if flash and rate:
        work = full * causal
        attn_f, attn_b = work / rate, 2.5 * work / rate
    elif flash and rates.efficiency is not None:
        # a flat efficiency applies to the FLOPs as the planner counts them (full s×s, backward 2×)
        attn_f = rates.attention_seconds(full, length, backward=False)
        attn_b = rates.attention_seconds(2.0 * full, length, backward=True)
    elif flash:
        work = full * causal
        attn_f = rates.attention_seconds(work, length, backward=False)
        attn_b = rates.attention_seconds(2.5 * work, length, backward=True)
    else:
        count = float(b * heads)
        qk = _gemm_fwd_bwd(rates, s, kv, d, e, count)
        av = _gemm_fwd_bwd(rates, s, dv, kv, e, count)
        scores = b * heads * s * kv
        drop = (2 * e + 1) if dropout else 0.0
        attn_f = qk[0] + av[0] + rates.memory_seconds(scores * (3 * e + drop), 2 + (1 if dropout else 0))
        attn_b = qk[1] + qk[2] + av[1] + av[2] + rates.memory_seconds(scores * (3 * e + drop), 2 + (1 if dropout else 0))
    return attn_f, attn_b


def _measured_elementwise(model, rates: DeviceRates, T: int, hs: float, act: float,
                          rope: float) -> tuple[float, float] | None:
    """(forward + backward, forward) seconds of one layer's norms, residual adds, activation and
    rotary embedding from a CPU profile's per-element timings, or None when it has none of
    them. The forward is each operator's measured share, or a third where none was measured."""
    table = measured_cpu(rates, "op_seconds_per_element")
    act_key = "swiglu" if model.mlp == "swiglu" else "gelu"
    needed = ("norm", "add", act_key) + (("rope",) if model.position == "rope" else ())
    if not table or any(key not in table for key in needed):
        return None
    share = measured_cpu(rates, "op_forward_share") or {}
    elements = {"norm": model.norms_per_layer * hs, "add": 2 * hs, act_key: act}
    if model.position == "rope":
        elements["rope"] = rope
    both = {key: T * count * table[key] for key, count in elements.items()}
    return sum(both.values()), sum(seconds * share.get(key, 1.0 / 3.0) for key, seconds in both.items())


def rotary_width(model, tp: int) -> float:
    """Elements per token a rank applies RoPE to: every query and key head (a + g)·d/t, or under
    MLA only the rope parts: a·r/t of the query and the r-wide key part all heads share."""
    if is_mla(model):
        return (model.n_heads / tp + 1) * model.qk_rope_head_dim
    return (model.n_heads + kv_heads(model)) * query_key_head_dim(model) / tp


def mla_elementwise_bytes(model, tp: int, sp: bool, e: float) -> tuple[float, int]:
    """(bytes per token, kernels) of MLA's own element-wise work in the forward: the RMSNorms
    over the query and KV latents (read + write; on a sequence shard under SP, like the block's
    norms), and the concatenations of each head's nope and rope parts into Q and K (read + write
    a·d_qk/t each), as transformers' `DeepseekV3Attention` and Megatron-Core's MLA run them."""
    latents = (model.q_lora_rank + model.kv_lora_rank) / (tp if sp else 1)
    concat = model.n_heads * query_key_head_dim(model) / tp
    kernels = (2 if model.q_lora_rank else 1) + 2
    return 2 * latents * e + 2 * 2 * concat * e, kernels


def moe_dispatch_bytes(h: int, topk: int, e: float, sorts: bool) -> tuple[float, int]:
    """(bytes per token, kernels) of one MoE layer's token shuffles in the forward, as
    Megatron-Core's all-to-all dispatcher runs them (`moe/token_dispatcher.py`, `moe/moe_utils.py`):
    `permute` gathers each token's k copies into expert order (read k·h, write k·h), `unpermute`
    reads them back weighted by the router's probabilities and sums them into one (read k·h,
    write h); with expert parallelism and several local experts, `sort_chunks_by_idxs` reorders
    the received tokens by expert and back (read and write k·h, twice). Tokens are whole (h
    wide): with tensor parallelism the dispatcher gathers the sequence-parallel shards first.
    The backward runs the same shuffles in reverse (the op model's 2x of the forward)."""
    per_token = (2 * topk + topk + 1) * h * e
    kernels = 2
    if sorts:
        per_token += 2 * (2 * topk * h * e)
        kernels += 2
    return per_token, kernels


def _elementwise_bytes(model, hs: float, act: float, rope: float, e: float) -> float:
    """Bytes per token of the operators `_measured_elementwise` times (the rest stays bytes / bandwidth)."""
    per_token = model.norms_per_layer * 2 * hs * e + 2 * 3 * hs * e + (3 if model.mlp == "swiglu" else 2) * act * e
    if model.position == "rope":
        per_token += 2 * rope * e
    return per_token


def tp_collectives_rerun(recompute: str, model, forward: int) -> float:
    """Forward tensor-parallel collectives a recompute runs again per layer: all `forward` of a
    recomputed block; under per-module recompute the MLP's one on the blocks whose MLP is re-run."""
    modules = recompute_modules.parse(recompute)
    if modules is None or model is None:
        return forward * full_recompute_share(recompute)
    return recompute_modules.mlp_rerun_share(modules, recompute_modules.dense_share(model))


def expert_passes_rerun(recompute: str) -> float:
    """Share of an MoE layer's forward dispatch and combine that a recompute runs again: a recomputed
    block's, or Megatron-Core's `moe` module recompute's (the whole MoE layer, its all-to-alls too)."""
    modules = recompute_modules.parse(recompute)
    if modules is None:
        return full_recompute_share(recompute)
    return 1.0 if "moe" in modules else 0.0


def full_recompute_share(recompute: str) -> float:
    """Share of layers whose whole forward is re-run: 1 for "full", 1/k for "every:k" (one
    block in k checkpointed), F for "blocks:F", 0 otherwise."""
    if recompute == "full":
        return 1.0
    if recompute.startswith("every"):  # every:k, and the trainer's spelling every-k
        digits = "".join(ch for ch in recompute if ch.isdigit())
        return 1.0 / int(digits) if digits and int(digits) > 0 else 1.0
    share = recomputed_block_share(recompute)
    return share if share is not None else 0.0


def end_times(model: ModelSpec, seq_len: int, micro_batch: int, tp: int, sequence_parallel: bool,
              precision: str, rates: DeviceRates, cross_entropy: str = "eager") -> EndTimes:
    """Embedding and head + loss seconds per micro-batch (forward + backward), cached; the loss
    as `cross_entropy` (a key of `CROSS_ENTROPY_BYTES_PER_LOGIT`) runs it."""
    return _cached(_END_CACHE, _end_times, model, seq_len, micro_batch, tp, sequence_parallel, precision, rates,
                   cross_entropy)


def _end_times(model, s, b, tp, sp, precision, rates: DeviceRates, cross_entropy: str = "eager") -> EndTimes:
    e = 4.0 if precision in ("fp32", "tf32") else 2.0
    h, v, T = model.hidden, model.vocab_size, s * b
    hs = h / tp if sp else float(h)
    embedding = rates.memory_seconds(T * hs * e * 2, 1) + rates.memory_seconds(
        T * hs * e + 2 * v * h / tp * EMBEDDING_GRAD_BYTES, 2)
    vt = max(1, v // tp)
    fw, dg, wg = _gemm_fwd_bwd(rates.sixteen_bit(), T, vt, h, e)  # the head stays in 16 bits under fp8
    per_logit, kernels = CROSS_ENTROPY_BYTES_PER_LOGIT[cross_entropy]
    loss = rates.memory_seconds(T * vt * per_logit, kernels)
    final_norm = rates.memory_seconds(T * hs * e * 6, 2)
    table = measured_cpu(rates, "op_seconds_per_element") or {}
    if "cross_entropy" in table:
        loss = T * vt * table["cross_entropy"]
    if "norm" in table:
        final_norm = T * hs * table["norm"]
    return EndTimes(embedding=embedding, head=fw + dg + wg + loss + final_norm)


FOREACH_ADAMW_BYTES_PER_PARAM = 80.0
"""PyTorch's default (foreach, unfused) AdamW: eight passes over fp32 tensors (weight decay,
lerp of m, scale and addcmul of v, sqrt, divide, add eps, addcdiv of the weight) read and
write 80 bytes per parameter (torch.optim.adamw._multi_tensor_adamw)."""


def optimizer_seconds(params_owned: float, grad_bytes: float, weight_bytes: float, optimizer: str,
                      rates: DeviceRates, fused: bool = True, fsdp_sharded: bool = False) -> float:
    """The optimizer step over the parameters this rank updates: memory-bound.

    Fused AdamW (Megatron/apex, DeepSpeed): fp32 master, m, v read and written once (24 B);
    PyTorch's foreach AdamW (FSDP runs) makes eight passes (80 B). Plus the gradient read (and
    read again for the clipping norm, and written when zeroed), and the 16-bit weight written.
    A CPU profile's measured step (foreach AdamW with clipping, per parameter; over FSDP2's
    DTensor shards when `fsdp_sharded` and the profile measured it) replaces this."""
    table = measured_cpu(rates, "optimizer_seconds_per_param") or {}
    measured = (fsdp_sharded and table.get(optimizer + "_fsdp")) or table.get(optimizer)
    if measured:
        return params_owned * measured
    if optimizer == "adamw":
        state = ADAM_BYTES_PER_PARAM if fused else FOREACH_ADAMW_BYTES_PER_PARAM
    else:
        state = {"adam8bit": 8.0 + 4.0, "sgd": 16.0}.get(optimizer, ADAM_BYTES_PER_PARAM)
    per_param = state + 3.0 * grad_bytes + (weight_bytes if weight_bytes < 4 else 0.0)
    return rates.memory_seconds(params_owned * per_param, 4 if fused else 12)
