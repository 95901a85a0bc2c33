"""Megatron-Core's selective recompute by module (`--recompute-modules`), as one policy string.

Megatron-Core checkpoints single submodules of a transformer layer when
`recompute_granularity` is selective (megatron/core/transformer/transformer_config.py,
`recompute_modules`; transformer_layer.py; moe/moe_layer.py; multi_latent_attention.py):

- core_attn:      the attention core (Korthikanti et al.'s selective recompute: with flash
                  attention there is nothing left to drop; the planner's "selective")
- mlp:            the dense MLP: keeps its input, runs its forward again
- moe:            the whole MoE layer: router, token dispatch, experts, combine, again in backward
                  (its all-to-alls included)
- shared_experts: the MoE's shared experts
- moe_act:        the experts' activation function, output discarded (CheckpointWithoutOutput):
                  the down projection's input is not kept
- mla_up_proj:    MLA's q/kv up projections and RoPE, outputs discarded: Q, K, V are not kept
- layernorm:      the two pre-norms, outputs discarded: the GEMM inputs after them are not kept

The policy is spelled `modules:mla_up_proj+mlp+moe` (in the module order above); a set of
only core_attn is "selective". DeepSeek-V3's leading dense blocks run `mlp`, its MoE blocks
`moe` (the first `dense_layers` blocks are the dense share).
"""

from __future__ import annotations

import re
from functools import lru_cache

from flopwise.errors import UserError

MODULES = ("core_attn", "mlp", "moe", "shared_experts", "moe_act", "mla_up_proj", "layernorm")
"""The modules Megatron-Core can recompute that the planner models, in spelling order."""
PREFIX = "modules:"


@lru_cache(maxsize=256)
def parse(recompute: str) -> frozenset[str] | None:
    """The modules of a `modules:a+b` policy, None for any other policy (cached: a search asks per layout)."""
    if not recompute.startswith(PREFIX):
        return None
    names = frozenset(name for name in re.split(r"[+,/ ]+", recompute[len(PREFIX):]) if name)
    return names if names and names <= set(MODULES) else None


def modules_in(text: str) -> frozenset[str] | None:
    """The modules a source lists ("mla_up_proj/mlp/moe" as NeMo's tables write it, "mlp,moe",
    "mla_up_proj mlp moe" as Megatron's flag takes it; dashes for underscores), None when `text`
    is not such a list."""
    words = [word.replace("-", "_") for word in re.split(r"[+,/ ]+", text.strip().lower()) if word]
    if words and words[0].startswith(PREFIX):
        words[0] = words[0][len(PREFIX):]
    if not words or not set(words) <= set(MODULES):
        return None
    return frozenset(words)


def spelled(modules: frozenset[str]) -> str:
    """The policy string of a module set: "selective" for the attention core alone."""
    if modules == {"core_attn"}:
        return "selective"
    return PREFIX + "+".join(name for name in MODULES if name in modules)


def unknown_modules_message(text: str) -> str:
    """One line naming the modules of `text` that are not modelled."""
    words = {word.replace("-", "_") for word in re.split(r"[+,/ ]+", text.strip().lower()) if word}
    words.discard("")
    unknown = sorted(word.removeprefix(PREFIX) for word in words if word.removeprefix(PREFIX) not in MODULES)
    return (f"--recompute-modules: {', '.join(unknown) or text} not among {', '.join(MODULES)} "
            f"(Megatron-Core's recompute_modules the planner models)")


def dense_share(model) -> float:
    """Share of the blocks whose MLP is dense: all of a dense model's, the leading (or interleaved)
    dense blocks of an MoE."""
    if model.n_experts <= 1:
        return 1.0
    return model.dense_layers / model.n_layers


def mlp_rerun_share(modules: frozenset[str], dense: float) -> float:
    """Share of the blocks whose whole MLP (dense or MoE) runs its forward again, `dense` the
    share of blocks with a dense MLP (`dense_share`)."""
    return (dense if "mlp" in modules else 0.0) + ((1.0 - dense) if "moe" in modules else 0.0)


def moe_kept_share(modules: frozenset[str], dense: float) -> float:
    """Share of the blocks that are MoE and not recomputed whole (where moe_act and
    shared_experts act on their own)."""
    return 0.0 if "moe" in modules else 1.0 - dense


def check(modules: frozenset[str], model) -> None:
    """Refuse what Megatron-Core refuses or the planner does not model."""
    from flopwise.catalog.models import is_mla
    from flopwise.plan import mamba

    if model.arch == "cnn" and modules:
        raise UserError(f"--recompute-modules is Megatron-Core's per-module recompute of transformer layers; {model.name} "
                        "is a CNN (use --recompute full or none)")
    if "mla_up_proj" in modules and not is_mla(model):
        raise UserError("--recompute-modules mla_up_proj is for multi-latent attention (DeepSeek-V2/V3); "
                        f"{model.name} has none")
    if mamba.layer_mix(model) is not None and modules - {"core_attn"}:
        raise UserError(f"--recompute-modules {'+'.join(sorted(modules - {'core_attn'}))}: per-module recompute "
                        f"of a hybrid Mamba stack ({model.name}) is not modelled; use core_attn, full or "
                        "blocks:F")
