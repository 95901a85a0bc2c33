"""Memory per device: model states (weights, gradients, optimizer, master weights),
activations, logits and communication buffers; plus validation helpers that reproduce
the ZeRO paper's and DeepSpeed's published model-state formulas.

Sources:
- Mixed-precision Adam model states 2 + 2 + 12 = 16 bytes/param and the ZeRO stage
  formulas: Rajbhandari et al. 2020, "ZeRO", §3 and Figure 1 (K = 12).
- Activations per transformer layer: Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models", §4 and Table 2, generalised here by
  activation dtype, dropout, MLP type/width, GQA and flash attention (see
  `activation_terms`); with 16-bit activations, dropout, a GELU 4h MLP, MHA and no
  flash attention every row of Table 2 is reproduced exactly.
- Pipeline in-flight micro-batches: Narayanan et al. 2021 (1F1B, interleaved) and
  Korthikanti et al. 2022 §4.2.3 (first stage holds p micro-batches of L/p layers;
  interleaving multiplies by 1 + (p−1)/(p·v)); GPipe (Huang et al. 2019) keeps all m.
- DDP buckets: torch DistributedDataParallel `bucket_cap_mb=25`; FSDP all-gathers one
  unit ahead (`forward_prefetch` / implicit backward prefetch), so two gathered units.
- Framework conventions (`framework_state_bytes`, `comm_buffer_bytes`,
  `loss_logits_bytes_per_element`, `fp8_buffer_bytes`): Megatron-LM README "Distributed
  optimizer" (6 + 12/d), deepspeed 0.19.8 `estimate_zero2/3_model_states_mem_needs`,
  Megatron `_VocabParallelCrossEntropy`, torchtitan's loss, Transformer Engine fp8 caching.
- Recompute policies by what they keep: Megatron selective (Korthikanti §5), torchtitan's
  per-op policy (every second matmul) and every-K-th-block option, full (block inputs).
- Allocator reserve: PyTorch "CUDA semantics — memory management"; the 10 % is a stated
  assumption (docs/planner.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from flopwise.catalog.models import ModelSpec, is_mla, kv_heads, query_key_head_dim, value_head_dim
from flopwise.plan import mamba, recompute_modules
from flopwise.plan.params import ParamCount
from flopwise.plan.step_comm import zero3_collectives

GIB = 2**30
DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP default bucket_cap_mb = 25 (MiB)
OPTIMIZER_BYTES_PER_PARAM = {"adamw": 8.0, "sgd": 4.0, "adam8bit": 2.0}
"""fp32 Adam m + v; SGD fp32 momentum; 8-bit Adam (Dettmers et al. 2022): two 1-byte states."""


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter of each model state for a precision (before any sharding).

    16-bit training keeps 16-bit weights and gradients plus an fp32 master copy
    (Micikevicius et al. 2018; ZeRO's 2 + 2 + 12 with Adam). fp8 training keeps
    bf16 weights and fp32 masters, the fp8 copies being transient (Transformer Engine).
    `grad_partition` is an fp32 gradient copy sharded like the optimizer (DeepSpeed's
    ZeRO keeps one per optimizer partition); `grad` is the gradient buffer itself.
    """

    weight: float
    grad: float
    master: float
    optimizer: float
    grad_partition: float = 0.0


BF16_TRUE_TRADE_OFF = ("bf16-true keeps no fp32 master copy: an update smaller than half a bf16 step of "
                       "the weight (2^-8 of its magnitude) rounds away, so small learning rates late in "
                       "training stall (torchtune / litgpt fine-tuning default; Zamirai et al. 2020)")
"""The trade-off of pure bf16 training, stated wherever it is planned."""

COMPUTE_DTYPE = {"bf16-true": "bf16"}
"""The dtype matmuls run in, for precisions whose name says more than that (peaks, profiles)."""


AMP_STATE_BYTES_NOTE = ("fp32 parameters under autocast (AMP): weights 4 + gradients 4 + optimizer bytes/param, "
                        "no separate master, and a 16-bit copy of every weight saved for the backward")


def amp_state_bytes(optimizer: str) -> StateBytes:
    """AMP as torch.autocast runs it (Micikevicius et al. 2018 with the master copy as the model
    itself): fp32 weights and gradients, the optimizer's states, no second fp32 copy."""
    return StateBytes(4.0, 4.0, 0.0, OPTIMIZER_BYTES_PER_PARAM[optimizer])


def autocast_copy_bytes(stage_params: float, block_params: float, blocks: int, embedding_params: float,
                        recompute: str) -> float:
    """The 16-bit weight copies AMP keeps for the backward on one stage: autocast casts each
    matmul's fp32 weight and the matmul saves the cast (torch's weight-cast cache, and flash-attn's
    FusedDense, keep it until the backward), so every weight but the embedding table, which is
    gathered not multiplied, has a 2-byte copy alive from its forward to its backward. A recomputed
    block saves only its input: its copies exist again for the one block being rebuilt.
    `stage_params`, `block_params` and `embedding_params` are on one tensor-parallel rank."""
    share = recompute_forward_fraction(recompute)
    in_blocks = min(block_params * blocks, stage_params)
    elsewhere = max(0.0, stage_params - in_blocks - embedding_params)  # the output head
    return 2.0 * (in_blocks * (1.0 - share) + (block_params if share > 0 else 0.0) + elsewhere)


def compute_dtype(precision: str) -> str:
    """The matmul dtype of a precision: `bf16-true` computes in bf16."""
    return COMPUTE_DTYPE.get(precision, precision)


def state_bytes(precision: str, optimizer: str) -> StateBytes:
    """Bytes per parameter for weights, gradients, fp32 master copy and optimizer states.

    `bf16-true` (pure bf16): bf16 weights and gradients, no master copy and the optimizer's
    states in bf16 (AdamW 2 + 2): 2 + 2 + 4 = 8 bytes/param, half of mixed precision's 16."""
    opt = OPTIMIZER_BYTES_PER_PARAM[optimizer]
    if precision == "bf16-true":
        return StateBytes(2.0, 2.0, 0.0, opt if optimizer == "adam8bit" else opt / 2.0)
    if precision in ("fp32", "tf32"):
        return StateBytes(4.0, 4.0, 0.0, opt)
    return StateBytes(2.0, 2.0, 4.0, opt)


FRAMEWORKS = ("fsdp", "megatron", "deepspeed")
"""Whose memory conventions are planned; `fsdp` is what `flopwise train` runs."""


def framework_state_bytes(precision: str, optimizer: str, framework: str, zero_stage: int) -> StateBytes:
    """Bytes per parameter of each model state under one framework's conventions.

    - fsdp (and the ZeRO paper): 16-bit weights and gradients, fp32 master, optimizer:
      2 + 2 + 4 + 8 = 16 with Adam (Rajbhandari et al. 2020 §3, K = 12).
    - megatron: bf16 weights, an fp32 gradient buffer (`main_grad`, accumulated in fp32),
      fp32 master and Adam: 2 + 4 + 12 = 18, or 6 + 12/d with the distributed optimizer
      (ZeRO-1) — Megatron-LM README, "Distributed optimizer".
    - deepspeed: 16-bit weights and gradients plus an fp32 gradient partition, fp32 master
      and Adam sharded by ZeRO; at stage 3 the 16-bit gradients exist only for the gathered
      layer. ZeRO-2: 2 + 18/d, ZeRO-3: 18/d — deepspeed 0.19.8
      `estimate_zero2/3_model_states_mem_needs`.
    fp32/tf32 training: 4 + 4 + 0 + optimizer, except that DeepSpeed's ZeRO optimizers (stage
    ≥ 1) keep their own fp32 copy of the partition even then (`single_partition_of_fp32_groups`,
    `fp32_partitioned_groups_flat`): 4 + 4 + 4 + optimizer, measured on its CPU runs.
    """
    base = state_bytes(precision, optimizer)
    if precision == "bf16-true":
        return base  # one dtype throughout: no fp32 gradient buffer or partition copy
    if precision in ("fp32", "tf32") and framework == "deepspeed" and zero_stage >= 1:
        return StateBytes(base.weight, base.grad, 4.0, base.optimizer)
    if precision in ("fp32", "tf32") or framework == "fsdp":
        return base
    if framework == "megatron":
        return StateBytes(base.weight, 4.0, base.master, base.optimizer)
    if framework == "deepspeed":
        return StateBytes(base.weight, 0.0 if zero_stage >= 3 else base.grad, base.master, base.optimizer, 4.0)
    raise ValueError(f"unknown framework {framework!r}")


def zero3_gathers_per_step(framework: str, pp: int, micro_batches: int) -> int:
    """All-gathers of a ZeRO-3 rank's weights per optimizer step, by framework convention:
    the count `step_comm.zero3_collectives` gives the time and traffic models (FSDP2 2·m,
    once per step inside a pipeline stage; DeepSpeed 2·m); Megatron's distributed optimizer
    (ZeRO-1) all-gathers the updated weights once per step.
    """
    if framework == "megatron":
        return 1
    gathers = zero3_collectives(framework, pp, micro_batches, 0.0)
    return gathers.forward_gathers + gathers.backward_gathers


def activation_dtype_bytes(precision: str) -> float:
    """Bytes per saved activation element: 4 for fp32/tf32, else 2 (fp8 GEMMs save bf16 inputs)."""
    return 4.0 if precision in ("fp32", "tf32") else 2.0


# --------------------------------------------------------------------------- activations


@dataclass(frozen=True)
class ActivationTerms:
    """Per-layer saved-activation bytes split by whether tensor parallelism shards them.

    `replicated` is held whole by every TP rank (norm inputs, block inputs, dropout masks
    of the residual path); `sharded` is split over t ranks (Q, K, V, MLP intermediates);
    `scores` is the s×s attention part (sharded over heads), dropped by selective
    recompute and by flash attention. `flash_stats` is flash attention's fp32 log-sum-exp.
    `routed_copies` is an MoE's tokens as the experts see them, whole on every TP rank even
    with sequence parallelism (the dispatcher gathers the shards first).
    What Megatron-Core's per-module recompute (`plan/recompute_modules.py`) drops, each part of the
    above: `mlp_saved` the MLP's saved tensors but its input (sharded), `shared_saved` the shared
    expert's share of them, `act_output` the down projection's input (of the routed experts under
    MoE), `qkv` Q, K and V (sharded), `norm_outputs` the two GEMM inputs the pre-norms write
    (replicated).
    """

    replicated: float
    sharded: float
    scores: float
    flash_stats: float
    layer_input: float
    matmul_outputs: float = 0.0
    attention_output: float = 0.0
    routed_copies: float = 0.0
    mlp_saved: float = 0.0
    shared_saved: float = 0.0
    act_output: float = 0.0
    qkv: float = 0.0
    norm_outputs: float = 0.0
    dense_share: float = 1.0  # share of blocks with a dense MLP (an MoE's leading dense blocks)


def activation_terms(
    spec: ModelSpec,
    seq_len: int,
    micro_batch: int,
    dtype_bytes: float = 2.0,
    dropout: bool = True,
    flash_attention: bool = False,
    rmsnorm_saves_normalized: bool = True,
    kv_repeated: bool = False,
    attn_output_copy: bool = False,
    gemm_input_bytes: float | None = None,
    fused_swiglu: bool = False,
    act_input_bytes: float | None = None,
    norm_input_bytes: float | None = None,
) -> ActivationTerms:
    """Korthikanti et al. 2022 §4.1 per-layer breakdown, generalised.

    `gemm_input_bytes`: bytes of the four saved GEMM inputs (QKV, out-projection, MLP up
    and down) when they differ from e — 1 under Transformer Engine's fp8, which saves the
    fp8 copy it cast for the forward GEMM (`module/linear.py`, `layernorm_linear.py`).
    `fused_swiglu`: a fused SwiGLU saves only its input, the up/gate output (2·e·sbf), and the
    down projection its own input: 3·e·sbf instead of 4 (Megatron-Core
    `fusions/fused_bias_swiglu.py`, `BiasSwiGLUFunction`). `act_input_bytes`: that input's
    bytes when stored apart (1 with `--activation-func-fp8-input-store`, which casts it to fp8).
    `norm_input_bytes`: bytes of each norm's saved input when the residual stream is kept in another
    dtype (4: flash-attention's GPT with `residual_in_fp32`).

    With e = dtype bytes, s·b tokens, h hidden, d = heads·head_dim, k = kv_heads·head_dim,
    f the MLP width, a heads:
      attention: e·sbh (QKV input) + e·sb(d+2k) (Q, K, V) + e·sbd (out-proj input)
                 [+ sbh dropout mask] + scores: e·as²b (softmax out)
                 [+ as²b mask + e·as²b dropout out]
      MLP gelu:  e·sbh (input) + 2·e·sbf (GELU input, fc2 input) [+ sbh mask]
      MLP swiglu: e·sbh + 4·e·sbf (gate out, SiLU out, up out, product)
      MoE:       f is the width a token passes through, k experts of f plus any shared
                 expert (DeepSeek-V3: 8 x 2048 + 2048); and each token's k routed copies twice,
                 2·e·sb·k·h: the experts' grouped GEMM keeps its input and the unpermute
                 keeps their outputs to weight them by the router's probabilities
                 (Megatron-Core `moe/experts.py`, `moe/moe_utils.py` `unpermute`)
      qk norms:  (qwen3) e·sb(d+k), and the normalised copy as for the norms below
      MLA:       (DeepSeek-V2/V3) Q and K are a·d_qk wide, V and the out-proj input a·d_v
                 (K and V expanded to every head: training saves no less than MHA would);
                 the latents r_q and r_kv are kept as their RMSNorms' inputs (+ normalised)
                 and as the q_b / kv_b inputs: (per-norm·e + g)·sb(r_q + r_kv), plus e·sbr
                 (the KV norm's input is a view of kv_a's whole output, its rope part too),
                 replicated, since Megatron-Core's down projections are not split over TP
      norms:     e·sbh each (input), `norms_per_layer` of them; an eager `torch.nn.RMSNorm`
                 also saves the normalised tensor (2·e·sbh; measured, torch 2.13), which
                 `rmsnorm_saves_normalized=False` drops for fused kernels
      flash:     no s×s terms; fp32 log-sum-exp 4·a·s·b (as torch's SDPA flash kernels save)
      sliding window (gpt-oss, Mistral 7B; plan/window.py): no term changes. Flash keeps Q, K, V, its
                 output and the log-sum-exp whatever the mask; an unfused attention builds the whole
                 s×s scores and masks them (transformers' eager attention adds the window to the
                 causal mask), so it keeps e·as²b as a full layer does. Only a band-storing kernel
                 would keep a·s·w·b, and none of the planned stacks runs one
    `kv_repeated`: K and V are saved at full width d (implementations that
    `repeat_interleave` GQA heads before attention) instead of k. `attn_output_copy`: with
    flash attention the kernel keeps its output and the out-projection keeps its input;
    they are one tensor when the kernel writes [b, s, a, d] (CUDA flash kernels) and two
    when the reshape copies (torch's CPU flash kernel, measured): + e·sbd.
    With e = 2, dropout, f = 4h, d = k = h and LayerNorm this is 34·sbh + 5·as²b
    (Table 2). O(s·b) terms (norm statistics) are ignored, as in the paper.
    A hybrid Mamba-2 stack's terms are its average layer's (`hybrid_activation_terms`).
    """
    if mamba.layer_mix(spec) is not None:
        return hybrid_activation_terms(spec, seq_len, micro_batch, dtype_bytes, dropout, flash_attention,
                                       rmsnorm_saves_normalized, kv_repeated, attn_output_copy, gemm_input_bytes,
                                       fused_swiglu, act_input_bytes)
    e = dtype_bytes
    sb = float(seq_len) * micro_batch
    h = spec.hidden
    d = spec.n_heads * query_key_head_dim(spec)  # Q (and, under MLA, K)
    k = d if kv_repeated or is_mla(spec) else kv_heads(spec) * query_key_head_dim(spec)
    v = spec.n_heads * value_head_dim(spec) if is_mla(spec) else k  # V
    out = spec.n_heads * value_head_dim(spec)  # the attention output, the out-proj's input
    f = mlp_width_per_token(spec)
    mask = 1.0 if dropout else 0.0
    g = e if gemm_input_bytes is None else gemm_input_bytes

    replicated = g * sb * h  # QKV input
    replicated += mask * sb * h  # attention output dropout mask
    replicated += g * sb * h  # MLP input
    replicated += mask * sb * h  # MLP output dropout mask
    per_norm = 2.0 if (spec.norm == "rmsnorm" and rmsnorm_saves_normalized) else 1.0
    norm_in = e if norm_input_bytes is None else norm_input_bytes
    replicated += spec.norms_per_layer * (norm_in + (per_norm - 1.0) * e) * sb * h  # norm inputs (+ normalised)
    latents = spec.q_lora_rank + spec.kv_lora_rank  # MLA: norm inputs (+ normalised), q_b / kv_b inputs
    replicated += (per_norm * e + g) * sb * latents
    replicated += e * sb * spec.qk_rope_head_dim  # the KV norm's input is a view of kv_a's output, rope part too

    sharded = e * sb * (d + k + v) + g * sb * out  # Q, K, V + out-proj input
    if getattr(spec, "qk_norm", False):  # qwen3's per-head norms on q and k keep their inputs (+ normalised)
        sharded += per_norm * e * sb * (d + k)
    if spec.mlp == "swiglu" and fused_swiglu:
        mlp_saved = 2.0 * (e if act_input_bytes is None else act_input_bytes) * sb * f + g * sb * f
    else:
        mlp_saved = (3.0 if spec.mlp == "swiglu" else 1.0) * e * sb * f + g * sb * f  # ... + down-proj input
    sharded += mlp_saved

    a = spec.n_heads
    if flash_attention:
        scores = 0.0
        flash_stats = 4.0 * a * seq_len * micro_batch  # fp32 log-sum-exp per row
        if attn_output_copy:
            sharded += e * sb * out
    else:
        scores = (e + (1.0 + e) * mask) * a * seq_len * sb
        flash_stats = 0.0
    mlp_out = (2.0 if spec.mlp == "swiglu" else 1.0) * f
    matmul_outputs = e * sb * (attention_matmul_outputs(spec, d, k) + h + mlp_out + h)  # + MLP up(/gate), down
    routed = 2.0 * e * sb * spec.experts_per_token * h if spec.n_experts > 1 else 0.0
    shared = spec.shared_expert_ffn_hidden if spec.n_experts > 1 else 0
    return ActivationTerms(replicated, sharded, scores, flash_stats, e * sb * h, matmul_outputs, e * sb * out, routed,
                           mlp_saved=mlp_saved, shared_saved=mlp_saved * shared / f, act_output=g * sb * (f - shared),
                           qkv=e * sb * (d + k + v), norm_outputs=2.0 * g * sb * h,
                           dense_share=recompute_modules.dense_share(spec))


def hybrid_activation_terms(
    spec: ModelSpec, seq_len: int, micro_batch: int, dtype_bytes: float = 2.0, dropout: bool = True,
    flash_attention: bool = False, rmsnorm_saves_normalized: bool = True, kv_repeated: bool = False,
    attn_output_copy: bool = False, gemm_input_bytes: float | None = None, fused_swiglu: bool = False,
    act_input_bytes: float | None = None,
) -> ActivationTerms:
    """The average layer of a hybrid Mamba-2 stack (plan/mamba.py): each kind's terms, weighted by how
    many layers of it the pattern holds. Every layer keeps its pre-norm's input (and normalised copy,
    as `activation_terms` counts norms), its first linear's input and, with dropout, its residual's
    mask, replicated over TP; then, sharded:

      attention ("*"): Q, K, V, the out-projection's input and flash's statistics, as in `activation_terms`
      MLP ("-"):       the activation's input and the down projection's input, as in `activation_terms`
      Mamba ("M"):     what `MambaSplitConv1dScanCombinedFn` saves, in_proj's output zxBCdt (2d + 2GN + H)
                       and the pre-gate scan output (d), the conv recomputed in backward; the grouped
                       RMSNorm's input (d); out_proj's input (d, at the GEMM input's bytes)

    An attention layer plus an MLP layer keep exactly one `activation_terms` block."""
    mix = mamba.layer_mix(spec)
    e = dtype_bytes
    g = e if gemm_input_bytes is None else gemm_input_bytes
    sb = float(seq_len) * micro_batch
    h = spec.hidden
    per_norm = 2.0 if (spec.norm == "rmsnorm" and rmsnorm_saves_normalized) else 1.0
    mask = 1.0 if dropout else 0.0
    replicated = per_norm * e * sb * h + g * sb * h + mask * sb * h  # the same for every kind

    d = spec.n_heads * query_key_head_dim(spec)
    k = d if kv_repeated else kv_heads(spec) * query_key_head_dim(spec)
    out = spec.n_heads * value_head_dim(spec)
    attention_sharded = e * sb * (d + 2 * k) + g * sb * out
    if flash_attention:
        scores, flash_stats = 0.0, 4.0 * spec.n_heads * seq_len * micro_batch
        attention_sharded += e * sb * out if attn_output_copy else 0.0
    else:
        scores, flash_stats = (e + (1.0 + e) * mask) * spec.n_heads * seq_len * sb, 0.0
    attention_outputs = e * sb * (attention_matmul_outputs(spec, d, k) + h)

    f = mlp_width_per_token(spec)
    if spec.mlp == "swiglu" and fused_swiglu:
        mlp_sharded = 2.0 * (e if act_input_bytes is None else act_input_bytes) * sb * f + g * sb * f
    else:
        mlp_sharded = (3.0 if spec.mlp == "swiglu" else 1.0) * e * sb * f + g * sb * f
    mlp_outputs = e * sb * ((2.0 if spec.mlp == "swiglu" else 1.0) * f + h)

    scan_saved, norm_saved = mamba.saved_widths(spec)
    inner = mamba.inner_width(spec)
    mamba_sharded = e * sb * (scan_saved + norm_saved) + g * sb * inner
    mamba_outputs = e * sb * (mamba.in_proj_width(spec) + h)

    n = float(mix.layers)
    return ActivationTerms(
        replicated=replicated,
        sharded=(mix.attention * attention_sharded + mix.mlp * mlp_sharded + mix.mamba * mamba_sharded) / n,
        scores=mix.attention * scores / n,
        flash_stats=mix.attention * flash_stats / n,
        layer_input=e * sb * h,
        matmul_outputs=(mix.attention * attention_outputs + mix.mlp * mlp_outputs + mix.mamba * mamba_outputs) / n,
        attention_output=mix.attention * e * sb * out / n,
    )


def mlp_width_per_token(spec: ModelSpec) -> int:
    """The MLP width one token passes through: f, or under MoE its k experts' k·f plus any
    shared expert (`ops._layer_times` times the activation over the same width)."""
    f = spec.ffn_hidden or 4 * spec.hidden
    if spec.n_experts <= 1:
        return f
    return spec.experts_per_token * f + spec.shared_expert_ffn_hidden


def attention_matmul_outputs(spec: ModelSpec, q_width: float, kv_width: float) -> float:
    """Elements per token the attention's projections write: fused QKV and out-proj, or MLA's
    q_a, q_b (or q), kv_a, kv_b and out-proj."""
    h = spec.hidden
    if not is_mla(spec):
        return q_width + 2 * kv_width + h
    kv_b = spec.n_heads * (spec.qk_nope_head_dim + spec.v_head_dim)
    return spec.q_lora_rank + q_width + spec.kv_lora_rank + spec.qk_rope_head_dim + kv_b + h


RECOMPUTE_POLICIES = ("none", "selective", "op", "full")
"""Recompute policies by what they keep; `every:K` (full recompute of every K-th block) and
`blocks:F` (full recompute of a share F of the blocks) too."""


def every_k(recompute: str) -> int | None:
    """K of an `every:K` policy (full recompute of one block in K), else None."""
    if recompute.startswith("every:"):
        k = recompute.split(":", 1)[1]
        return int(k) if k.isdigit() and int(k) >= 1 else None
    return None


@lru_cache(maxsize=256)
def recomputed_block_share(recompute: str) -> float | None:
    """Share of the blocks whose whole forward is re-run by a partial policy: 1/K for `every:K`,
    F for `blocks:F` (0 < F <= 1; Megatron-Core `--recompute-method block --recompute-num-layers N`
    is F = N / layers per stage, and a source that states only its HFU and MFU recomputed
    F = 3·(HFU/MFU − 1) of its forward matmul work, since a block's forward is a third of its
    training FLOPs: flops.py); None for any other policy."""
    k = every_k(recompute)
    if k is not None:
        return 1.0 / k
    if recompute.startswith("blocks:"):
        try:
            share = float(recompute.split(":", 1)[1])
        except ValueError:
            return None
        return share if 0.0 < share <= 1.0 else None
    return None


def is_recompute_policy(recompute: str) -> bool:
    """Whether `recompute` names a policy the planner models."""
    return (recompute in RECOMPUTE_POLICIES or recomputed_block_share(recompute) is not None
            or recompute_modules.parse(recompute) is not None)


def recompute_forward_fraction(recompute: str) -> float:
    """Share of the layers' forward matmul work run again in backward, by policy.

    full: all of it; every:K: 1/K of the blocks; blocks:F: F of them; op (torchtitan's per-op policy, which
    recomputes every second matmul): half; selective (Megatron) and none: no matmul
    (selective re-runs only the attention core, counted separately).
    """
    if recompute == "full":
        return 1.0
    share = recomputed_block_share(recompute)
    if share is not None:
        return share
    return 0.5 if recompute == "op" else 0.0


def activation_bytes_per_layer(
    terms: ActivationTerms, tp: int = 1, sequence_parallel: bool = False, recompute: str = "none"
) -> float:
    """Bytes one layer keeps for backward on one TP rank, by what each policy keeps.

    - none:      replicated + (sharded + scores)/t, or everything /t with SP (Korthikanti Table 2);
                 an MoE's routed copies whole on every rank
    - selective: Megatron's: everything but the attention core (the s×s scores), which
                 flash attention never stores, so with flash it keeps as much as none
    - op:        torchtitan's per-op policy: the block input, every second matmul output
                 (half of them; of an MoE's routed copies, half the experts' outputs), the
                 attention output and its log-sum-exp
    - full:      only the layer input (2·sbh in 16-bit; /t with SP)
    - every:K:   full on one block in K, none on the others (the average layer); blocks:F
                 likewise with a share F of the blocks
    - modules:…: Megatron-Core's per-module recompute: each recomputed module's own saved
                 tensors dropped (`plan/recompute_modules.py`)
    """
    layer_input = terms.layer_input / tp if sequence_parallel else terms.layer_input
    if recompute == "full":
        return layer_input
    share = recomputed_block_share(recompute)
    if share is not None:
        kept = activation_bytes_per_layer(terms, tp, sequence_parallel, "none")
        return layer_input * share + kept * (1.0 - share)
    if recompute == "op":  # the experts' outputs are matmul outputs, every second one kept
        scores = terms.flash_stats if terms.flash_stats else terms.scores
        return layer_input + 0.25 * terms.routed_copies + (
            0.5 * terms.matmul_outputs + terms.attention_output + scores) / tp
    modules = recompute_modules.parse(recompute)
    if modules is not None:
        return _kept_with_modules(terms, tp, sequence_parallel, modules)
    scores = 0.0 if recompute == "selective" else terms.scores
    replicated = terms.replicated / tp if sequence_parallel else terms.replicated
    return replicated + terms.routed_copies + (terms.sharded + scores + terms.flash_stats) / tp


def _kept_with_modules(terms: ActivationTerms, tp: int, sequence_parallel: bool, modules: frozenset[str]) -> float:
    """A layer's kept bytes under Megatron-Core's per-module recompute: what selective (with core_attn)
    or no recompute keeps, less each recomputed module's own saved tensors, weighed by the share of
    blocks the module is in (`terms.dense_share`: a dense model's MLP is in every block)."""
    kept = activation_bytes_per_layer(terms, tp, sequence_parallel, "selective" if "core_attn" in modules else "none")
    whole_mlp = recompute_modules.mlp_rerun_share(modules, terms.dense_share)
    moe_left = recompute_modules.moe_kept_share(modules, terms.dense_share)
    sharded = terms.mlp_saved * whole_mlp
    if "moe_act" in modules:
        sharded += terms.act_output * moe_left
    if "shared_experts" in modules:
        sharded += terms.shared_saved * moe_left
    if "mla_up_proj" in modules:
        sharded += terms.qkv
    replicated = terms.norm_outputs if "layernorm" in modules else 0.0
    replicated = replicated / tp if sequence_parallel else replicated
    return kept - sharded / tp - replicated - terms.routed_copies * whole_mlp


def layer_activation_bytes(
    spec: ModelSpec,
    seq_len: int,
    micro_batch: int,
    precision: str = "bf16",
    dropout: bool = False,
    flash_attention: bool = True,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    rmsnorm_saves_normalized: bool = True,
    kv_repeated: bool = False,
    attn_output_copy: bool = False,
    compiled: bool = False,
) -> float:
    """One transformer layer's saved-for-backward bytes for one micro-batch on one TP rank.

    The figure to compare with a measured block (e.g. bytes of unique storages seen by
    `torch.autograd.graph.saved_tensors_hooks`, parameters excluded). `compiled`: the block under
    `torch.compile`, whose partitioner saves what fused norm and SwiGLU kernels save.
    """
    terms = activation_terms(spec, seq_len, micro_batch, activation_dtype_bytes(precision), dropout,
                             flash_attention, rmsnorm_saves_normalized and not compiled, kv_repeated,
                             attn_output_copy, fused_swiglu=compiled)
    return activation_bytes_per_layer(terms, tp, sequence_parallel, recompute)


def inflight_layer_factor(n_layers: int, pp: int, micro_batches: int, schedule: str, virtual: int) -> float:
    """Layer-activations held by the first pipeline stage, in units of one layer's activations.

    pp = 1: one micro-batch of L layers (accumulation runs micro-batches one after another).
    1F1B: min(p, m) micro-batches of L/p layers (≈ L). GPipe: all m micro-batches of L/p.
    Interleaved: L·(1 + (p−1)/(p·v)) (Korthikanti et al. 2022 §4.2.3).
    """
    if pp == 1:
        return float(n_layers)
    per_stage = n_layers / pp
    if schedule == "gpipe":
        return per_stage * micro_batches
    inflight = min(pp, micro_batches)
    if schedule == "interleaved":
        return per_stage * inflight * (1.0 + (pp - 1) / (pp * virtual))
    return per_stage * inflight


def loss_logits_bytes_per_element(framework: str, dtype_bytes: float) -> float:
    """Bytes per logit the loss materialises at its peak, by framework.

    - megatron: the 16-bit matmul output, then `_VocabParallelCrossEntropy` works in fp32
      and keeps the fp32 softmax for backward: 2 + 4 = 6 (vocab-parallel over t).
    - fsdp (torchtitan, `F.cross_entropy(logits.float())`) and deepspeed (Hugging Face
      models upcast logits before the loss): the 16-bit output, its fp32 copy and the fp32
      log-softmax autograd keeps: 2 + 4 + 4 = 10.
    With fp32 activations the copy is the output itself: 4 (+ 4 log-softmax, not Megatron).
    """
    copy = dtype_bytes if dtype_bytes < 4 else 0.0
    return 4.0 + copy + (0.0 if framework == "megatron" else 4.0)


def logits_bytes(seq_len: int, micro_batch: int, vocab: int, dtype_bytes: float, tp: int) -> float:
    """The s·b·V logits: an fp32 copy for the cross-entropy (4 bytes), plus the 16-bit matmul
    output when activations are 16-bit; vocab-parallel over t ranks (Megatron)."""
    per_element = 4.0 + (dtype_bytes if dtype_bytes < 4 else 0.0)
    return per_element * seq_len * micro_batch * vocab / tp


# --------------------------------------------------------------------------- model states


@dataclass(frozen=True)
class ModelStates:
    """Per-device bytes of model states, on the device and offloaded to CPU."""

    weights: float
    gradients: float
    optimizer_states: float
    master_weights: float
    cpu_bytes: float


def model_states(
    params_per_device: float, sb: StateBytes, zero_stage: int, dp: int, offload: str
) -> ModelStates:
    """Weights/gradients/optimizer/master bytes per device under ZeRO-0..3 (Rajbhandari et al. 2020 §5).

    Stage 1 shards optimizer states and fp32 masters over dp, stage 2 also gradients,
    stage 3 (= FSDP FULL_SHARD) also weights. Offload "optimizer" moves optimizer states,
    masters and the fp32 gradient copy to CPU (ZeRO-Offload, Ren et al. 2021; DeepSpeed's
    estimator keeps only 16-bit weights on the GPU); "params" (ZeRO-3) moves everything.
    """
    psi = params_per_device
    weights = psi * sb.weight / (dp if zero_stage >= 3 else 1)
    gradients = psi * sb.grad / (dp if zero_stage >= 2 else 1)
    gradients += psi * sb.grad_partition / (dp if zero_stage >= 1 else 1)
    optimizer = psi * sb.optimizer / (dp if zero_stage >= 1 else 1)
    master = psi * sb.master / (dp if zero_stage >= 1 else 1)
    cpu = 0.0
    if offload in ("optimizer", "params"):
        cpu = optimizer + master + gradients
        optimizer = master = gradients = 0.0
    if offload == "params":
        cpu += weights
        weights = 0.0
    return ModelStates(weights, gradients, optimizer, master, cpu)


def zero_model_state_bytes(psi: float, n_d: int, stage: str, k: float = 12.0) -> float:
    """ZeRO paper per-device model states (Figure 1): baseline (2+2+K)Ψ, P_os 4Ψ + KΨ/N_d,
    P_os+g 2Ψ + (2+K)Ψ/N_d, P_os+g+p (2+2+K)Ψ/N_d. `stage` in baseline|os|os+g|os+g+p."""
    formulas = {
        "baseline": (4 + k) * psi,
        "os": 4 * psi + k * psi / n_d,
        "os+g": 2 * psi + (2 + k) * psi / n_d,
        "os+g+p": (4 + k) * psi / n_d,
    }
    return formulas[stage]


def megatron_bytes_per_param(param_dtype: str, grad_dtype: str, d: int, distributed: bool) -> float:
    """Megatron-LM README ("Distributed optimizer") bytes/param: fp16/fp16 20 vs 4+16/d,
    bf16/fp32 18 vs 6+12/d, fp32/fp32 16 vs 8+8/d (d = data-parallel size)."""
    table = {("fp16", "fp16"): (20, 4, 16), ("bf16", "fp32"): (18, 6, 12), ("fp32", "fp32"): (16, 8, 8)}
    plain, kept, sharded = table[(param_dtype, grad_dtype)]
    return kept + sharded / d if distributed else plain


def deepspeed_estimate_zero2(
    total_params: float,
    num_gpus_per_node: int = 1,
    num_nodes: int = 1,
    cpu_offload: bool = True,
    additional_buffer_factor: float = 1.5,
) -> tuple[int, int]:
    """(cpu_bytes, gpu_bytes) as deepspeed 0.19.8 `estimate_zero2_model_states_mem_needs`
    (runtime/zero/stage_1_and_2.py): GPU 2Ψ with offload, else 2Ψ + 18Ψ/N (PR #5099)."""
    total_gpus = num_nodes * num_gpus_per_node
    if cpu_offload:
        gpu = 2 * total_params
        cpu = total_params * max(4 * total_gpus, 16) * additional_buffer_factor
    else:
        gpu = 2 * total_params + int(18 * total_params / total_gpus)
        cpu = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu), int(gpu)


def deepspeed_estimate_zero3(
    total_params: float,
    largest_layer_params: float,
    num_gpus_per_node: int = 1,
    num_nodes: int = 1,
    cpu_offload: bool = True,
    cpu_offload_params: bool = True,
    zero_init: bool = True,
    additional_buffer_factor: float = 1.5,
) -> tuple[int, int, int]:
    """(cpu_bytes, gpu_bytes, largest_layer_bytes) as deepspeed 0.19.8
    `estimate_zero3_model_states_mem_needs` (runtime/zero/stage3.py): the largest layer is
    gathered as 16-bit params + grads (4 bytes/param); 18 = 16-bit params + fp32 params,
    grads, momentum, variance."""
    total_gpus = num_nodes * num_gpus_per_node
    gpus_factor = 1 / num_nodes
    largest = 4 * largest_layer_params
    if cpu_offload:
        if cpu_offload_params:
            gpu = largest
            per = 18 * gpus_factor
            cpu = total_params * (per if zero_init else max(4 * num_gpus_per_node, per)) * additional_buffer_factor
        else:
            gpu = largest + int(2 * total_params / total_gpus)
            per = 16 * gpus_factor
            cpu = total_params * (per if zero_init else max(4 * num_gpus_per_node, per)) * additional_buffer_factor
    else:
        gpu = largest + int(18 * total_params / total_gpus)
        if zero_init:
            cpu = largest_layer_params * 4 * num_gpus_per_node * additional_buffer_factor
        else:
            cpu = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu), int(gpu), int(largest)


# --------------------------------------------------------------------------- whole device


@dataclass(frozen=True)
class MemoryEstimate:
    """Per-device memory breakdown (bytes) and the fit verdict against usable capacity.

    `capacity_bytes` is device memory minus the reserve (CUDA context). `total_bytes` is
    reserved memory (allocated + `allocator_reserve`), the figure published runs report;
    `fits` compares the allocated part with the capacity, since the allocator releases its
    cache before an allocation fails. Figures are the busiest pipeline stage's
    (`worst_stage`); `stages` holds the stages planned (those that can be the busiest;
    `stage_memory.every_stage_memory` gives all). `activation_bytes_per_layer` is one layer,
    one micro-batch, one TP rank.
    """

    weights: float
    gradients: float
    optimizer_states: float
    master_weights: float
    activations: float
    logits: float
    comm_buffers: float
    total_bytes: float
    capacity_bytes: float
    device_bytes: float
    cpu_offload_bytes: float
    activation_bytes_per_layer: float
    inflight_layers: float
    fits: bool
    fp8_buffers: float = 0.0
    allocator_reserve: float = 0.0
    framework: str = "fsdp"
    worst_stage: int = 0
    stages: tuple = ()
    stack: str = "flopwise"
    fits_with: tuple = ()  # the stack's memory options (plan/stacks) this estimate applies to fit
    band: float = 0.0  # validated relative error of this memory forecast (plan/band.memory_band)

    @property
    def may_fit(self) -> bool:
        """Fits, or is over the usable capacity by less than the forecast's own validated error:
        published runs have run at layouts planned that close (docs/validation.md), so such a
        layout is kept (as "tight"), never discarded; `fits` stays the strict verdict."""
        if self.fits:
            return True
        return bool(self.device_bytes) and self.allocated_bytes / (1.0 + self.band) <= self.capacity_bytes

    @property
    def verdict(self) -> str:
        """"fits", "tight" (within the memory band of the usable capacity) or "does not fit"."""
        return "fits" if self.fits else "tight" if self.may_fit else "does not fit"

    @property
    def allocated_bytes(self) -> float:
        """Bytes the busiest device allocates at its peak (total less the allocator's reserve)."""
        return self.total_bytes - self.allocator_reserve

    def per_device_bytes(self) -> dict:
        """The contract's six-way split of the busiest device: weights, gradients, optimizer
        (states + fp32 masters), activations (+ logits), other (buffers, fp8 copies,
        allocator reserve) and total."""
        return {
            "weights": self.weights,
            "gradients": self.gradients,
            "optimizer": self.optimizer_states + self.master_weights,
            "activations": self.activations + self.logits,
            "other": self.comm_buffers + self.fp8_buffers + self.allocator_reserve,
            "total": self.total_bytes,
        }

    def to_dict(self) -> dict:
        """JSON-able fields, plus GiB figures for people; stages as a list of dicts."""
        out = {name: getattr(self, name) for name in self.__dataclass_fields__ if name != "stages"}
        out["stages"] = [stage.to_dict() for stage in self.stages]
        out["allocated_bytes"] = self.allocated_bytes
        out["total_gib"] = self.total_bytes / GIB
        out["capacity_gib"] = self.capacity_bytes / GIB
        out["may_fit"] = self.may_fit
        out["verdict"] = self.verdict
        return out


def largest_unit_params(params: ParamCount, tp: int, blocks_per_unit: int = 1) -> float:
    """Parameters of the biggest FSDP/ZeRO-3 unit (`blocks_per_unit` blocks, or the embedding/head)
    on one TP rank (`fsdp_units.planned_blocks_per_unit`)."""
    return max(params.per_layer * blocks_per_unit, params.embedding, params.output_head) / tp


def largest_module_params(spec: ModelSpec, params: ParamCount, tp: int) -> float:
    """Parameters of the biggest single module (one Linear, or the embedding/head) on one TP
    rank: what DeepSpeed's ZeRO-3 gathers at a time, since it fetches parameters module by
    module (`runtime/zero/partitioned_param_coordinator.py`), not a whole block."""
    h = spec.hidden
    qkv = h * (spec.n_heads + 2 * kv_heads(spec)) * query_key_head_dim(spec)
    if is_mla(spec):  # the widest of its projections (q_b or q, kv_b, o)
        qkv = max(
            (spec.q_lora_rank or h) * spec.n_heads * query_key_head_dim(spec),
            spec.kv_lora_rank * spec.n_heads * (spec.qk_nope_head_dim + spec.v_head_dim),
            spec.n_heads * spec.v_head_dim * h)
    mlp = h * max(spec.ffn_hidden or 4 * h, spec.dense_ffn_hidden)
    return max(qkv / tp, mlp / tp, params.embedding / tp, params.output_head / tp)


def comm_buffer_bytes(params: ParamCount, sb: StateBytes, zero_stage: int, dp: int, tp: int, offload: str,
                      framework: str = "fsdp", largest_unit: float | None = None) -> float:
    """Communication buffers, by framework.

    - fsdp: DDP 2 × 25 MiB buckets; ZeRO-3 (FULL_SHARD) two gathered units (current +
      prefetched; a unit is a group of blocks under `parallel.fsdp_unit_mb`) in the weight dtype; ZeRO-1/2 two 25 MiB reduce buckets.
    - deepspeed ZeRO-3: the gathered largest layer's 16-bit weights and gradients,
      4 bytes/param (`estimate_zero3_model_states_mem_needs`); ZeRO-1/2 as fsdp.
    - megatron: none beyond the contiguous gradient and parameter buffers, which the
      model states already count (the buckets are views into them).
    `largest_unit`: the parameters one gather fetches when a stack gathers by module
    (`largest_module_params`) rather than by block (`largest_unit_params`).
    """
    unit = largest_unit_params(params, tp) if largest_unit is None else largest_unit
    if dp == 1 and zero_stage < 3:
        return 0.0
    if framework == "megatron" and zero_stage < 3 and offload != "params":
        return 0.0
    if zero_stage >= 3 or offload == "params":
        if framework == "deepspeed":
            return 4.0 * unit
        return 2.0 * unit * sb.weight
    return 2.0 * DDP_BUCKET_BYTES


FP8_CACHED_BYTES_PER_PARAM = 2.0
"""Transformer Engine keeps an fp8 copy of each weight and of its transpose across
micro-batches (TE docs, `fp8_autocast` / "weight caching"): 2 bytes per local parameter."""


def fp8_buffer_bytes(precision: str, framework: str, params_on_device: float, largest_unit: float,
                     zero_stage: int = 0) -> float:
    """fp8 weight copies: megatron/deepspeed (Transformer Engine) cache them for every local
    weight; fsdp (torchao float8) casts per gathered unit, two units at a time, and so does any
    stack under ZeRO-3 (Megatron-Core's FSDP), whose weights are whole only while a unit is gathered."""
    if precision != "fp8":
        return 0.0
    if framework == "fsdp" or zero_stage >= 3:
        return FP8_CACHED_BYTES_PER_PARAM * 2.0 * largest_unit
    return FP8_CACHED_BYTES_PER_PARAM * params_on_device


ALLOCATOR_RESERVE_FRACTION = 0.10
"""Reserved-but-unallocated memory of PyTorch's caching allocator, as a fraction of the memory
allocated and freed within each step (gradients, activations, logits, gathered weights and
buffers, fp8 copies). The allocator rounds requests up (512 B granules, 2 MiB small / 20 MiB
large segments; PyTorch "CUDA semantics — memory management") and keeps freed blocks, whose
splits are what strands memory, so the reserved memory that `nvidia-smi`,
`torch.cuda.max_memory_reserved` and published runs report exceeds the allocated peak. Weights,
fp32 masters and optimizer states are allocated once and held for the run: they cost only their
rounding and are left out. 10 % is a stated assumption, not a fit (stacks launched with
`expandable_segments` take 2 %, plan/stacks); `--allocator-reserve` changes it (0 compares with
allocated memory)."""


def allocator_reserve_bytes(transient: float, fraction: float = ALLOCATOR_RESERVE_FRACTION) -> float:
    """Allocator slack on top of the allocated peak: `fraction` × the bytes allocated and
    freed within a step (`transient`); the states held for the whole run add none."""
    return transient * fraction
