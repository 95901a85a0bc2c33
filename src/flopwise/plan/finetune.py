"""Planning a LoRA or QLoRA fine-tune: the frozen/trainable split, NF4 bytes, adapter sizes,
the memory of a frozen base and the FLOPs and time of a backward without base weight gradients.

Pure Python over the planner's frozen data (no torch). Sources:

- LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", §4.1): a frozen
  d_out × d_in weight W gains B·A with A: r × d_in and B: d_out × r, so r·(d_in + d_out)
  trainable parameters per adapted matrix; only A and B get gradients and optimizer states.
- QLoRA (Dettmers et al. 2023, "QLoRA: Efficient Finetuning of Quantized LLMs", §3): the frozen
  base in 4-bit NormalFloat (NF4) blocks of 64 weights, each block's absmax constant itself
  quantized to 8 bits ("double quantization") with one second-level constant per 256 blocks:
  4 + 8/64 + 32/(64·256) = 4.127 bits per weight with fp32 second-level constants (bitsandbytes).
  torchao's `NF4Tensor` (torchao/dtypes/nf4tensor.py: `quantized_data` uint8 two per byte,
  `quantized_scalers` int8 per 64, `quantization_factor` in the weight's dtype per 256 blocks,
  `block_size=64, scaler_block_size=256`) stores the second level in bf16: 4.125 bits + 16/16384.
  What is quantized: every linear weight of the transformer blocks; embeddings, norms and the
  LM head stay in bf16 (torchtune's `FrozenNF4Linear` / PEFT with bitsandbytes `Linear4bit`
  replace the blocks' `nn.Linear` only; the head is excluded by both).
- Dequantisation: torchao's `LinearNF4` saves the NF4 weight and calls `weight.to(dtype)` in
  its forward and again in its backward (input gradient only: the weight never requires grad),
  so one bf16 copy of one weight lives at a time and each base parameter is dequantised twice
  per micro-batch, three times with full recompute (the forward runs again).
- Saved activations: a frozen `nn.Linear` saves only its weight, not its input (torch's
  autograd saves `mm`'s `self` only when the other operand requires grad; checked on torch
  2.13: a frozen Linear's saved tensors are its weight alone). An adapted linear's input is
  kept anyway, by its adapter's A (the same tensor with LoRA dropout 0; a dropout copy plus
  its 1-byte mask otherwise), and the rank-r intermediate is kept for B.

FLOPs convention (stated once): the FLOPs really run. Per token and matmul weight: 2 forward
and 2 backward (input gradient only) for the frozen base — 4·N, not 6·N — plus 6 per adapter
parameter (forward, input and weight gradients); attention as in full training (its backward
needs dQ, dK, dV either way); recompute adds a forward. The first block's input gradient,
which no adapter below needs, is counted too (1/L of the base backward; autograd skips it).

Which stacks run what, and so what is planned:
- PEFT (Hugging Face), torchtune, flopwise's trainer: LoRA and QLoRA on one device, DDP or FSDP2
  (FSDP-QLoRA); no tensor or pipeline parallelism (adapters "peft").
- Megatron-Core as NeMo 2 and Megatron-Bridge run LoRA (`--stack nemo`, alias of megatron-core):
  LoRA under tensor, pipeline and data parallelism (adapters "megatron"; below).
- QLoRA under tensor or pipeline parallelism: no stack. NeMo's NF4 wrappers replace the TE linears
  and say "Tensor Parallel is not supported" (nemo/collections/nlp/modules/common/megatron/adapters/
  qlora.py, `NF4LinearWrapper`); bitsandbytes and torchao train NF4 bases under DDP/FSDP only.

Megatron-Core's LoRA (NeMo `nemo/collections/llm/peft/lora.py`, Megatron-Bridge `peft/utils.py`
`ParallelLinearAdapter`, `get_adapter_attributes_from_linear`), as planned:
- the frozen base is split over tp and pp exactly as full training splits it (`stage_memory`), in the
  stack's weight dtype (bf16; under fp8 Transformer Engine's cached fp8 copy and transpose of every
  weight as in full training); it has no gradient, master or optimizer state;
- one adapter per Megatron linear: the fused `linear_qkv` and `linear_fc1` get one A each
  (r·(h + (a+2g)·d) and r·(h + 2f) parameters, not three and two), `linear_proj` and `linear_fc2`
  one each (`LoRA`; `CanonicalLoRA` would split them as PEFT does);
- both factors are split over tp: on a column-parallel base (qkv, fc1) A is a ColumnParallelLinear
  over the rank (r/t rows, output all-gathered) and B a ColumnParallelLinear (d_out/t rows); on a
  row-parallel base (proj, fc2) A is a RowParallelLinear (d_in/t columns, output all-reduced) and B a
  ColumnParallelLinear whose output is all-gathered, then scattered to the sequence shard under
  sequence parallelism. A rank holds 1/t of every adapter and runs 1/t of its FLOPs;
- adapters are bf16 parameters (`self.bfloat16()` under bf16 mixed precision) trained with the
  stack's mixed precision: fp32 `main_grad`, fp32 master and Adam states, sharded over dp by the
  distributed optimizer; their gradients are reduced over dp only (tp ranks hold different shards);
- under sequence parallelism the adapter on a column-parallel base reads the norm's output gathered
  over the sequence (TE `return_layernorm_output_gathered`) and keeps it whole for A's weight
  gradient, while a frozen TE linear keeps no input (TE 2: `backward_needs_input = is_grad_enabled and
  weight.requires_grad`); TE's fused RMSNorm keeps no fp32 copy of its input;
- the adapters' collectives (`adapter_tp_collectives`) are plain NCCL calls outside TE's userbuffers:
  exposed. The base's own collectives are full training's;
- adapter GEMMs run in 16 bits under fp8: Megatron-Core's own parallel linears, outside TE.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

from flopwise.catalog.models import ModelSpec, is_mla, kv_heads, query_key_head_dim, value_head_dim
from flopwise.config.finetune_defaults import SEQ_LEN_CAP
from flopwise.errors import UserError
from flopwise.plan import memory as mem
from flopwise.plan.params import ParamCount, count_params
from flopwise.plan.spec import local_seq_len
from flopwise.plan.window import attention_work_share

FINETUNE_METHODS = ("full", "lora", "qlora")
LORA_TARGETS = ("all-linear", "qkvo")
"""`all-linear`: every linear of the blocks (PEFT's `target_modules="all-linear"`, QLoRA §4's
finding that all layers are needed to match full fine-tuning); `qkvo`: the attention
projections only (LoRA's original choice, Hu et al. 2021 §7.1). Anything else is a list of
module names (`named_targets`)."""

MODULE_MATRICES = {
    # Hugging Face Llama / Mistral / Qwen / DeepSeek (PEFT's own default for Llama is q_proj, v_proj)
    "q_proj": ("q",), "k_proj": ("k",), "v_proj": ("v",), "o_proj": ("o",),
    "gate_proj": ("gate",), "up_proj": ("up",), "down_proj": ("down",),
    "q_a_proj": ("q_a",), "q_b_proj": ("q_b",), "kv_a_proj_with_mqa": ("kv_a",), "kv_b_proj": ("kv_b",),
    # flopwise's built-in decoder (train/model.py) and torchtune's Llama (w1 gate, w3 up, w2 down)
    "wq": ("q",), "wk": ("k",), "wv": ("v",), "wo": ("o",), "output_proj": ("o",),
    "w1": ("gate",), "w3": ("up",), "w2": ("down",), "c_fc": ("up",), "c_attn": ("q", "k", "v"),
    # Megatron-Core / NeMo (`target_modules` of nemo/collections/llm/peft/lora.py)
    "linear_qkv": ("q", "k", "v"), "linear_proj": ("o",), "linear_fc1": ("gate", "up"), "linear_fc2": ("down",),
}
"""Module names, as PEFT, torchtune, NeMo and flopwise's own decoder spell them, and the planner's
block matrices (`block_linears`) each one adapts; the planner's names (`MATRIX_NAMES`) are accepted
as they are."""
DEFAULT_LORA_RANK = 16

NF4_BLOCK = 64
NF4_SCALER_BLOCK = 256


def nf4_bytes_per_param(scaler_factor_bytes: float = 2.0) -> float:
    """Bytes per NF4 weight: 4 bits of data, one int8 block constant per 64 weights and one
    second-level constant of `scaler_factor_bytes` per 64·256 weights (QLoRA §3 double quantization).

    2 bytes: torchao's `NF4Tensor` on a bf16 weight, 0.5 + 1/64 + 2/16384 = 0.515747;
    4 bytes: the paper's and bitsandbytes' fp32 constants, 0.5 + 1/64 + 4/16384 = 0.515869."""
    return 0.5 + 1.0 / NF4_BLOCK + scaler_factor_bytes / (NF4_BLOCK * NF4_SCALER_BLOCK)


NF4_BYTES_PER_PARAM = nf4_bytes_per_param(2.0)
"""What the planner charges per quantized weight: torchao's layout on a bf16 base."""
FINETUNE_SEQ_LEN_CAP = SEQ_LEN_CAP
"""A fine-tune's default sequence length: the model's context capped here, the trainer's own cap on
`data.seq_len` (config/finetune_defaults.py; longer windows are memory a user chooses to spend)."""
DEFAULT_FINETUNE_BATCH_TOKENS = 2**17
"""Tokens per optimizer step of a fine-tune when none is given (an assumption: 32 sequences of
4096, or 64 of 2048; QLoRA's Guanaco runs used batches of 16 at up to 512 tokens, Alpaca-style
LoRA recipes 128 of 512 = 64Ki)."""


@dataclass(frozen=True)
class TargetMatrix:
    """One kind of linear weight in a block: input and output widths and how many a block holds."""

    name: str
    d_in: int
    d_out: int
    count: int = 1


ATTENTION_MATRICES = ("q", "k", "v", "o", "q_a", "q_b", "kv_a", "kv_b")
"""The attention's linears (`--lora-targets qkvo`): q, k, v, o, or multi-head latent attention's."""
ATTENTION_INPUT_READERS = ("q", "k", "v", "q_a", "kv_a")
"""Linears that read the attention block's input."""


def attention_linears(spec: ModelSpec) -> list[TargetMatrix]:
    """The attention's linear weights: q, k, v, o (GQA-aware), or MLA's q_a and q_b (or q),
    kv_a, kv_b and o (transformers' `DeepseekV3Attention`)."""
    h, a = spec.hidden, spec.n_heads
    d, dv = query_key_head_dim(spec), value_head_dim(spec)
    if not is_mla(spec):
        g = kv_heads(spec)
        return [TargetMatrix("q", h, a * d), TargetMatrix("k", h, g * d), TargetMatrix("v", h, g * d),
                TargetMatrix("o", a * d, h)]
    r_q, r_kv = spec.q_lora_rank, spec.kv_lora_rank
    query = [TargetMatrix("q_a", h, r_q), TargetMatrix("q_b", r_q, a * d)] if r_q else [TargetMatrix("q", h, a * d)]
    return query + [TargetMatrix("kv_a", h, r_kv + spec.qk_rope_head_dim),
                    TargetMatrix("kv_b", r_kv, a * (spec.qk_nope_head_dim + dv)), TargetMatrix("o", a * dv, h)]


def block_linears(spec: ModelSpec, dense: bool = False) -> tuple[TargetMatrix, ...]:
    """Every linear weight of one transformer block (MoE experts counted; the router stays out,
    as PEFT's all-linear and QLoRA's recipes leave it alone); `dense`: one of DeepSeek's leading
    blocks, whose MLP is dense."""
    h = spec.hidden
    f = spec.dense_ffn_hidden if dense else (spec.ffn_hidden or 4 * h)
    matrices = attention_linears(spec)
    experts = 1 if dense else max(1, spec.n_experts)
    up = ("gate", "up") if spec.mlp == "swiglu" else ("up",)
    matrices += [TargetMatrix(name, h, f, experts) for name in up] + [TargetMatrix("down", f, h, experts)]
    shared = 0 if dense else spec.shared_expert_ffn_hidden
    if shared:
        matrices += [TargetMatrix("shared_" + name, h, shared) for name in up]
        matrices.append(TargetMatrix("shared_down", shared, h))
    return tuple(matrices)


def routed_share(spec: ModelSpec, matrix: TargetMatrix) -> float:
    """Share of a micro-batch's tokens one copy of `matrix` sees: k/E for a routed expert's
    weights (each token visits k of E experts), 1 otherwise."""
    if matrix.count > 1 and spec.n_experts > 1:
        return max(1, spec.experts_per_token) / spec.n_experts
    return 1.0


FUSED_PROJECTIONS = {"qkv": ("q", "k", "v"), "fc1": ("gate", "up"), "shared_fc1": ("shared_gate", "shared_up")}
"""Megatron-Core's fused linears, each adapted by one LoRA (`linear_qkv`, `linear_fc1`)."""
COLUMN_PARALLEL = {"q", "k", "v", "gate", "up", "shared_gate", "shared_up", *FUSED_PROJECTIONS,
                   "q_a", "kv_a", "q_b", "kv_b"}
"""Linears whose input tensor parallelism leaves whole: the column-parallel ones (split by output), and
MLA's down-projections q_a, kv_a (replicated) and up-projections q_b, kv_b (column-parallel); o and
down are row-parallel (Shoeybi et al. 2019)."""
ATTENTION_TARGETS = {*ATTENTION_MATRICES, "qkv"}
MATRIX_NAMES = (*ATTENTION_MATRICES, "gate", "up", "down")
"""The block matrices a target list can name, in the order `named_targets` writes them."""


def named_targets(targets, key: str = "--lora-targets") -> str:
    """`--lora-targets` / `finetune.target_modules` in the planner's terms: `all-linear`, `qkvo`, or
    the block matrices a list of module names adapts, comma-joined in block order ("q,v" for PEFT's
    `["q_proj", "v_proj"]`). A module path counts by its last part, as PEFT matches names; an unknown
    name is one clear error naming `key` (the flag, or the config key for a config's section)."""
    if isinstance(targets, str):
        text = targets.strip().lower()
        if text in LORA_TARGETS:
            return text
        names = [part for part in text.replace(",", " ").split() if part]
    else:
        names = [str(name).strip().lower() for name in targets]
    matrices: set[str] = set()
    for name in names:
        leaf = name.rsplit(".", 1)[-1]
        if leaf in MATRIX_NAMES:
            matrices.add(leaf)
        elif leaf in MODULE_MATRICES:
            matrices.update(MODULE_MATRICES[leaf])
        else:
            raise UserError(f"{key}: unknown module '{name}'; {_TARGETS_HELP[key != '--lora-targets']}")
    if not matrices:
        raise UserError(f"{key} names no module; use all-linear, qkvo or module names such as q_proj,v_proj")
    return ",".join(name for name in MATRIX_NAMES if name in matrices)


_TARGETS_HELP = (
    "use all-linear, qkvo or module names as a tool spells them: q_proj,v_proj (Hugging Face / PEFT), "
    "wq,wv (torchtune, flopwise's built-in decoder), linear_qkv (NeMo)",
    # a run config's names are what `flopwise train` hands PEFT: the model's own
    "use all-linear, qkvo or the model's own module names, as `flopwise train` adapts them (q_proj,v_proj "
    "for Hugging Face Llama, Mistral, Qwen); the planner also reads torchtune's wq,wv and NeMo's linear_qkv",
)
"""The allowed target spellings for `--lora-targets` (the planner's flag) and for a config's key."""


@lru_cache(maxsize=256)
def _target_names(targets: str) -> frozenset[str] | None:
    """The block matrix names `targets` (see `named_targets`) adapts; None for every linear. Cached:
    a search asks it for every layout."""
    targets = named_targets(targets)
    if targets == "all-linear":
        return None
    return frozenset(ATTENTION_TARGETS if targets == "qkvo" else targets.split(","))


def _targeted(m: TargetMatrix, names: frozenset[str] | None) -> bool:
    """Whether block matrix `m` is among `names` (`_target_names`): a listed name adapts the shared
    expert's matrix of that name too, and a fused linear (Megatron's qkv, fc1) when any of its parts
    is listed, since one adapter covers it."""
    if names is None:
        return True
    base = m.name.removeprefix("shared_")
    return base in names or any(part in names for part in FUSED_PROJECTIONS.get(base, ()))


def target_matrices(spec: ModelSpec, targets: str, fused: bool = False) -> tuple[TargetMatrix, ...]:
    """The block linears that get an adapter: all of them, the attention's (q, k, v, o, or
    MLA's), or those a list of module names adapts; `fused`: q, k, v as one qkv and gate, up as
    one fc1, as Megatron-Core builds them (one adapter on each)."""
    linears = block_linears(spec)
    if fused:
        merged = []
        for m in linears:
            name = next((f for f, parts in FUSED_PROJECTIONS.items() if m.name in parts), None)
            if name is None:
                merged.append(m)
            elif merged and merged[-1].name == name:
                merged[-1] = dataclasses.replace(merged[-1], d_out=merged[-1].d_out + m.d_out)
            else:
                merged.append(TargetMatrix(name, m.d_in, m.d_out, m.count))
        linears = tuple(merged)
    names = _target_names(targets)
    return tuple(m for m in linears if _targeted(m, names))


def split_targets(spec: ModelSpec, split: "FinetuneSplit") -> tuple[TargetMatrix, ...]:
    """The adapted matrices of a split, fused as its stack builds them."""
    return target_matrices(spec, split.targets, split.adapters == "megatron")


def adapter_params_per_layer(spec: ModelSpec, rank: int, targets: str, fused: bool = False) -> int:
    """Trainable parameters of one block: r·(d_in + d_out) per adapted matrix (Hu et al. 2021 §4.1)."""
    return sum(rank * (m.d_in + m.d_out) * m.count for m in target_matrices(spec, targets, fused))


def active_adapter_params_per_layer(spec: ModelSpec, rank: int, targets: str, fused: bool = False) -> float:
    """Adapter parameters one token passes through in a block (an MoE token visits k experts' adapters)."""
    return sum(rank * (m.d_in + m.d_out) * m.count * routed_share(spec, m)
               for m in target_matrices(spec, targets, fused))


def quantized_params_per_layer(spec: ModelSpec) -> int:
    """Weights of one block that QLoRA stores in NF4: every linear weight (biases stay 16-bit)."""
    return sum(m.d_in * m.d_out * m.count for m in block_linears(spec))


def largest_linear_params(spec: ModelSpec) -> int:
    """The biggest single linear weight: the one bf16 copy that dequantisation makes at a time."""
    return max(m.d_in * m.d_out for m in block_linears(spec))


def frozen_weight_bytes(precision: str, amp: bool = False) -> float:
    """Bytes per frozen base parameter held in its dtype: 4 for fp32/tf32, else 2 (bf16; an fp8
    run keeps its base in bf16, the fp8 copies being transient). `amp`: the stack's 16-bit training
    is autocast over fp32 parameters and leaves the base in fp32 (Lightning's bf16-mixed, litgpt)."""
    return 4.0 if precision in ("fp32", "tf32") or (amp and precision in ("bf16", "fp16")) else 2.0


def amp_base(spec) -> bool:
    """Whether the spec's stack keeps a fine-tune's frozen base in fp32 under 16-bit autocast
    (`Stack.fp32_params`: Lightning's bf16-mixed casts no module, so litgpt's base stays fp32)."""
    from flopwise.plan.stacks import find_stack

    found = find_stack(spec.stack)
    return found is not None and found.fp32_params and spec.workload.precision in ("bf16", "fp16")


# --------------------------------------------------------------------------- the split


@dataclass(frozen=True)
class FinetuneSplit:
    """How a fine-tune divides the model: what trains, what is frozen and in which format."""

    method: str
    rank: int
    targets: str
    trainable_params: float
    frozen_params: float
    quantized_params: float
    frozen_bytes: float
    largest_dequantized_bytes: float
    adapters_per_layer: float
    quantized_per_layer: float
    adapters: str = "peft"  # how the stack builds them: "peft" (one per linear) or "megatron" (module docstring)

    @property
    def trainable_share(self) -> float:
        """Trainable parameters as a share of the whole (base + adapters)."""
        whole = self.trainable_params + self.frozen_params
        return self.trainable_params / whole if whole else 0.0

    def to_dict(self) -> dict:
        """JSON-able fields plus the trainable share."""
        out = dataclasses.asdict(self)
        out["trainable_share"] = self.trainable_share
        out["nf4_bytes_per_param"] = NF4_BYTES_PER_PARAM if self.method == "qlora" else None
        return out


def adapter_style(stack: str) -> str:
    """How `stack` builds adapters: "megatron" for Megatron-Core (NeMo 2, Megatron-Bridge), else "peft"."""
    from flopwise.plan.stacks import find_stack

    found = find_stack(stack)
    return "megatron" if found is not None and found.name in ("megatron-core", "nemo") else "peft"


def finetune_split(spec: ModelSpec, pc: ParamCount, method: str, rank: int, targets: str,
                   precision: str, adapters: str = "peft", amp: bool = False) -> FinetuneSplit:
    """The split of a `method` fine-tune; `full` trains everything (no adapters, nothing frozen).
    `adapters`: "megatron" fuses the q, k, v and gate, up adapters as Megatron-Core does; `amp`: the
    base stays fp32 under 16-bit autocast (`frozen_weight_bytes`)."""
    if method == "full":
        return FinetuneSplit("full", 0, targets, float(pc.total), 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    adapters_per_layer = adapter_params_per_layer(spec, rank, targets, adapters == "megatron")
    quantized = quantized_params_per_layer(spec) if method == "qlora" else 0
    all_adapters, all_quantized = pc.n_layers * adapters_per_layer, pc.n_layers * quantized
    if spec.dense_layers:  # DeepSeek's leading dense blocks have fewer linears than the MoE ones
        dense = _dense_block_linears(spec, targets)
        all_adapters -= spec.dense_layers * (adapters_per_layer - sum(rank * (m.d_in + m.d_out) for m in dense))
        if quantized:
            all_quantized -= spec.dense_layers * (quantized - sum(m.d_in * m.d_out for m in block_linears(spec, True)))
    base = frozen_weight_bytes(precision, amp)
    frozen_bytes = (pc.total - all_quantized) * base + all_quantized * NF4_BYTES_PER_PARAM
    largest = largest_linear_params(spec) * base if method == "qlora" else 0.0
    return FinetuneSplit(method, rank, targets, float(all_adapters), float(pc.total),
                         float(all_quantized), frozen_bytes, largest, float(adapters_per_layer),
                         float(quantized), adapters)


def _dense_block_linears(spec: ModelSpec, targets: str) -> tuple[TargetMatrix, ...]:
    """The adapted linears of one leading dense block (per-block figures elsewhere are the MoE
    block's: stages and time treat every block as MoE, as full training does)."""
    names = _target_names(targets)
    return tuple(m for m in block_linears(spec, dense=True) if _targeted(m, names))


def split_of(spec) -> FinetuneSplit | None:
    """The fine-tune split of a RunSpec, or None for full training."""
    work = spec.workload
    method = getattr(work, "finetune", "full")
    if method == "full" or spec.model.arch == "cnn":
        return None
    return finetune_split(spec.model, count_params(spec.model), method, work.lora_rank, work.lora_targets,
                          work.precision, adapter_style(spec.stack), amp_base(spec))


# --------------------------------------------------------------------------- memory


def adapter_state_bytes(precision: str, optimizer: str) -> mem.StateBytes:
    """Bytes per adapter parameter of each model state: the adapters are fp32 under every precision
    but pure bf16 (PEFT keeps them in fp32, `autocast_adapter_dtype=True`; `train/techniques/lora.py`
    gives them `adapter_dtype=torch.float32`), so 4 + 4 + optimizer and no master copy; under
    `bf16-true` they are bf16 like the rest (2 + 2 + bf16 optimizer states)."""
    return mem.state_bytes("bf16-true" if precision == "bf16-true" else "fp32", optimizer)


def stage_states(split: FinetuneSplit, spec, params: float, layers: int, sb: mem.StateBytes,
                 zero_stage: int, shard: int, offload: str) -> tuple[float, float, float, float, float]:
    """(weights, gradients, optimizer states, fp32 masters, CPU bytes) of one stage's rank.

    `params` are the stage's base parameters on this rank (already / tp, the embedding on the first
    stage and the head on the last, as full training places them), `layers` its blocks; `sb` the
    stack's bytes per parameter for full training. Frozen base: in its dtype, the blocks' linears in
    NF4 for QLoRA, sharded by ZeRO-3 (FSDP2 of the base, as FSDP-QLoRA does), offloaded with `params`.
    Adapters, a tp-th of each on a rank (both factors split, `ParallelLinearAdapter`): PEFT's in
    `adapter_state_bytes` (fp32 under mixed precision), Megatron-Core's in the stack's own `sb` (fp32
    main_grad, master and Adam) with 16-bit weights, each sharded by the ZeRO stage (the distributed
    optimizer's, over dp); Megatron-Core's frozen base in `sb.weight` (1 byte with TE's fp8 parameters,
    which leave the adapters, Megatron-Core's own linears, in 16 bits)."""
    tp = max(1, spec.layout.tp)
    adapters = split.adapters_per_layer * layers / tp
    quantized = split.quantized_per_layer * layers / tp
    base = frozen_weight_bytes(spec.workload.precision, amp_base(spec))
    if split.adapters == "megatron":  # TE's fp8 parameters are the base's; the adapters stay 16-bit
        base, sb = sb.weight, dataclasses.replace(sb, weight=base)
    else:
        sb = adapter_state_bytes(spec.workload.precision, spec.workload.optimizer)
    frozen = (params - quantized) * base + quantized * NF4_BYTES_PER_PARAM
    if zero_stage >= 3:
        frozen /= shard
    states = mem.model_states(adapters, sb, zero_stage, shard, offload)
    cpu = states.cpu_bytes
    if offload == "params":
        cpu += frozen
        frozen = 0.0
    return frozen + states.weights, states.gradients, states.optimizer_states, states.master_weights, cpu


DROPOUT_MASK_BYTES = 1.0
"""Bytes per element of the mask LoRA dropout keeps: CUDA's fused `native_dropout` keeps a bool
mask; on a CPU torch's composite dropout multiplies by a scaled noise tensor of the input's
dtype and keeps that (e bytes; checked on torch 2.13)."""


def dropout_mask_bytes(hardware, dtype_bytes: float) -> float:
    """LoRA dropout's mask bytes per element on `hardware`: e on a CPU, else 1 (`DROPOUT_MASK_BYTES`)."""
    from flopwise.plan.gemm import curve_for

    return dtype_bytes if curve_for(hardware).family == "cpu" else DROPOUT_MASK_BYTES


def activation_delta_bytes(spec: ModelSpec, split: FinetuneSplit, seq_len: int, micro_batch: int,
                           dtype_bytes: float, lora_dropout: float, tp: int = 1,
                           mask_bytes: float = DROPOUT_MASK_BYTES, attn_output_copy: bool = False,
                           input_copy_bytes: float = 0.0, sequence_parallel: bool = False,
                           gemm_input_bytes: float | None = None, normalised_kept: bool = True) -> float:
    """What one block of a fine-tune keeps for backward beyond full training's activations
    (`memory.activation_terms`), per micro-batch and TP rank; negative terms are what it keeps less.

    A frozen linear keeps only its weight, not its input (torch's autograd saves `mm`'s input only
    for the weight gradient; TE likewise), so an input is kept only by an adapter's A reading it:
    - per adapted matrix: the rank-r intermediate (B's input, e·T·r, whole on every TP rank: A's output
      is gathered or all-reduced before B); with LoRA dropout, the dropped copy A reads and the
      dropout's mask (whole for a column-parallel base, a tp-th of d_in for a row-parallel one), and
      then nobody keeps the linear's own input;
    - `input_copy_bytes` > 0: adapters that cast their input keep their own copy of it, of that
      many bytes per element, and their rank-r intermediate in that dtype (PEFT's default keeps
      fp32 adapters on a 16-bit base and casts each input to fp32, `autocast_adapter_dtype=True`:
      4; under bf16 autocast the fp32 copy is cast back for the matmul: 2). 0 (the plan's
      default): adapters compute in the activation dtype and read their input as it is (PEFT
      with `autocast_adapter_dtype=False`, torchtune, Megatron-Core);
    - the inputs of the q, k, v (qkv) and gate, up (fc1) linears, which full training keeps as
      `gemm_input_bytes` (g: e, or 1 under TE's fp8) per element, a tp-th of the sequence under
      `sequence_parallel`: an adapter reading one undropped keeps it whole in e instead (the norm's
      output, gathered over the sequence for a column-parallel linear: + e·T·h − g·T·h/t); else it is
      not kept (− g·T·h/t). The down projection's input likewise (+ (e − g)·T·f/t, or − g·T·f/t); the
      out-projection's input is the attention kernel's output, which attention keeps anyway, except
      where it is a copy (`attn_output_copy`, torch's CPU flash kernel: − e·T·a·d/t when not read);
    - frozen RMSNorm weights: the norm keeps its input and statistics but not the normalised
      tensor, which only the weight's gradient needs (− e·T·h per norm, /t under sequence parallelism),
      where full training counts it (`normalised_kept`; fused norms never keep it).
    Checked against saved-tensor bytes of a real LoRA'd llama block on a CPU (tests/plan/test_finetune.py)."""
    tokens = float(seq_len) * micro_batch
    e = dtype_bytes
    g = e if gemm_input_bytes is None else gemm_input_bytes
    shard = tp if sequence_parallel else 1  # what sequence parallelism divides full training's block inputs by
    kept = 0.0
    targets = split_targets(spec, split)
    adapter_e = input_copy_bytes or e
    for m in targets:
        seen = m.count * routed_share(spec, m) * tokens  # tokens through all copies (k per token for experts)
        kept += adapter_e * seen * split.rank
        if lora_dropout > 0 or input_copy_bytes:
            width = m.d_in if m.name in COLUMN_PARALLEL else m.d_in / tp
            kept += (adapter_e + (mask_bytes if lora_dropout > 0 else 0.0)) * seen * width
    read_whole = {m.name for m in targets} if lora_dropout == 0 and not input_copy_bytes else set()
    f = mem.mlp_width_per_token(spec)  # a token's MLP width: k routed experts (+ the shared one) under MoE
    for group in ({*ATTENTION_INPUT_READERS, "qkv"}, {"gate", "up", "fc1"}):
        kept += (e if read_whole & group else 0.0) * tokens * spec.hidden - g * tokens * spec.hidden / shard
    kept += ((e if "down" in read_whole else 0.0) - g) * tokens * f / tp
    if attn_output_copy and "o" not in read_whole:
        kept -= e * tokens * spec.n_heads * value_head_dim(spec) / tp
    if spec.norm == "rmsnorm" and normalised_kept:
        kept -= spec.norms_per_layer * e * tokens * spec.hidden / shard
    return kept


def block_activation_delta_bytes(spec, split: FinetuneSplit, seq_len: int, dtype_bytes: float,
                                 gemm_input_bytes: float | None, fused_norm: bool) -> float:
    """`activation_delta_bytes` of a RunSpec's block as its stack runs the adapters, plus what PEFT's fp32
    adapters (`adapter_cast_bytes`) and Hugging Face's upcasting RMSNorms (`norm_upcast_bytes`, unless the
    stack's norms are fused kernels) keep, per micro-batch and TP rank."""
    lay, work, model = spec.layout, spec.workload, spec.model
    mb = lay.micro_batch_size
    peft = split.adapters == "peft"
    delta = activation_delta_bytes(model, split, seq_len, mb, dtype_bytes, work.lora_dropout, lay.tp,
                                   dropout_mask_bytes(spec.cluster.hardware, dtype_bytes),
                                   input_copy_bytes=adapter_input_copy_bytes(work.precision) if peft else 0.0,
                                   sequence_parallel=lay.sequence_parallel and lay.tp > 1,
                                   gemm_input_bytes=gemm_input_bytes, normalised_kept=not fused_norm)
    if peft:
        delta += adapter_cast_bytes(model, split, seq_len, mb, work.precision)
    if not fused_norm:
        delta += model.norms_per_layer * norm_upcast_bytes(model, seq_len, mb, dtype_bytes)
    return delta


FROZEN_HEAD_INPUT_COPIES = 1.0
"""Copies of the last hidden state a fine-tune keeps for the head's backward: the frozen final
RMSNorm keeps its input (and its statistics) but not the normalised tensor, which only its weight's
gradient reads, and the frozen head keeps no input, its input gradient reading the weight alone
(measured: benchmarks/saved_tensors_hf_block.py). Full training keeps 2 (`stage_memory`)."""


def first_block_saving(spec: ModelSpec, seq_len: int, micro_batch: int, dtype_bytes: float,
                       upcast: bool = True, shard: int = 1) -> float:
    """Bytes the first block of a fine-tune keeps less than the others, without recompute: its input
    comes from a frozen embedding and needs no gradient, so its first norm (a frozen weight too)
    keeps nothing, not its input (e·T·h/`shard`, a sequence-parallel shard; fp32 for an upcasting
    RMSNorm unless `upcast` is False, a fused norm). Measured on an HF llama
    (benchmarks/saved_tensors_hf_block.py); the frozen embedding itself keeps no token ids (`stage_memory`)."""
    saved = dtype_bytes * float(seq_len) * micro_batch * spec.hidden
    if upcast:
        saved += norm_upcast_bytes(spec, seq_len, micro_batch, dtype_bytes)
    return saved / shard


UPCAST_NORM_INPUT_BYTES = 4.0
"""Bytes per element of the input a 16-bit fine-tune's frozen RMSNorm keeps: Hugging Face's
`LlamaRMSNorm` (and Mistral's, Qwen2's) casts its input to fp32 before squaring it, and the square
keeps that fp32 copy (measured under bf16 autocast and bf16-true, benchmarks/saved_tensors_hf_block.py)."""


def norm_upcast_bytes(spec: ModelSpec, seq_len: int, micro_batch: int, dtype_bytes: float) -> float:
    """What one kept RMSNorm input of a fine-tune costs beyond e·T·h: (4 − e)·T·h under 16-bit
    activations, 0 in fp32 or for LayerNorm. Full training keeps the same fp32 copy, so it is no
    part of `activation_delta_bytes`; full training's plan does not count it (yet), a fine-tune's
    does (`stage_memory`: each block's norms, the final norm)."""
    if spec.norm != "rmsnorm" or dtype_bytes >= UPCAST_NORM_INPUT_BYTES:
        return 0.0
    return (UPCAST_NORM_INPUT_BYTES - dtype_bytes) * float(seq_len) * micro_batch * spec.hidden


def adapter_cast_bytes(spec: ModelSpec, split: FinetuneSplit, seq_len: int, micro_batch: int,
                       precision: str) -> float:
    """What fp32 adapters under 16-bit autocast keep per block beyond `activation_delta_bytes`' rank-r
    path: autocast's 16-bit copy of each adapter weight (A and B), which the input gradients read,
    2 bytes per adapter parameter per micro-batch (PEFT, `autocast_adapter_dtype=True`; measured on an
    HF llama under CPU bf16 autocast, benchmarks/saved_tensors_hf_block.py). 0 when the adapters are
    in the compute dtype (fp32, bf16-true)."""
    if not adapter_input_copy_bytes(precision):
        return 0.0
    return 2.0 * split.adapters_per_layer


def adapter_input_copy_bytes(precision: str) -> float:
    """`activation_delta_bytes`' `input_copy_bytes` for a precision: PEFT casts each adapter's input to
    the fp32 adapters' dtype and 16-bit autocast casts it back for the matmul, so each adapter keeps its
    own 2-byte copy under mixed 16-bit precision; 0 when adapters and activations share a dtype."""
    return 2.0 if precision in ("bf16", "fp16", "fp8") else 0.0


def comm_and_transient_bytes(split: FinetuneSplit, spec, pc: ParamCount, zero_stage: int, shard: int,
                             blocks_per_unit: int = 1) -> float:
    """Communication buffers of a fine-tune plus QLoRA's transient bf16 weight.

    DDP buckets only the adapters' gradients (at most its two 25 MiB buckets); Megatron-Core's buckets
    are views into its contiguous main_grad buffer, which the gradients count (`memory.comm_buffer_bytes`);
    ZeRO-3 of the base gathers two units (current + prefetched) in their stored format (NF4 blocks for
    QLoRA: FSDP2 gathers `NF4Tensor`'s inner tensors, torchao `fsdp_pre_all_gather`); a unit is
    `blocks_per_unit` blocks under `parallel.fsdp_unit_mb`."""
    lay, work = spec.layout, spec.workload
    tp = max(1, lay.tp)
    base = frozen_weight_bytes(work.precision, amp_base(spec))
    buffers = 0.0
    if zero_stage >= 3 or lay.offload == "params":  # as `memory.comm_buffer_bytes`: two units in flight
        layer_bytes = ((pc.per_layer - split.quantized_per_layer) * base
                       + split.quantized_per_layer * (NF4_BYTES_PER_PARAM if split.method == "qlora" else base))
        ends = max(pc.embedding, pc.output_head) * base
        buffers = 2.0 * max(layer_bytes * blocks_per_unit, ends) / tp
    elif lay.dp > 1 and split.adapters != "megatron":
        grads = split.trainable_params / tp * adapter_state_bytes(work.precision, work.optimizer).grad
        buffers = min(2.0 * mem.DDP_BUCKET_BYTES, grads)
    return buffers + split.largest_dequantized_bytes / tp


# --------------------------------------------------------------------------- FLOPs


def finetune_flops(spec: ModelSpec, pc: ParamCount, split: FinetuneSplit, seq_len: int, recompute: str,
                   units: float):
    """FLOPs of a LoRA/QLoRA run by the convention in the module docstring (FLOPs really run)."""
    from flopwise.plan import recompute_modules
    from flopwise.plan.flops import (
        FlopsEstimate, attention_dim, attention_flops_forward, matmul_params, module_recompute_flops, pf_days,
        six_n_d,
    )

    n = matmul_params(spec, pc)
    adapters = spec.n_layers * active_adapter_params_per_layer(spec, split.rank, split.targets,
                                                                split.adapters == "megatron")
    attn_fwd = attention_flops_forward(spec.n_layers, seq_len, attention_dim(spec), attention_work_share(spec, seq_len))
    dense = 4.0 * n + 6.0 * adapters
    model = dense + 3.0 * attn_fwd
    forward = 2.0 * n + 2.0 * adapters + attn_fwd
    share = mem.recompute_forward_fraction(recompute)
    if recompute == "selective":
        hardware = model + attn_fwd
    elif (modules := recompute_modules.parse(recompute)) is not None:  # the frozen base's modules re-run
        hardware = model + module_recompute_flops(spec, pc, modules, attn_fwd)
    else:
        hardware = model + share * forward
    return FlopsEstimate("token", float(n), dense, 3.0 * attn_fwd, model, hardware, units, model * units,
                         hardware * units, pf_days(model * units), six_n_d(pc.active_non_embedding, units))


# --------------------------------------------------------------------------- time


def layer_times(layer, spec, rates):
    """One layer's times for a fine-tune: the base's weight-gradient GEMMs dropped (the base's forward
    and input-gradient GEMMs stay, at their tensor-parallel shapes), the adapters' own GEMMs and
    element-wise work added, and QLoRA's dequantisation (read NF4, write bf16) once per forward,
    backward and recompute of each base linear, as memory-bound work (torchao `LinearNF4`).

    Under tensor parallelism each adapter GEMM has one dimension split over t, as
    `ParallelLinearAdapter` splits the factors (module docstring): on a column-parallel base
    x·Aᵀ is T × r/t × d_in and its product with Bᵀ T × d_out/t × r; on a row-parallel base
    T × r × d_in/t and T × d_out/t × r. Megatron-Core's adapters run in 16 bits under fp8."""
    split = split_of(spec)
    if split is None:
        return layer
    from flopwise.plan.ops import full_recompute_share

    lay, work, model = spec.layout, spec.workload, spec.model
    tp = max(1, lay.tp)
    tokens = local_seq_len(spec) * lay.micro_batch_size  # a rank's tokens (context parallelism splits them)
    e = 4.0 if work.precision in ("fp32", "tf32") else 2.0
    adapter_rates = rates.sixteen_bit() if split.adapters == "megatron" else rates
    r = split.rank
    fwd = dgrad = wgrad = 0.0
    elementwise_fwd = elementwise_bwd = 0.0
    targets = split_targets(model, split)
    for m in targets:
        rows = max(1, round(tokens * routed_share(model, m)))  # tokens through one copy (an expert: T·k/E)
        d_out = max(1, m.d_out // tp)
        if m.name in COLUMN_PARALLEL:
            a_shape = (max(1, -(-r // tp)), m.d_in)
        else:
            a_shape = (r, max(1, m.d_in // tp))
        for n, k in (a_shape, (d_out, r)):  # x·Aᵀ (T × r), then its product with Bᵀ (T × d_out)
            fwd += adapter_rates.gemm_seconds(rows, n, k, float(m.count), e)
            dgrad += adapter_rates.gemm_seconds(rows, k, n, float(m.count), e)
            wgrad += adapter_rates.gemm_seconds(k, n, rows, float(m.count), e)
        # forward: the scaling (read, write) and the add into the base output (read 2, write 1);
        # backward: the scaling of the incoming gradient (read, write)
        elementwise_fwd += m.count * rows * d_out * e * 5.0
        elementwise_bwd += m.count * rows * d_out * e * 2.0
    adapters_fwd = fwd + rates.memory_seconds(elementwise_fwd, 2 * len(targets))
    adapters_bwd = dgrad + wgrad + rates.memory_seconds(elementwise_bwd, len(targets))
    dequant = 0.0
    if split.method == "qlora":
        written = frozen_weight_bytes(work.precision)  # the copy in the compute dtype (bf16: 2 bytes)
        dequant = rates.memory_seconds(split.quantized_per_layer * (NF4_BYTES_PER_PARAM + written),
                                       len(block_linears(model))) * dequant_factor(spec)
    share = full_recompute_share(lay.recompute)
    return dataclasses.replace(
        layer,
        forward=layer.forward + adapters_fwd + dequant,
        backward=layer.backward - layer.wgrad + adapters_bwd + dequant,
        recompute=layer.recompute + share * (adapters_fwd + dequant),
        gemm=layer.gemm - layer.wgrad + (1.0 + share) * fwd + dgrad + wgrad,
        memory_bound=layer.memory_bound + (1.0 + share) * (adapters_fwd - fwd + dequant)
        + (adapters_bwd - dgrad - wgrad) + dequant,
        wgrad=wgrad,
        forward_gemm=layer.forward_gemm + fwd,
        # the frozen shared expert computes no weight gradient
        shared_up=(*layer.shared_up[:2], 0.0), shared_down=(*layer.shared_down[:2], 0.0),
    )


def adapter_tp_collectives(spec, dtype_bytes: float) -> tuple[tuple, tuple]:
    """(forward, backward) collectives the adapters of one block add per micro-batch on a TP rank, as
    (kind, full-buffer bytes) for `timing`; none without tensor parallelism.

    `ParallelLinearAdapter` (module docstring): on a column-parallel base, A's T × r/t output is
    all-gathered in the forward and B's input gradient (T × r, partial on each rank) all-reduced in the
    backward; A's own input gradient joins the norm output's gradient, which TE reduce-scatters with the
    base's under sequence parallelism and which is all-reduced alone without it (T × h). On a
    row-parallel base A's partial T × r output is all-reduced, B's T × h/t output all-gathered (the
    forward), B's input gradient all-reduced and, under sequence parallelism, the gradient of the
    scattered output all-gathered (the backward). Routed experts' adapters (the token dispatcher's
    business) are left out."""
    split = split_of(spec)
    lay = spec.layout
    if split is None or lay.tp <= 1:
        return (), ()
    sp = lay.sequence_parallel
    tokens = local_seq_len(spec) * lay.micro_batch_size
    low_rank = ("all_reduce", tokens * split.rank * dtype_bytes)
    forward, backward = [], []
    for m in split_targets(spec.model, split):
        if m.count > 1:
            continue
        if m.name in COLUMN_PARALLEL:
            forward.append(("all_gather", tokens * split.rank * dtype_bytes))
            backward.append(low_rank)
            if not sp:
                backward.append(("all_reduce", tokens * m.d_in * dtype_bytes))
        else:
            forward += [low_rank, ("all_gather", tokens * m.d_out * dtype_bytes)]
            backward.append(low_rank)
            if sp:
                backward.append(("all_gather", tokens * m.d_out * dtype_bytes))
    return tuple(forward), tuple(backward)


EAGER_NF4_DEQUANT_FACTOR = 23.8
"""How much slower torchao's eager `NF4Tensor` dequantisation is than the fused pass the plan
charges (read 0.516 + write 2 bytes per weight at the device's bandwidth): 0.72 ms for one
4096 × 11008 weight on an H200 against 0.030 ms planned; QLoRA layers measured 6.4 ms slower than
LoRA layers per Llama 2 7B layer at 2048 tokens, 22x the planned 0.29 ms (torch 2.11, torchao
0.18, 2026-12-04; benchmarks/results/lora_layer_gpu.json). Eager PyTorch materialises int64
indices, a gather and a stack per weight; bitsandbytes' CUDA kernel or torch.compile fuses them."""


def eager_dequant(spec) -> bool:
    """Whether the run dequantises its NF4 base eagerly: flopwise's own trainer (the `flopwise` stack)
    without `training.compile` (plan `--compile`) runs torchao's `NF4Tensor` eagerly; bitsandbytes'
    CUDA kernel (PEFT, litgpt) and torchao under torch.compile (torchtune's recipes) fuse it."""
    return spec.stack == "flopwise" and not spec.layout.compiled


def dequant_factor(spec) -> float:
    """The dequantisation's time over the fused pass: `EAGER_NF4_DEQUANT_FACTOR` when eager, else 1."""
    return EAGER_NF4_DEQUANT_FACTOR if eager_dequant(spec) else 1.0


def dequant_seconds_per_step(spec, rates, fused: bool = False) -> float:
    """Seconds of QLoRA's dequantisation in one optimizer step on one device (0 for LoRA): as the run
    dequantises (`eager_dequant`), or the fused pass when `fused`."""
    split = split_of(spec)
    if split is None or split.method != "qlora":
        return 0.0
    from flopwise.plan.ops import full_recompute_share

    lay, model = spec.layout, spec.model
    written = frozen_weight_bytes(spec.workload.precision)
    per_pass = rates.memory_seconds(split.quantized_per_layer * (NF4_BYTES_PER_PARAM + written),
                                    len(block_linears(model)))
    passes = 2.0 + full_recompute_share(lay.recompute)
    seconds = per_pass * passes * model.n_layers / max(1, lay.pp) * lay.grad_accum
    return seconds if fused else seconds * dequant_factor(spec)


def time_warnings(spec, rates, step_seconds: float) -> list[str]:
    """What the plan's time assumes for a QLoRA run, with the measured cost of the other choice."""
    fused = dequant_seconds_per_step(spec, rates, fused=True)
    if not fused or not step_seconds:
        return []
    extra = (EAGER_NF4_DEQUANT_FACTOR - 1.0) * fused
    if eager_dequant(spec):
        return [f"QLoRA time assumes torchao's eager NF4 dequantisation, as flopwise train runs it without "
                f"training.compile: {fused * EAGER_NF4_DEQUANT_FACTOR:,.2f} s per step ({EAGER_NF4_DEQUANT_FACTOR:g}x "
                f"the fused pass, measured on an H200); a fused one (training.compile=true, plan --compile; "
                f"bitsandbytes' kernel) would save {extra:,.1f} s per step ({extra / step_seconds:.0%})"]
    return [f"QLoRA time assumes a fused NF4 dequantisation (bitsandbytes' kernel, or torchao under "
            f"torch.compile): {fused:,.2f} s per step; torchao's eager NF4Tensor measured "
            f"{EAGER_NF4_DEQUANT_FACTOR:g}x that on an H200, which would add {extra:,.1f} s per step "
            f"(+{extra / step_seconds:.0%})"]


def end_times(ends, spec, rates):
    """Embedding and head times of a fine-tune: the frozen embedding has no backward, the frozen
    head no weight-gradient GEMM (its input gradient still runs)."""
    if split_of(spec) is None:
        return ends
    lay, work, model = spec.layout, spec.workload, spec.model
    tp = max(1, lay.tp)
    e = 4.0 if work.precision in ("fp32", "tf32") else 2.0
    tokens = local_seq_len(spec) * lay.micro_batch_size  # a rank's tokens (context parallelism splits them)
    hs = model.hidden / tp if (lay.sequence_parallel and tp > 1) else float(model.hidden)
    embedding = rates.memory_seconds(tokens * hs * e * 2, 1)
    head_wgrad = rates.gemm_seconds(model.hidden, max(1, model.vocab_size // tp), tokens, 1.0, e)
    return dataclasses.replace(ends, embedding=embedding, head=max(0.0, ends.head - head_wgrad))


def step_inputs(inputs, split: FinetuneSplit, spec, pc: ParamCount, sb: mem.StateBytes):
    """The step model's sizes for a fine-tune: the optimizer and the gradient reduction see only
    the adapters; ZeRO-3 still gathers the frozen base (in its stored bytes) every pass."""
    lay = spec.layout
    ranks = max(1, lay.tp * lay.pp)
    return dataclasses.replace(inputs, params_per_rank=split.trainable_params / ranks,
                               frozen_gather_bytes=split.frozen_bytes / ranks,
                               trainable_fraction=split.trainable_params / pc.total if pc.total else 1.0)


# --------------------------------------------------------------------------- output


def split_json(spec) -> dict:
    """The `finetune` section of `plan --json`: the method, and for LoRA/QLoRA the split."""
    split = split_of(spec)
    return {"method": "full"} if split is None else split.to_dict()


def summary_rows(split: FinetuneSplit, memory, grad_dtype: str = "fp32") -> list[tuple[str, str]]:
    """The fine-tune's own lines for `plan`: method, trainable parameters, frozen base bytes;
    `grad_dtype` names Megatron's main grads, kept in the dtype the stack reduces them in."""
    gib = mem.GIB
    rows = [("method", f"{split.method} (rank {split.rank}, targets {split.targets})"),
            ("trainable parameters", f"{split.trainable_params / 1e6:,.1f}M ({split.trainable_share:.2%} of "
                                     f"{(split.trainable_params + split.frozen_params) / 1e9:,.2f}B)"),
            ("frozen base (whole model)", f"{split.frozen_bytes / gib:,.2f} GiB"
             + (f" ({split.quantized_params / 1e9:,.2f}B weights in NF4 at {NF4_BYTES_PER_PARAM:.4f} B/param, "
                "embeddings, norms and head in bf16)" if split.method == "qlora" else "")),
            ("FLOPs / token counted", "4N + 6·adapters + attention (no base weight gradients)"),
            ("fits", "yes" if memory.fits else "no")]
    if split.adapters == "megatron":
        rows.insert(1, ("adapters", "Megatron-Core ParallelLinearAdapter: one on the fused qkv and fc1, "
                                    f"A and B split over tp, bf16 with {grad_dtype} main grads"))
    if split.method == "qlora":
        rows.insert(3, ("dequantised bf16 weight (transient)", f"{split.largest_dequantized_bytes / gib:,.3f} GiB"))
    return rows


# --------------------------------------------------------------------------- inputs and defaults


DEFAULT_FINETUNE_TOKENS = 1e9
"""Tokens a fine-tune is planned for when none are given: 1B, the scale of instruction-tuning
sets (QLoRA's OASST1 is ~10M tokens per epoch, FLAN v2 subsets ~1B); an assumption, said in the plan."""


def default_tokens(method: str, pretraining_default: float | str) -> float | str:
    """`--tokens` when none is given: 1B for a fine-tune (`method` lora, qlora, or full-finetune: a stated
    `--finetune full`), the pre-training example for "full" (training from scratch)."""
    return pretraining_default if method == "full" else DEFAULT_FINETUNE_TOKENS


def model_parallel_refusal(method: str, stack: str) -> str | None:
    """Why a `method` fine-tune under `stack` cannot be planned with tensor or pipeline parallelism, or
    None where a stack runs it (module docstring: Megatron-Core's LoRA; no stack's QLoRA)."""
    if method == "qlora":
        return ("--finetune qlora is planned with data parallelism only (bitsandbytes, torchao and NeMo store "
                "NF4 bases unsplit: NeMo's NF4LinearWrapper does not support tensor parallelism): drop --tp/--pp")
    if method == "lora" and adapter_style(stack) != "megatron":
        return (f"--finetune lora under --tp/--pp is planned as Megatron-Core runs it (--stack nemo); the {stack} "
                "stack trains adapters with data parallelism only (single, DDP or FSDP2): drop --tp/--pp or "
                "give --stack nemo")
    return None


def validate_workload(work, layout=None, model: ModelSpec | None = None, stack: str = "flopwise") -> None:
    """One line for a fine-tune no run could have: unknown method or targets, rank < 1, dropout outside
    [0, 1), or tensor/pipeline parallelism where no stack runs it (`model_parallel_refusal`)."""
    method = getattr(work, "finetune", "full")
    if method not in FINETUNE_METHODS:
        raise UserError(f"--finetune '{method}' is not one of {', '.join(FINETUNE_METHODS)}")
    if method == "full":
        return
    if model is not None and model.arch == "cnn":
        raise UserError(f"--finetune {method}: LoRA/QLoRA adapters are planned for transformers, not {model.key}")
    if layout is not None and (layout.tp > 1 or layout.pp > 1):
        refusal = model_parallel_refusal(method, stack)
        if refusal:
            raise UserError(refusal)
    named_targets(work.lora_targets)  # an unknown module name: one clear error
    if model is not None and not target_matrices(model, work.lora_targets):
        raise UserError(f"--lora-targets {work.lora_targets}: {model.key} has no such linear (its block's: "
                        f"{', '.join(m.name for m in block_linears(model))})")
    if work.lora_rank < 1:
        raise UserError(f"--lora-rank must be >= 1, got {work.lora_rank}")
    if getattr(work, "precision", None) == "fp8":
        if method == "qlora":
            raise UserError("--finetune qlora --precision fp8: the NF4 base is dequantised to bf16 for every GEMM, "
                            "so no stack runs a QLoRA in fp8; plan --precision bf16 (or LoRA under --stack nemo)")
        if adapter_style(stack) != "megatron":
            raise UserError(f"--finetune lora --precision fp8: the {stack} stack fine-tunes adapters in 16 bits "
                            "(its fp8 is for full training); plan --precision bf16, or --stack nemo, whose "
                            "Megatron-Core LoRA runs the frozen base's GEMMs in fp8")
    if not 0.0 <= work.lora_dropout < 1.0:
        raise UserError(f"--lora-dropout must be in [0, 1), got {work.lora_dropout}")


def recompute_if_needed(spec, evaluate, choose_zero: bool, with_chosen_zero):
    """A fine-tune that does not fit without recompute, or fits by less than the memory forecast's own
    error (`band.memory_band`) where full recompute leaves that room, is planned with full recompute
    (gradient checkpointing, as QLoRA §4 and torchtune's recipes run), the reason kept in the plan's
    defaults."""
    from flopwise.plan.band import memory_band

    first = evaluate(spec)
    band = memory_band()
    if first.fits and first.memory.allocated_bytes <= (1 - band) * first.memory.capacity_bytes:
        return spec
    alt = dataclasses.replace(spec, layout=dataclasses.replace(spec.layout, recompute="full"))
    if choose_zero:
        alt = with_chosen_zero(alt)
    need = first.memory.allocated_bytes / mem.GIB
    usable = first.memory.capacity_bytes / mem.GIB
    if first.fits:  # it fits, but closer to the edge than the forecast can tell apart from not fitting
        second = evaluate(alt)
        if not (second.fits and second.memory.allocated_bytes <= (1 - band) * second.memory.capacity_bytes):
            return spec
        reason = (f"recompute full: without recompute this fine-tune needs {need:,.1f} GiB of {usable:,.1f} GiB "
                  f"usable, inside the memory forecast's ± {band:.0%}")
    else:
        reason = f"recompute full: without recompute this fine-tune needs {need:,.1f} GiB of {usable:,.1f} GiB usable"
    extra = {**alt.cluster.extra, "defaults": (*alt.cluster.extra.get("defaults", ()), reason)}
    return dataclasses.replace(alt, cluster=dataclasses.replace(alt.cluster, extra=extra))


def default_notes(tokens_defaulted: bool, batch_defaulted: bool, seq_defaulted: int | None = None) -> tuple[str, ...]:
    """The fine-tune defaults a plan used, one line each (shown as `default:` lines); `seq_defaulted`,
    the sequence length a LoRA / QLoRA took by default."""
    notes = []
    if seq_defaulted is not None:
        notes.append(f"seq {seq_defaulted}: a fine-tune's default, the model's context capped at "
                     f"{FINETUNE_SEQ_LEN_CAP} as `flopwise train` windows it (give --seq-len)")
    if tokens_defaulted:
        notes.append(f"tokens {DEFAULT_FINETUNE_TOKENS / 1e9:g}B: a fine-tune's default (give --tokens)")
    if batch_defaulted:
        notes.append(f"batch {DEFAULT_FINETUNE_BATCH_TOKENS:,} tokens per step: a fine-tune's default "
                     "(give --batch-tokens or --global-batch)")
    return tuple(notes)


# --------------------------------------------------------------------------- from a training config

def config_fields(section) -> dict:
    """Workload fields from a training config's `finetune:` section (keys `method`, `rank`, `dropout`,
    `target_modules`; `alpha` scales the update and costs nothing); {} when there is none.
    A target list is planned as the block matrices its module names adapt (`named_targets`)."""
    if section is None:
        return {}
    method = _field(section, "method", "full")
    if method in (None, "none", "full"):
        return {}
    targets = named_targets(_field(section, "target_modules", "all-linear"), key="finetune.target_modules")
    return {"finetune": method, "lora_rank": int(_field(section, "rank", DEFAULT_LORA_RANK)),
            "lora_targets": targets,
            "lora_dropout": float(_field(section, "dropout", 0.0) or 0.0)}


def _field(section, name: str, default):
    """A key of a config section given as a pydantic model or a plain mapping."""
    if isinstance(section, dict):
        return section.get(name, default)
    return getattr(section, name, default)
