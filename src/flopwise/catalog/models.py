"""Model catalog: `specs/models.yaml` and HuggingFace `config.json` files as `ModelSpec`s.

`load_models()` reads the packaged catalog, `get_model()` resolves a catalog key or a
path to a `config.json`, and `from_hf_config()` turns a HuggingFace config into the
architecture numbers, offline and without importing transformers or running any code
from the checkpoint (plain JSON, per-family defaults copied from transformers).
No torch here: the planner imports this module.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, fields
from functools import lru_cache
from importlib import resources
from pathlib import Path

import yaml

from flopwise.catalog.names import spelled
from flopwise.errors import UserError

ARCHS = ("decoder", "encoder", "cnn")
MLPS = ("gelu", "relu", "swiglu")
NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("learned", "rope", "alibi", "none")


@dataclass(frozen=True)
class ModelSpec:
    """The architecture numbers the planner needs; nothing about how it is trained.

    `arch` is "decoder" (causal LM), "encoder" (BERT-style) or "cnn". For a CNN only
    `params` and `flops_per_sample` (forward, per sample) are meaningful, and the planner
    plans per sample rather than per token.

    Multi-head latent attention (MLA; DeepSeek-AI 2024, "DeepSeek-V2", §2.1) is set by
    `kv_lora_rank` > 0: each head's query and key are `qk_nope_head_dim` + `qk_rope_head_dim`
    wide, its value `v_head_dim`, and `head_dim` / `n_kv_heads` are unused.

    A fine-grained MoE whose first `dense_layers` blocks keep a dense MLP (DeepSeek-V3's first
    3 of 61) is counted exactly (every parameter, so weights, gradients and optimizer states),
    while step time and activations treat every block as an MoE block: DeepSeek sizes the
    dense MLP to the MoE block's active path (18432 = (8 routed + 1 shared) x 2048), so the
    per-token work is the same. `moe_layer_step` K > 1 interleaves them instead (Llama 4
    Maverick's `interleave_moe_layer_step` 2: blocks K-1, 2K-1, ... are MoE, the others dense), so
    `dense_layers` is then n_layers - n_layers // K and a pipeline stage holds its share of each.
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
    mlp: str = "gelu"  # "gelu" or "relu" (2 matrices) | "swiglu" (3 matrices)
    norm: str = "layernorm"  # "layernorm" (weight+bias) | "rmsnorm" (weight only)
    norm_bias: bool = True  # a LayerNorm without bias (MPT's no_bias) has a weight only
    position: str = "learned"  # "learned" | "rope" | "alibi"
    tied_embeddings: bool = False
    attn_bias: bool = False
    mlp_bias: bool = False
    n_experts: int = 1
    experts_per_token: int = 1
    type_vocab_size: int = 0  # BERT token-type embeddings
    pooler: bool = False  # BERT pooler dense layer
    embedding_norm: bool = False  # a norm right after the embeddings (BERT, BLOOM)
    head_dim: int = 0  # 0: hidden // n_heads (q and o are then hidden x hidden)
    attn_out_bias: bool | None = None  # None: same as attn_bias (qwen2: qkv bias, no o bias)
    final_norm: bool | None = None  # None: decoders have one, encoders (BERT, post-LN) do not
    norms_per_layer: int = 2  # norms inside each block (falcon-7b's parallel block has 1)
    parallel_block: bool = False  # attention and MLP read the same input and are summed (GPT-J, NeoX, PaLM)
    shared_expert_ffn_hidden: int = 0  # MoE: an always-active shared expert (qwen2_moe)
    shared_expert_gate: bool = True  # the shared expert's output is scaled by a sigmoid gate h -> 1 (qwen2_moe; DeepSeek has none)
    dense_layers: int = 0  # MoE: the first blocks have a dense MLP of dense_ffn_hidden instead (DeepSeek's first_k_dense_replace)
    dense_ffn_hidden: int = 0  # width of those dense MLPs
    qk_norm: bool = False  # RMSNorm over each head's q and k (qwen3): two head_dim weights per layer
    moe_layer_step: int = 1  # 1: the dense blocks lead; K: every K-th block is MoE, the others dense (Llama 4)
    # group-limited routing (DeepSeek-V2 §2.1.3, V3 §2.1.2): the routed experts split into `expert_groups` equal
    # groups and a token picks its experts from its best `expert_groups_per_token` of them (HF n_group /
    # topk_group; Megatron-Core moe_router_num_groups / moe_router_group_topk); 0: no limit
    expert_groups: int = 0
    expert_groups_per_token: int = 0
    kv_lora_rank: int = 0  # multi-head latent attention (DeepSeek-V2/V3) when > 0: K and V come from a latent this wide
    q_lora_rank: int = 0  # MLA: the query's latent width; 0 projects the query straight from the hidden state
    qk_nope_head_dim: int = 0  # MLA: the part of each query/key head without rotary embedding
    qk_rope_head_dim: int = 0  # MLA: the rotary part of each query head, and the one key part all heads share
    v_head_dim: int = 0  # MLA: width of each value head (and of each head of the attention output)
    # hybrid Mamba-2 / Transformer stacks (Megatron-Core's hybrid models, NVIDIA Nemotron-H): one character
    # per layer of Megatron's `hybrid_override_pattern`, each layer one mixer with its own pre-norm and residual
    hybrid_pattern: str = ""  # "M" Mamba-2 mixer, "*" self-attention, "-" MLP; n_layers is its length
    mamba_heads: int = 0  # Mamba-2: SSM heads (mamba_num_heads); the inner width is heads x mamba_head_dim
    mamba_head_dim: int = 0  # Mamba-2: channels per head (mamba_head_dim, P)
    mamba_state: int = 0  # Mamba-2: state size per group (mamba_state_dim, N)
    mamba_groups: int = 0  # Mamba-2: groups sharing one B and C (mamba_num_groups, G)
    mamba_conv: int = 4  # Mamba-2: the depthwise causal conv1d's kernel width (MambaMixer d_conv)
    mamba_chunk: int = 128  # Mamba-2: the SSD scan's chunk length (MambaMixer chunk_size)
    # sliding-window attention (Beltagy et al. 2020, "Longformer"; Mistral 7B; gpt-oss): a windowed layer's query
    # attends to the last `sliding_window` positions, itself included (transformers' sliding_window; Megatron-Core's
    # window_size (w - 1, 0)), so its score work grows with s·w instead of s²; 0: every layer attends to the whole
    # causal prefix. `window_layers` says which layers, one character per layer in transformers' `layer_types`
    # order: "S" sliding_attention, "F" full_attention (gpt-oss: "SF" repeated, Megatron's window_attn_skip_freq 2);
    # empty with a window: every layer is windowed (Mistral 7B)
    sliding_window: int = 0
    window_layers: str = ""
    attn_sinks: bool = False  # gpt-oss: a learned logit per head joins each softmax (`sinks`): n_heads parameters a layer, no matmul
    router_bias: bool = False  # gpt-oss: the MoE router's linear has a bias (GptOssTopKRouter.bias, n_experts a layer)
    reported_params: float = 0.0  # the size the source publishes (often rounded), for comparison
    params: int = 0  # CNN: total parameters (decoders/encoders derive it)
    flops_per_sample: float = 0.0  # CNN: forward FLOPs per sample
    source: str = ""


HYBRID_LAYERS = {"M": "mamba", "*": "attention", "-": "mlp"}
"""The layer symbols of Megatron-Core's hybrid pattern that flopwise plans
(megatron/core/models/hybrid/hybrid_layer_allocation.py `Symbols`); "E" (an MoE layer) is not planned."""


def is_hybrid(spec: ModelSpec) -> bool:
    """Whether the model is a hybrid stack of single-mixer layers (`hybrid_pattern`), not uniform blocks."""
    return bool(spec.hybrid_pattern)


def is_mla(spec: ModelSpec) -> bool:
    """Whether the attention is multi-head latent attention (K and V from a compressed latent)."""
    return spec.kv_lora_rank > 0


def query_key_head_dim(spec: ModelSpec) -> int:
    """Width of one head's query and key: nope + rope parts under MLA, else `head_dim`
    (hidden / heads when unset)."""
    if is_mla(spec):
        return spec.qk_nope_head_dim + spec.qk_rope_head_dim
    return spec.head_dim or spec.hidden // spec.n_heads


def value_head_dim(spec: ModelSpec) -> int:
    """Width of one head's value and attention output: `v_head_dim` under MLA, else the query's."""
    return spec.v_head_dim if is_mla(spec) else query_key_head_dim(spec)


def kv_heads(spec: ModelSpec) -> int:
    """Heads of K and V as the attention core reads them: MLA expands its latent to every head."""
    return spec.n_heads if is_mla(spec) else (spec.n_kv_heads or spec.n_heads)


WINDOW_LAYERS = {"S": "sliding_attention", "F": "full_attention"}
"""The characters of `ModelSpec.window_layers` and the transformers `layer_types` names they stand for."""


def windowed_layers(spec: ModelSpec) -> int:
    """How many layers attend through the sliding window: none without one, all when `window_layers`
    is empty, else its "S" layers."""
    if not spec.sliding_window:
        return 0
    return spec.window_layers.count("S") if spec.window_layers else spec.n_layers


def norm_tensors(spec: ModelSpec) -> int:
    """Parameter tensors of one norm, each of the hidden width: LayerNorm's weight and bias, or
    a weight alone (RMSNorm, and MPT's LayerNorm without bias)."""
    return 2 if (spec.norm == "layernorm" and spec.norm_bias) else 1


# ---------------------------------------------------------------------------------------
# The packaged catalog

_CATALOG = "models.yaml"
_REQUIRED_TRANSFORMER = ("n_layers", "hidden", "n_heads", "ffn_hidden", "vocab_size", "seq_len")
_REQUIRED_CNN = ("params", "flops_per_sample")
_CHOICES = {"arch": ARCHS, "mlp": MLPS, "norm": NORMS, "position": POSITIONS}


@lru_cache(maxsize=1)
def load_models() -> dict[str, ModelSpec]:
    """The packaged catalog, keyed by lower-case name; validated once, then cached."""
    text = resources.files("flopwise").joinpath("specs", _CATALOG).read_text(encoding="utf-8")
    return models_from_yaml(text, origin=f"flopwise/specs/{_CATALOG}")


def models_from_yaml(text: str, origin: str) -> dict[str, ModelSpec]:
    """Parse and strictly validate a models YAML document (`models: {key: {field: value}}`).

    Every problem becomes a UserError naming the file, the entry and the field, so a typo
    in the catalog fails loudly instead of silently planning with a default.
    """
    try:
        # The C loader parses the same safe subset as yaml.safe_load, several times faster.
        doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as err:
        raise UserError(f"{origin}: not valid YAML ({_first_line(err)})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("models"), dict):
        raise UserError(f"{origin}: expected a top-level 'models:' mapping of key -> fields")
    models = {}
    for key, entry in doc["models"].items():
        spec = _spec_from_entry(str(key), entry, origin)
        if spec.key in models:
            raise UserError(f"{origin}: model '{key}' appears twice (keys are case-insensitive)")
        models[spec.key] = spec
    return models


_FIELD_TYPES = {f.name: f.type for f in fields(ModelSpec)}


def _spec_from_entry(key: str, entry: object, origin: str) -> ModelSpec:
    where = f"{origin}: model '{key}'"
    if not isinstance(entry, dict):
        raise UserError(f"{where}: expected a mapping of fields, got {type(entry).__name__}")
    values: dict[str, object] = {}
    for name, value in entry.items():
        if name == "key" or name not in _FIELD_TYPES:
            known = [n for n in _FIELD_TYPES if n != "key"]
            close = difflib.get_close_matches(str(name), known, n=3)
            hint = f"did you mean: {', '.join(close)}?" if close else f"allowed: {', '.join(known)}"
            raise UserError(f"{where}: unknown field '{name}' ({hint})")
        values[name] = _checked_value(where, name, value)
    values.setdefault("name", key)
    spec = ModelSpec(key=key.lower(), **values)
    validate_spec(spec, where)
    return spec


def _checked_value(where: str, name: str, value: object) -> object:
    kind = _FIELD_TYPES[name]
    if kind in ("int", "float") and isinstance(value, str):
        # PyYAML (YAML 1.1) reads "1.3e9" as text; it needs "1.3e+9". Accept both.
        try:
            value = float(value)
        except ValueError:
            pass
    if kind == "bool" or kind == "bool | None":
        if not isinstance(value, bool) and not (kind == "bool | None" and value is None):
            raise UserError(f"{where}: field '{name}' must be true or false, got {value!r}")
        return value
    if kind == "int":
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise UserError(f"{where}: field '{name}' must be a whole number >= 0, got {value!r}")
        return value
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise UserError(f"{where}: field '{name}' must be a number >= 0, got {value!r}")
        return float(value)
    if not isinstance(value, str):
        raise UserError(f"{where}: field '{name}' must be text, got {value!r}")
    if name in _CHOICES and value not in _CHOICES[name]:
        raise UserError(f"{where}: field '{name}' is {value!r}; allowed: {', '.join(_CHOICES[name])}")
    return value


def validate_spec(spec: ModelSpec, where: str) -> None:
    """Check that a spec is complete and self-consistent; raise UserError naming the field."""
    for name, allowed in _CHOICES.items():
        if getattr(spec, name) not in allowed:
            raise UserError(f"{where}: field '{name}' is {getattr(spec, name)!r}; allowed: {', '.join(allowed)}")
    required = _REQUIRED_CNN if spec.arch == "cnn" else _REQUIRED_TRANSFORMER
    for name in required:
        if not getattr(spec, name):
            raise UserError(f"{where}: field '{name}' is required (> 0) for arch '{spec.arch}'")
    if not spec.source:
        raise UserError(f"{where}: field 'source' is required (where the numbers come from)")
    if spec.arch == "cnn":
        return
    kv = spec.n_kv_heads or spec.n_heads
    if spec.n_heads % kv:
        raise UserError(f"{where}: n_heads {spec.n_heads} is not a multiple of n_kv_heads {kv}")
    if spec.n_experts < 1 or spec.experts_per_token < 1:
        raise UserError(f"{where}: n_experts and experts_per_token must be >= 1 (1 for a dense model)")
    if spec.experts_per_token > spec.n_experts:
        raise UserError(
            f"{where}: experts_per_token {spec.experts_per_token} exceeds n_experts {spec.n_experts}"
        )
    if spec.position == "learned" and spec.max_positions < 1:
        raise UserError(f"{where}: field 'max_positions' is required for learned positions")
    _validate_mla(spec, where)
    _validate_dense_layers(spec, where)
    _validate_expert_groups(spec, where)
    _validate_hybrid(spec, where)
    _validate_window(spec, where)


def _validate_window(spec: ModelSpec, where: str) -> None:
    """A window of at least one key; a layer pattern of "S" and "F", one per layer, that needs a window;
    planned for uniform decoders (a hybrid stack's attention layers take no window)."""
    if spec.sliding_window < 0:
        raise UserError(f"{where}: sliding_window must be >= 0 (0: no window), got {spec.sliding_window}")
    if not spec.window_layers:
        if spec.sliding_window and (spec.hybrid_pattern or spec.arch != "decoder"):
            raise UserError(f"{where}: sliding_window is planned for decoders of uniform blocks (no hybrid_pattern)")
        return
    if not spec.sliding_window:
        raise UserError(f"{where}: field 'window_layers' needs sliding_window > 0 (the window its 'S' layers use)")
    unknown = sorted(set(spec.window_layers) - set(WINDOW_LAYERS))
    if unknown:
        raise UserError(f"{where}: window_layers has {', '.join(repr(c) for c in unknown)}; planned: "
                        "'S' sliding_attention, 'F' full_attention")
    if len(spec.window_layers) != spec.n_layers:
        raise UserError(f"{where}: window_layers has {len(spec.window_layers)} layers, n_layers says {spec.n_layers}")
    if spec.hybrid_pattern or spec.arch != "decoder":
        raise UserError(f"{where}: sliding_window is planned for decoders of uniform blocks (no hybrid_pattern)")


_MAMBA_DIMS = ("mamba_heads", "mamba_head_dim", "mamba_state", "mamba_groups")


def _validate_hybrid(spec: ModelSpec, where: str) -> None:
    """A hybrid pattern of planned symbols, one per layer; the Mamba-2 widths its "M" layers need; and
    none of the uniform-block options the layer mix does not model (MoE, MLA, parallel blocks)."""
    if not spec.hybrid_pattern:
        for name in _MAMBA_DIMS:
            if getattr(spec, name):
                raise UserError(f"{where}: field '{name}' needs hybrid_pattern (the layers that are Mamba-2 mixers)")
        return
    unknown = sorted(set(spec.hybrid_pattern) - set(HYBRID_LAYERS))
    if unknown:
        what = "MoE layers ('E')" if unknown == ["E"] else f"symbols {', '.join(repr(c) for c in unknown)}"
        raise UserError(f"{where}: hybrid_pattern has {what}; planned: 'M' Mamba-2, '*' attention, '-' MLP")
    if len(spec.hybrid_pattern) != spec.n_layers:
        raise UserError(f"{where}: hybrid_pattern has {len(spec.hybrid_pattern)} layers, n_layers says {spec.n_layers}")
    if spec.norms_per_layer != 1:
        raise UserError(f"{where}: a hybrid layer holds one mixer and its one pre-norm: norms_per_layer must be 1")
    if spec.n_experts > 1 or is_mla(spec) or spec.parallel_block or spec.qk_norm or spec.arch != "decoder":
        raise UserError(f"{where}: hybrid_pattern is planned for decoders with dense MLPs and standard attention")
    if "M" in spec.hybrid_pattern:
        for name in _MAMBA_DIMS + ("mamba_conv", "mamba_chunk"):
            if not getattr(spec, name):
                raise UserError(f"{where}: field '{name}' is required (> 0) with Mamba-2 layers ('M') in hybrid_pattern")
        if spec.mamba_heads % spec.mamba_groups:
            raise UserError(f"{where}: mamba_heads {spec.mamba_heads} is not a multiple of mamba_groups "
                            f"{spec.mamba_groups}")


def _validate_mla(spec: ModelSpec, where: str) -> None:
    """MLA needs all its head widths; its fields without kv_lora_rank would be silently ignored."""
    if not is_mla(spec):
        for name in ("q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if getattr(spec, name):
                raise UserError(f"{where}: field '{name}' needs kv_lora_rank > 0 (multi-head latent attention)")
        return
    for name in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        if not getattr(spec, name):
            raise UserError(f"{where}: field '{name}' is required (> 0) with kv_lora_rank (multi-head latent attention)")


def _validate_dense_layers(spec: ModelSpec, where: str) -> None:
    """Leading dense blocks make sense only in an MoE that keeps at least one MoE block."""
    if not spec.dense_layers and not spec.dense_ffn_hidden:
        return
    if spec.n_experts <= 1:
        raise UserError(f"{where}: field 'dense_layers' is for MoE models (n_experts > 1)")
    if not spec.dense_layers or not spec.dense_ffn_hidden:
        raise UserError(f"{where}: fields 'dense_layers' and 'dense_ffn_hidden' go together (both > 0)")
    if spec.dense_layers >= spec.n_layers:
        raise UserError(f"{where}: dense_layers {spec.dense_layers} leaves no MoE block of {spec.n_layers}")
    step = spec.moe_layer_step
    if step < 1 or (step > 1 and spec.dense_layers != spec.n_layers - spec.n_layers // step):
        raise UserError(f"{where}: moe_layer_step {step} makes {spec.n_layers - spec.n_layers // max(step, 1)} of "
                        f"{spec.n_layers} blocks dense; dense_layers says {spec.dense_layers}")


def _validate_expert_groups(spec: ModelSpec, where: str) -> None:
    """Group-limited routing needs both numbers, groups that split the experts evenly and enough
    experts in the groups a token may use for its k."""
    groups, chosen = spec.expert_groups, spec.expert_groups_per_token
    if not groups and not chosen:
        return
    if not groups or not chosen:
        raise UserError(f"{where}: fields 'expert_groups' and 'expert_groups_per_token' go together (both > 0)")
    if spec.n_experts <= 1 or spec.n_experts % groups:
        raise UserError(f"{where}: expert_groups {groups} does not divide the {spec.n_experts} routed experts")
    if chosen > groups or chosen * spec.n_experts // groups < spec.experts_per_token:
        raise UserError(f"{where}: expert_groups_per_token {chosen} of {groups} groups leaves fewer than "
                        f"experts_per_token {spec.experts_per_token} experts to route to")


def get_model(name_or_path: str) -> ModelSpec:
    """Resolve a catalog key (any case) or a path to a HuggingFace config.json / its folder.

    Unknown names fail with the closest catalog keys, so a typo is one re-run away.
    """
    catalog = load_models()
    key = name_or_path.strip().lower()
    if key in catalog:
        return catalog[key]
    path = Path(name_or_path).expanduser()
    if path.exists():
        return from_hf_config(path)
    spelled = catalog_key(name_or_path)
    if spelled is not None:
        return catalog[spelled]
    if "/" in name_or_path or "\\" in name_or_path or key.endswith(".json"):
        raise UserError(f"{name_or_path}: no such file or folder (expected a HuggingFace config.json)")
    close = difflib.get_close_matches(key, list(catalog), n=4, cutoff=0.5)
    hint = f"did you mean: {', '.join(close)}?" if close else "see `flopwise models` for the list"
    raise UserError(f"unknown model '{name_or_path}': not a catalog key or a path; {hint}")


NAMES = {
    # the Hub's names for GPT-2 (openai-community/gpt2 ...) and the GPT-3 paper's (Brown et al. 2020,
    # Table 2.1: Small ... XL); Llama 3's 405B was released as 3.1 only
    "gpt2": "gpt2-124m", "gpt2-small": "gpt2-124m", "gpt2-medium": "gpt2-355m", "gpt2-large": "gpt2-774m",
    "gpt2-xl": "gpt2-1.5b",
    "gpt3-small": "gpt3-125m", "gpt3-medium": "gpt3-350m", "gpt3-large": "gpt3-760m", "gpt3-xl": "gpt3-1.3b",
    # flash-attention's trainer names its experiments by these (training/configs/experiment/owt/gpt2s-flash.yaml,
    # pile/gpt3xl-flash.yaml ...: GPT-2 shapes at 1,024 tokens, the GPT-3 paper's at 2,048)
    "gpt2s": "gpt2-124m", "gpt2m": "gpt2-355m", "gpt2l": "gpt2-774m", "gpt2xl": "gpt2-1.5b",
    "gpt3s": "gpt3-125m", "gpt3m": "gpt3-350m", "gpt3l": "gpt3-760m", "gpt3xl": "gpt3-1.3b",
    # Llama 3.3 70B is Llama 3.1 70B's architecture (meta-llama/Llama-3.3-70B-Instruct config.json)
    "llama3-405b": "llama3.1-405b", "llama3.3-70b": "llama3.1-70b", "bloom": "bloom-176b",
    # the Hub's Nemotron-H repositories (nvidia/Nemotron-H-8B-Base-8K ...); NeMo's recipes say nemotronh 8b
    "nemotron-h-8b-base-8k": "nemotron-h-8b", "nemotron-h-47b-base-8k": "nemotron-h-47b",
    "nemotron-h-56b-base-8k": "nemotron-h-56b",
}
"""Names the sources use for catalog models that the catalog's key does not spell (compared without
separators: "GPT-3 XL", "gpt3-xl" and "gpt3xl" are one name)."""
_SQUASHED_NAMES = {name.replace("-", ""): key.replace("-", "") for name, key in NAMES.items()}

_SUFFIXES = ("-hf", "-base", "-instruct", "-chat", "-v0.1", "-v0.2", "-v0.3")
"""Hub repository suffixes that name the same architecture (weights format, tuned variants)."""


def _squashed(name: str) -> str:
    """A model name without its Hub organisation, tuned-variant suffixes, the "meta-" of Meta's
    repositories and separators: "meta-llama/Llama-2-7b-hf", "Llama 2 7B" and "llama2-7b" agree."""
    text = spelled(name).rsplit("/", 1)[-1]
    trimmed = True
    while trimmed:
        trimmed = False
        for suffix in _SUFFIXES:
            if text.endswith(suffix):
                text, trimmed = text[: -len(suffix)], True
    text = text.removeprefix("meta-").replace("-", "")
    return _SQUASHED_NAMES.get(text, text)


@lru_cache(maxsize=1)
def _squashed_index() -> dict[str, str]:
    index: dict[str, str | None] = {}
    models = load_models()
    for key in models:
        squashed = _squashed(key)
        index[squashed] = None if index.get(squashed, key) != key else key  # two keys alike: neither
    for key, spec in models.items():  # the catalog's own display names ("Llama 4 Scout 17B-16E")
        squashed = _squashed(spec.name)
        if squashed not in index:
            index[squashed] = key
        elif index[squashed] not in (key, None) and _squashed(index[squashed]) != squashed:
            index[squashed] = None  # two models' display names alike, neither a key: neither
    for name, key in NAMES.items():
        index[_squashed(name)] = key
    return {name: key for name, key in index.items() if key is not None}


def catalog_key(name: str) -> str | None:
    """The catalog key a model's name as papers and the Hub print it stands for ("Llama-2-7B",
    "meta-llama/Meta-Llama-3-70B", "GPT-3 175B", "gpt2-xl"), or None."""
    return _squashed_index().get(_squashed(name))


def _first_line(err: Exception) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


# ---------------------------------------------------------------------------------------
# HuggingFace config.json
#
# Each reader mirrors the weight shapes of the family's `modeling_*.py` in transformers
# (5.x) and its config defaults, so the counts match a model built from the same file.


class _HFConfig:
    """A config.json's dict that reports a missing required key with the file's name."""

    def __init__(self, data: dict, path: Path):
        self.data = data
        self.path = path

    def need(self, *names: str) -> int:
        """The first present key among `names` (aliases), as an int; UserError if absent."""
        for name in names:
            value = self.data.get(name)
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, int):
                    raise UserError(f"{self.path}: key '{name}' must be a whole number, got {value!r}")
                return value
        raise UserError(f"{self.path}: missing key '{names[0]}' (needed for model_type '{self.model_type}')")

    def get(self, name: str, default: object) -> object:
        """An optional key, with the family's transformers default when absent or null."""
        value = self.data.get(name)
        return default if value is None else value

    def get_int(self, name: str, default: int) -> int:
        """An optional whole-number key (transformers default when absent); UserError if not a number."""
        value = self.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(f"{self.path}: key '{name}' must be a whole number, got {value!r}")
        return value

    def get_bool(self, name: str, default: bool) -> bool:
        """An optional true/false key (transformers default when absent); UserError otherwise."""
        value = self.get(name, default)
        if not isinstance(value, bool):
            raise UserError(f"{self.path}: key '{name}' must be true or false, got {value!r}")
        return value

    @property
    def model_type(self) -> str:
        return str(self.data.get("model_type", ""))


def from_hf_config(path: str | Path, seq_len: int | None = None) -> ModelSpec:
    """Read a HuggingFace `config.json` (or a folder holding one) offline into a ModelSpec.

    Plain JSON: no transformers import, no `trust_remote_code`. Families: llama, mistral,
    mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, llama4, deepseek_v2, deepseek_v3, kimi_k2, gpt_oss, gpt2,
    gpt_neox, bert, opt, bloom, falcon, mpt, nemotron, nemotron_h. A config does not record the training context, so
    `seq_len` defaults to the longest supported one (`max_position_embeddings`); pass the run's
    sequence length to override it.
    """
    path = Path(path).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise UserError(f"{path}: no such file (expected a HuggingFace config.json)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: cannot read ({_first_line(err)})") from None
    except json.JSONDecodeError as err:
        raise UserError(f"{path}: not valid JSON ({err.msg} at line {err.lineno}, column {err.colno})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object at the top level")
    cfg = _HFConfig(data, path)
    model_type = cfg.model_type
    if not model_type:
        raise UserError(f"{path}: missing key 'model_type' (supported: {', '.join(sorted(_READERS))})")
    reader = _READERS.get(model_type)
    if reader is None:
        raise UserError(
            f"{path}: unsupported model_type '{model_type}' (supported: {', '.join(sorted(_READERS))})"
        )
    values = reader(cfg)
    if seq_len is not None:
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
            raise UserError(f"{path}: sequence length must be a whole number >= 1, got {seq_len!r}")
        values["seq_len"] = seq_len
    name = path.resolve().parent.name or model_type
    spec = ModelSpec(key=name.lower(), name=name, source=f"HuggingFace config {path}", **values)
    validate_spec(spec, str(path))
    if spec.arch != "cnn" and not spec.head_dim and not is_mla(spec) and spec.hidden % spec.n_heads:  # transformers refuses it too
        raise UserError(f"{path}: hidden size {spec.hidden} is not a multiple of the {spec.n_heads} attention heads "
                        "(without head_dim, each head gets hidden / heads dimensions)")
    return spec


def _llama_like(cfg: _HFConfig, *, attn_bias_key: str | None, default_attn_bias: bool) -> dict:
    """llama, mistral, mixtral, qwen2, qwen2_moe: pre-RMSNorm, SwiGLU, RoPE, GQA."""
    hidden = cfg.need("hidden_size")
    heads = cfg.need("num_attention_heads")
    max_positions = cfg.need("max_position_embeddings")
    return dict(
        n_layers=cfg.need("num_hidden_layers"),
        hidden=hidden,
        n_heads=heads,
        n_kv_heads=cfg.get_int("num_key_value_heads", heads),
        head_dim=cfg.get_int("head_dim", 0),
        ffn_hidden=cfg.need("intermediate_size"),
        vocab_size=cfg.need("vocab_size"),
        seq_len=max_positions,
        max_positions=max_positions,
        mlp="swiglu",
        norm="rmsnorm",
        position="rope",
        tied_embeddings=cfg.get_bool("tie_word_embeddings", False),
        attn_bias=cfg.get_bool(attn_bias_key, default_attn_bias) if attn_bias_key else default_attn_bias,
    )


_LAYER_TYPES = {name: char for char, name in WINDOW_LAYERS.items()}


def _sliding_window(cfg: _HFConfig, layers: int, default_types, default_window: int = 0) -> dict:
    """The window and its layers (`ModelSpec.sliding_window`, `window_layers`) from `sliding_window`
    (`default_window` when the key is absent, none when it is null), `layer_types` and, where the family
    has it, `use_sliding_window`; {} when no layer is windowed. `default_types(layers)` lists the family's
    layer types when the file has no `layer_types` (configs written before transformers recorded them).
    A window no shorter than the planned sequence changes no figure, so a config whose window covers its
    context plans as it did without one."""
    if not cfg.get_bool("use_sliding_window", True):  # qwen2/qwen3: the window is off unless this says on
        return {}
    if cfg.data.get("sliding_window", default_window) is None:
        return {}
    window = cfg.get_int("sliding_window", default_window)
    if window < 1:
        return {}
    types = cfg.get("layer_types", None)
    types = default_types(layers) if types is None else types
    if not isinstance(types, list) or len(types) != layers:
        raise UserError(f"{cfg.path}: key 'layer_types' must list one type for each of the {layers} layers")
    unknown = sorted({str(t) for t in types} - set(_LAYER_TYPES))
    if unknown:
        raise UserError(f"{cfg.path}: key 'layer_types' has {', '.join(unknown)}; planned: "
                        f"{', '.join(_LAYER_TYPES)}")
    pattern = "".join(_LAYER_TYPES[t] for t in types)
    if "S" not in pattern:
        return {}
    return dict(sliding_window=window, window_layers="" if "F" not in pattern else pattern)


def _all_sliding(layers: int) -> list[str]:
    return ["sliding_attention"] * layers


def _qwen_layer_types(cfg: _HFConfig):
    """Qwen2/Qwen3's layer types before transformers wrote them: windowed from `max_window_layers` on."""
    first = cfg.get_int("max_window_layers", 28)
    return lambda layers: ["sliding_attention" if i >= first else "full_attention" for i in range(layers)]


def _read_llama(cfg: _HFConfig) -> dict:
    values = _llama_like(cfg, attn_bias_key="attention_bias", default_attn_bias=False)
    values["mlp_bias"] = cfg.get_bool("mlp_bias", False)
    return values


def _read_mistral(cfg: _HFConfig) -> dict:
    """Mistral: the llama shape; `sliding_window` (4096 in Mistral 7B v0.1, null from v0.2 on) on every layer."""
    values = _llama_like(cfg, attn_bias_key=None, default_attn_bias=False)
    values.update(_sliding_window(cfg, values["n_layers"], _all_sliding))
    return values


def _read_mixtral(cfg: _HFConfig) -> dict:
    values = _read_mistral(cfg)
    values.update(n_experts=cfg.need("num_local_experts"), experts_per_token=cfg.need("num_experts_per_tok"))
    return values


def _read_qwen2(cfg: _HFConfig) -> dict:
    # Qwen2Attention: q/k/v with bias, o_proj without; a window only under use_sliding_window (off in
    # every released config)
    values = _llama_like(cfg, attn_bias_key=None, default_attn_bias=True)
    values["attn_out_bias"] = False
    values.update(_sliding_window(cfg, values["n_layers"], _qwen_layer_types(cfg)))
    return values


def _read_qwen2_moe(cfg: _HFConfig) -> dict:
    values = _llama_like(cfg, attn_bias_key="qkv_bias", default_attn_bias=True)
    values["attn_out_bias"] = False
    if cfg.get_int("decoder_sparse_step", 1) != 1 or cfg.get("mlp_only_layers", []):
        raise UserError(
            f"{cfg.path}: qwen2_moe with dense layers (decoder_sparse_step != 1 or mlp_only_layers)"
            " is not supported; only all-MoE stacks are"
        )
    values.update(
        ffn_hidden=cfg.need("moe_intermediate_size"),
        n_experts=cfg.need("num_experts"),
        experts_per_token=cfg.need("num_experts_per_tok"),
        shared_expert_ffn_hidden=cfg.get_int("shared_expert_intermediate_size", 0),
    )
    return values


def _read_qwen3(cfg: _HFConfig) -> dict:
    # Qwen3Attention: q/k/v/o with `attention_bias` on all four (default none), head_dim from the
    # config (128 in every released size), an RMSNorm over each head's q and k (q_norm, k_norm)
    values = _llama_like(cfg, attn_bias_key="attention_bias", default_attn_bias=False)
    values["qk_norm"] = True
    values.update(_sliding_window(cfg, values["n_layers"], _qwen_layer_types(cfg)))
    return values


def _read_qwen3_moe(cfg: _HFConfig) -> dict:
    values = _read_qwen3(cfg)
    values.pop("sliding_window", None)  # Qwen3MoeAttention windows every layer (no max_window_layers)
    values.pop("window_layers", None)
    values.update(_sliding_window(cfg, values["n_layers"], _all_sliding))
    if cfg.get_int("decoder_sparse_step", 1) != 1 or cfg.get("mlp_only_layers", []):
        raise UserError(
            f"{cfg.path}: qwen3_moe with dense layers (decoder_sparse_step != 1 or mlp_only_layers)"
            " is not supported; only all-MoE stacks are"
        )
    values.update(  # no shared expert (Qwen3MoeSparseMoeBlock: a router and the experts)
        ffn_hidden=cfg.need("moe_intermediate_size"),
        # the Hub's configs say num_experts; transformers 5 writes num_local_experts
        n_experts=cfg.need("num_experts", "num_local_experts"),
        experts_per_token=cfg.need("num_experts_per_tok"),
    )
    return values


def _read_deepseek_v3(cfg: _HFConfig) -> dict:
    """DeepSeek-V3 (transformers' DeepseekV3ForCausalLM): multi-head latent attention, then a
    dense SwiGLU MLP (`intermediate_size`) in the first `first_k_dense_replace` blocks and an MoE
    in the others: `n_routed_experts` experts of `moe_intermediate_size`, top `num_experts_per_tok`,
    `n_shared_experts` x `moe_intermediate_size` of always-active shared expert without a gate.

    The router's `e_score_correction_bias` is a buffer, not a parameter (it is updated by a rule,
    not by gradients), so it is not counted. The multi-token-prediction module
    (`num_nextn_predict_layers`, one more block and a 2h -> h projection in DeepSeek-V3's
    checkpoint, 1 in its config.json and in every config transformers writes) is not planned:
    the main model is, as transformers builds it and as the report's 671B counts it (the MTP
    module's 14B apart); the plan names that in the model's source line."""
    return _deepseek_like(cfg, group_limited=True)


def _read_deepseek_v2(cfg: _HFConfig) -> dict:
    """DeepSeek-V2 (transformers' DeepseekV2ForCausalLM): V3's shapes (`_read_deepseek_v3`), with
    its own defaults (no dense blocks unless `first_k_dense_replace`, 2 shared experts) and no
    multi-token prediction."""
    if cfg.get_bool("mlp_bias", False):  # on the dense MLP and shared experts but not the routed ones
        raise UserError(f"{cfg.path}: deepseek_v2 with mlp_bias true is not supported")
    # transformers' DeepseekV2MoEGate limits a token's groups only with topk_method group_limited_greedy
    # (DeepSeek-V2's own config; V2-Lite's is greedy)
    return _deepseek_like(cfg, dense_default=0, shared_default=2,
                          group_limited=cfg.get("topk_method", "greedy") == "group_limited_greedy")


def _deepseek_like(cfg: _HFConfig, *, dense_default: int = 3, shared_default: int = 1,
                   group_limited: bool = False) -> dict:
    """The DeepSeek-V2/V3 shape: MLA, a fine-grained MoE with shared experts and leading dense
    blocks (module docstrings of `_read_deepseek_v3` and `ModelSpec`); with `group_limited`, the
    router's `n_group` / `topk_group` (transformers' DeepseekV3TopkRouter always applies them,
    defaults 8 and 4)."""
    cfg.get_int("num_nextn_predict_layers", 0)  # checked as a number; the MTP module is not planned
    if cfg.get("moe_layer_freq", 1) != 1:
        raise UserError(f"{cfg.path}: key 'moe_layer_freq' must be 1 (an MoE in every block after the dense ones)")
    values = _llama_like(cfg, attn_bias_key="attention_bias", default_attn_bias=False)
    heads = values["n_heads"]
    q_lora = cfg.data.get("q_lora_rank", 1536)  # null: the query is projected from the hidden state directly
    if q_lora is not None and (isinstance(q_lora, bool) or not isinstance(q_lora, int) or q_lora < 1):
        raise UserError(f"{cfg.path}: key 'q_lora_rank' must be a whole number >= 1 or null, got {q_lora!r}")
    values.update(
        n_kv_heads=heads,  # kv_b_proj expands the latent to every head; num_key_value_heads is unused
        head_dim=0,
        kv_lora_rank=cfg.need("kv_lora_rank"),
        q_lora_rank=q_lora or 0,
        qk_nope_head_dim=cfg.need("qk_nope_head_dim"),
        qk_rope_head_dim=cfg.need("qk_rope_head_dim"),
        v_head_dim=cfg.need("v_head_dim"),
        ffn_hidden=cfg.need("moe_intermediate_size"),
        n_experts=cfg.need("n_routed_experts", "num_local_experts"),
        experts_per_token=cfg.need("num_experts_per_tok"),
        shared_expert_ffn_hidden=cfg.get_int("n_shared_experts", shared_default) * cfg.need("moe_intermediate_size"),
        shared_expert_gate=False,
    )
    dense = cfg.get_int("first_k_dense_replace", dense_default)
    if dense:
        values.update(dense_layers=dense, dense_ffn_hidden=cfg.need("intermediate_size"))
    groups = cfg.get_int("n_group", 8) if group_limited else 0
    if groups > 1:
        values.update(expert_groups=groups, expert_groups_per_token=cfg.get_int("topk_group", 4))
    return values


def _read_llama4_text(cfg: _HFConfig) -> dict:
    """Llama 4's text model (transformers' Llama4TextModel): GQA with a head_dim of its own and
    parameter-free q/k L2 norms; MoE blocks of `num_local_experts` experts (`intermediate_size`),
    top-`num_experts_per_tok`, a router without bias and an ungated shared expert as wide as one
    expert; the other blocks dense (`intermediate_size_mlp`). Which blocks are MoE: `moe_layers`,
    by default every `interleave_moe_layer_step`-th (blocks K-1, 2K-1, ...); any other list is
    refused. Chunked attention (`attention_chunk_size`) is planned as full causal attention."""
    values = _llama_like(cfg, attn_bias_key="attention_bias", default_attn_bias=False)
    layers, step = values["n_layers"], cfg.get_int("interleave_moe_layer_step", 1)
    if step < 1:
        raise UserError(f"{cfg.path}: key 'interleave_moe_layer_step' must be >= 1, got {step}")
    moe = cfg.get("moe_layers", None)
    if moe is not None and list(moe) != list(range(step - 1, layers, step)):
        raise UserError(f"{cfg.path}: key 'moe_layers' {moe} is not every {step}-th block; only that pattern is planned")
    ffn = cfg.need("intermediate_size")
    values.update(ffn_hidden=ffn, n_experts=cfg.get_int("num_local_experts", 16),
                  experts_per_token=cfg.get_int("num_experts_per_tok", 1), shared_expert_ffn_hidden=ffn,
                  shared_expert_gate=False, head_dim=cfg.get_int("head_dim", 128))
    if step > 1:
        values.update(dense_layers=layers - layers // step, dense_ffn_hidden=cfg.get_int("intermediate_size_mlp", 16384),
                      moe_layer_step=step)
    return values


def _read_llama4(cfg: _HFConfig) -> dict:
    """A Llama 4 checkpoint's config.json: the text model's keys sit under `text_config` (the vision
    encoder is not planned)."""
    text = cfg.data.get("text_config")
    if not isinstance(text, dict):
        raise UserError(f"{cfg.path}: key 'text_config' must be an object (Llama 4's text model)")
    return _read_llama4_text(_HFConfig(text, cfg.path))


def _read_gpt_oss(cfg: _HFConfig) -> dict:
    """OpenAI gpt-oss (transformers' GptOssForCausalLM; OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model
    Card", arXiv 2508.10925): GQA of `head_dim` with biases on q, k, v and o (`attention_bias`) and a
    learned sink logit per head; an MoE in every block, `num_local_experts` experts of
    `intermediate_size`, top `num_experts_per_tok`, each expert's gate/up and down projections biased
    (GptOssExperts), a router with a bias (GptOssTopKRouter); the clamped SwiGLU (`swiglu_limit`,
    `swiglu_alpha`) planned as SwiGLU (the same matrices); YaRN rotary embeddings planned as RoPE;
    layers alternating a `sliding_window` band and full causal attention (`layer_types`, by default
    sliding on the even blocks 0, 2, ...)."""
    hidden = cfg.need("hidden_size")
    heads = cfg.get_int("num_attention_heads", 64)
    layers = cfg.get_int("num_hidden_layers", 36)
    positions = cfg.get_int("max_position_embeddings", 131072)
    bias = cfg.get_bool("attention_bias", True)
    values = dict(
        n_layers=layers, hidden=hidden, n_heads=heads, n_kv_heads=cfg.get_int("num_key_value_heads", heads),
        head_dim=cfg.get_int("head_dim", hidden // heads), ffn_hidden=cfg.get_int("intermediate_size", 2880),
        vocab_size=cfg.get_int("vocab_size", 201088), seq_len=positions, max_positions=positions, mlp="swiglu",
        norm="rmsnorm", position="rope", tied_embeddings=cfg.get_bool("tie_word_embeddings", False),
        attn_bias=bias, attn_out_bias=bias, mlp_bias=True, n_experts=cfg.get_int("num_local_experts", 128),
        experts_per_token=cfg.get_int("num_experts_per_tok", 4), attn_sinks=True, router_bias=True,
    )
    values.update(_sliding_window(cfg, layers, lambda n: ["sliding_attention" if i % 2 == 0 else "full_attention"
                                                          for i in range(n)], default_window=128))
    return values


def _read_gpt2(cfg: _HFConfig) -> dict:
    hidden = cfg.need("n_embd", "hidden_size")
    if cfg.get("add_cross_attention", False):
        raise UserError(f"{cfg.path}: gpt2 with add_cross_attention is not supported")
    positions = cfg.need("n_positions", "max_position_embeddings")
    return dict(
        n_layers=cfg.need("n_layer", "num_hidden_layers"),
        hidden=hidden,
        n_heads=cfg.need("n_head", "num_attention_heads"),
        ffn_hidden=cfg.get_int("n_inner", 4 * hidden),
        vocab_size=cfg.need("vocab_size"),
        seq_len=positions,
        max_positions=positions,
        mlp="gelu",
        norm="layernorm",
        position="learned",
        tied_embeddings=cfg.get_bool("tie_word_embeddings", True),
        attn_bias=True,
        mlp_bias=True,
    )


def _read_gpt_neox(cfg: _HFConfig) -> dict:
    max_positions = cfg.need("max_position_embeddings")
    return dict(
        n_layers=cfg.need("num_hidden_layers"),
        hidden=cfg.need("hidden_size"),
        n_heads=cfg.need("num_attention_heads"),
        ffn_hidden=cfg.need("intermediate_size"),
        vocab_size=cfg.need("vocab_size"),
        seq_len=max_positions,
        max_positions=max_positions,
        mlp="gelu",
        norm="layernorm",
        position="rope",
        tied_embeddings=cfg.get_bool("tie_word_embeddings", False),
        attn_bias=cfg.get_bool("attention_bias", True),
        mlp_bias=True,
        parallel_block=cfg.get_bool("use_parallel_residual", True),  # GPTNeoXConfig's default
    )


def _read_bert(cfg: _HFConfig) -> dict:
    positions = cfg.need("max_position_embeddings")
    return dict(
        arch="encoder",
        n_layers=cfg.need("num_hidden_layers"),
        hidden=cfg.need("hidden_size"),
        n_heads=cfg.need("num_attention_heads"),
        ffn_hidden=cfg.need("intermediate_size"),
        vocab_size=cfg.need("vocab_size"),
        type_vocab_size=cfg.get_int("type_vocab_size", 2),
        seq_len=positions,
        max_positions=positions,
        mlp="gelu",
        norm="layernorm",
        position="learned",
        attn_bias=True,
        mlp_bias=True,
        embedding_norm=True,
        pooler=True,
    )


def _read_opt(cfg: _HFConfig) -> dict:
    hidden = cfg.need("hidden_size")
    if cfg.get_int("word_embed_proj_dim", hidden) != hidden:
        raise UserError(f"{cfg.path}: opt with word_embed_proj_dim != hidden_size is not supported")
    if not cfg.get("layer_norm_elementwise_affine", True):
        raise UserError(f"{cfg.path}: opt with layer_norm_elementwise_affine false is not supported")
    positions = cfg.need("max_position_embeddings")
    bias = cfg.get_bool("enable_bias", True)
    final_norm = cfg.get_bool("do_layer_norm_before", True) and not cfg.get("_remove_final_layer_norm", False)
    return dict(
        n_layers=cfg.need("num_hidden_layers"),
        hidden=hidden,
        n_heads=cfg.need("num_attention_heads"),
        ffn_hidden=cfg.need("ffn_dim"),
        vocab_size=cfg.need("vocab_size"),
        seq_len=positions,
        max_positions=positions + 2,  # OPTLearnedPositionalEmbedding keeps 2 offset rows
        mlp="relu",
        norm="layernorm",
        position="learned",
        tied_embeddings=cfg.get_bool("tie_word_embeddings", True),
        attn_bias=bias,
        mlp_bias=bias,
        final_norm=final_norm,
    )


def _read_bloom(cfg: _HFConfig) -> dict:
    hidden = cfg.need("hidden_size", "n_embed")
    return dict(
        n_layers=cfg.need("n_layer", "num_hidden_layers"),
        hidden=hidden,
        n_heads=cfg.need("n_head", "num_attention_heads"),
        ffn_hidden=4 * hidden,
        vocab_size=cfg.need("vocab_size"),
        seq_len=cfg.get_int("seq_length", 2048),
        max_positions=cfg.get_int("seq_length", 2048),
        mlp="gelu",
        norm="layernorm",
        position="alibi",
        tied_embeddings=cfg.get_bool("tie_word_embeddings", True),
        attn_bias=True,
        mlp_bias=True,
        embedding_norm=True,
    )


def _read_falcon(cfg: _HFConfig) -> dict:
    hidden = cfg.need("hidden_size", "n_embed")
    heads = cfg.need("num_attention_heads", "n_head")
    new_arch = cfg.get_bool("new_decoder_architecture", False)
    multi_query = cfg.get_bool("multi_query", True)
    parallel_attn = cfg.get_bool("parallel_attn", True)
    if new_arch:
        kv_heads = cfg.get_int("num_kv_heads", heads)
    else:
        kv_heads = 1 if multi_query else heads
    # FalconDecoderLayer: two norms unless a parallel block uses a single shared one.
    n_ln = cfg.get("num_ln_in_parallel_attn", 2 if new_arch else 1)
    norms = 2 if (not parallel_attn or n_ln == 2) else 1
    bias = cfg.get_bool("bias", False)
    max_positions = cfg.get_int("max_position_embeddings", 2048)
    return dict(
        n_layers=cfg.need("num_hidden_layers", "n_layer"),
        hidden=hidden,
        n_heads=heads,
        n_kv_heads=kv_heads,
        ffn_hidden=cfg.get_int("ffn_hidden_size", 4 * hidden),
        vocab_size=cfg.need("vocab_size"),
        seq_len=max_positions,
        max_positions=max_positions,
        mlp="gelu",
        norm="layernorm",
        position="alibi" if cfg.get("alibi", False) else "rope",
        tied_embeddings=cfg.get_bool("tie_word_embeddings", True),
        attn_bias=bias,
        mlp_bias=bias,
        norms_per_layer=norms,
        parallel_block=parallel_attn,
    )


def _read_mpt(cfg: _HFConfig) -> dict:
    """MosaicML MPT (llm-foundry's MPTConfig): d_model / n_heads / n_layers, an MLP of
    expansion_ratio x d_model (or ffn_config's ffn_hidden_size), ALiBi or learned positions,
    no biases when no_bias (the default), the output head tied to the embedding unless
    tie_word_embeddings is false."""
    hidden = cfg.need("d_model")
    ratio = cfg.get("expansion_ratio", 4)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or ratio <= 0:
        raise UserError(f"{cfg.path}: key 'expansion_ratio' must be a positive number, got {ratio!r}")
    ffn_config, attn = (_mapping(cfg.get(key, {})) for key in ("ffn_config", "attn_config"))
    ffn_type = ffn_config.get("ffn_type", "mptmlp")
    if ffn_type not in ("mptmlp", "te_ln_mlp", "mptglu"):
        raise UserError(f"{cfg.path}: MPT ffn_type '{ffn_type}' is not supported (mptmlp, mptglu, te_ln_mlp)")
    ffn = ffn_config.get("ffn_hidden_size")
    alibi = bool(attn.get("alibi", False))
    positions = cfg.need("max_seq_len")
    no_bias = cfg.get_bool("no_bias", True)
    return dict(
        n_layers=cfg.need("n_layers"),
        hidden=hidden,
        n_heads=cfg.need("n_heads"),
        n_kv_heads=_mpt_kv_heads(cfg, attn),
        ffn_hidden=int(ffn) if isinstance(ffn, int) and not isinstance(ffn, bool) else int(ratio * hidden),
        vocab_size=cfg.need("vocab_size"),
        seq_len=positions,
        max_positions=positions,
        mlp="swiglu" if ffn_type == "mptglu" else "gelu",
        norm="layernorm",
        norm_bias=not no_bias,
        position="alibi" if alibi else "learned",
        tied_embeddings=cfg.get_bool("tie_word_embeddings", True),
        attn_bias=not no_bias,
        mlp_bias=not no_bias,
    )


def _mapping(value: object) -> dict:
    """A nested config section, or {} when it is absent or not a mapping."""
    return value if isinstance(value, dict) else {}


def _mpt_kv_heads(cfg: _HFConfig, attn: dict) -> int:
    """K/V heads by MPT's attn_type: its attn_config carries kv_n_heads 1 by default even for
    multi-head attention, so the count is read only for grouped-query attention."""
    kind = attn.get("attn_type", "multihead_attention")
    if kind == "multiquery_attention":
        return 1
    if kind == "grouped_query_attention":
        value = attn.get("kv_n_heads")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"{cfg.path}: attn_config.kv_n_heads must be a whole number >= 1, got {value!r}")
        return value
    return 0


def _read_nemotron(cfg: _HFConfig) -> dict:
    """NVIDIA Nemotron (transformers' NemotronConfig): the llama shape keys, with a squared-ReLU
    MLP of two matrices (planned as relu: same parameters and FLOPs) and LayerNorm1P."""
    values = _llama_like(cfg, attn_bias_key="attention_bias", default_attn_bias=False)
    values.update(mlp="relu", norm="layernorm", mlp_bias=cfg.get_bool("mlp_bias", False))
    return values


_NEMOTRON_H_LAYERS = {"mamba": "M", "linear_attention": "M", "attention": "*", "full_attention": "*", "mlp": "-",
                      "moe": "E"}
"""transformers' NemotronHConfig layer names (`layers_block_type`; `_pattern_to_list`) as pattern symbols."""


def _read_nemotron_h(cfg: _HFConfig) -> dict:
    """NVIDIA Nemotron-H (transformers' NemotronHConfig, `model_type` nemotron_h): a hybrid stack whose
    layers are named by `hybrid_override_pattern` (the Hub's files) or `layers_block_type` (what
    transformers 5 writes); Mamba-2 mixers of `mamba_num_heads` x `mamba_head_dim`, `ssm_state_size`,
    `n_groups`, `conv_kernel`, `chunk_size`; attention of `head_dim` without biases or rotary
    embedding (NemotronHAttention); a squared-ReLU MLP of two matrices (`relu2`, planned as relu);
    one RMSNorm per layer (NemotronHBlock); an output head of its own even under tie_word_embeddings
    (NemotronHForCausalLM ties nothing: `_tied_weights_keys = {}`). MoE layers and multi-token
    prediction are refused."""
    pattern = cfg.data.get("hybrid_override_pattern")
    if pattern is None and isinstance(cfg.data.get("layers_block_type"), list):
        names = cfg.data["layers_block_type"]
        unknown = sorted({str(n) for n in names} - set(_NEMOTRON_H_LAYERS))
        if unknown:
            raise UserError(f"{cfg.path}: key 'layers_block_type' has unknown layer types {', '.join(unknown)}")
        pattern = "".join(_NEMOTRON_H_LAYERS[n] for n in names)
    if not isinstance(pattern, str) or not pattern:
        raise UserError(f"{cfg.path}: missing key 'hybrid_override_pattern' (or 'layers_block_type')")
    if cfg.get_int("num_hidden_layers", len(pattern)) != len(pattern):
        raise UserError(f"{cfg.path}: num_hidden_layers {cfg.data['num_hidden_layers']} is not the pattern's "
                        f"{len(pattern)} layers")
    activation = cfg.get("mlp_hidden_act", "relu2")
    if activation != "relu2":
        raise UserError(f"{cfg.path}: mlp_hidden_act '{activation}' is not supported (relu2)")
    if cfg.get_bool("use_bias", False) or not cfg.get_bool("use_conv_bias", True):
        raise UserError(f"{cfg.path}: nemotron_h with use_bias true or use_conv_bias false is not supported")
    if cfg.get_int("num_nextn_predict_layers", 0):
        raise UserError(f"{cfg.path}: nemotron_h with multi-token prediction layers is not supported")
    positions = cfg.get_int("max_position_embeddings", 4096)
    cfg.get_bool("tie_word_embeddings", False)  # checked as true/false; the head is counted apart either way
    return dict(
        n_layers=len(pattern), hidden=cfg.need("hidden_size"), n_heads=cfg.get_int("num_attention_heads", 32),
        n_kv_heads=cfg.get_int("num_key_value_heads", 8), head_dim=cfg.get_int("head_dim", 128),
        ffn_hidden=cfg.get_int("intermediate_size", 21504), vocab_size=cfg.get_int("vocab_size", 131072),
        seq_len=positions, max_positions=positions, mlp="relu", norm="rmsnorm", position="none",
        tied_embeddings=False, mlp_bias=cfg.get_bool("mlp_bias", False),
        norms_per_layer=1, hybrid_pattern=pattern, mamba_heads=cfg.get_int("mamba_num_heads", 128),
        mamba_head_dim=cfg.get_int("mamba_head_dim", 64), mamba_state=cfg.get_int("ssm_state_size", 128),
        mamba_groups=cfg.get_int("n_groups", 8), mamba_conv=cfg.get_int("conv_kernel", 4),
        mamba_chunk=cfg.get_int("chunk_size", 128),
    )


_READERS = {
    "llama": _read_llama,
    "mistral": _read_mistral,
    "mixtral": _read_mixtral,
    "qwen2": _read_qwen2,
    "qwen2_moe": _read_qwen2_moe,
    "qwen3": _read_qwen3,
    "llama4": _read_llama4,
    "llama4_text": _read_llama4_text,
    "qwen3_moe": _read_qwen3_moe,
    "deepseek_v2": _read_deepseek_v2,
    "deepseek_v3": _read_deepseek_v3,
    "gpt_oss": _read_gpt_oss,
    # Moonshot's Kimi K2 is DeepSeek-V3's architecture under a model_type of its own (its remote-code
    # KimiK2Config; Megatron-Bridge's KimiK2Bridge maps it with the DeepSeek mappings)
    "kimi_k2": _read_deepseek_v3,
    "gpt2": _read_gpt2,
    "gpt_neox": _read_gpt_neox,
    "bert": _read_bert,
    "opt": _read_opt,
    "bloom": _read_bloom,
    "falcon": _read_falcon,
    "mpt": _read_mpt,
    "nemotron": _read_nemotron,
    "nemotron_h": _read_nemotron_h,
}


def reads_hf_model_type(model_type: object) -> bool:
    """Whether `from_hf_config` knows this `model_type` (transformers may know more)."""
    return isinstance(model_type, str) and model_type in _READERS
