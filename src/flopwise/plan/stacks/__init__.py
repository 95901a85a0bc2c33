"""Training software stacks as planner inputs: `get_stack(name)` and `STACK_NAMES`.

One module per stack, each a frozen `Stack` whose values cite that stack's source files
or kernel micro-benchmarks (docs/planner.md, "Stacks"). The default, `flopwise`, is what
`flopwise train` runs and what a run's plan.json is planned with.
"""

from __future__ import annotations

from flopwise.catalog.names import spelled
from flopwise.errors import UserError
from flopwise.plan.stacks.base import FP8_RECIPE_ALIASES, FP8_RECIPES, Stack, spelled_fp8_recipe
from flopwise.plan.stacks import (
    composer, deepspeed, flash_attn, flopwise, jax, litgpt, megatron_core, megatron_deepspeed, megatron_lm, nemo,
    torchtitan, torchtune,
)

_STACKS = {module.STACK.name: module.STACK for module in (
    flopwise, megatron_core, nemo, megatron_lm, deepspeed, megatron_deepspeed, composer, torchtitan, flash_attn, jax,
    torchtune, litgpt)}
STACK_NAMES = tuple(_STACKS)
ALIASES = {"megatron-bridge": "nemo", "llm-foundry": "composer",
           "mcore": "megatron-core", "gpt-neox": "megatron-deepspeed",
           # the names the sources print: MosaicML's tables, flash-attention's repository, NVIDIA's TE
           "mosaicml": "composer", "flash-attention": "flash-attn", "transformer-engine": "megatron-core",
           "deepspeed-megatron": "megatron-deepspeed", "lit-gpt": "litgpt"}

__all__ = ["ALIASES", "FP8_RECIPE_ALIASES", "FP8_RECIPES", "STACK_NAMES", "Stack", "find_stack", "get_stack",
           "spelled_fp8_recipe"]


def _squashed(name: str) -> str:
    """A name without case, separators or a trailing version: "FlashAttention", "NeMo 2.0", "Megatron-Core"."""
    return "".join(ch for ch in name.lower() if ch.isalnum()).rstrip("0123456789")


_SQUASHED = {_squashed(name): ALIASES.get(name, name) for name in (*STACK_NAMES, *ALIASES)}


def _key(name: str) -> str:
    """A stack name as the modules spell it: case, spaces and underscores do not matter
    ("NeMo", "flash_attn", "Megatron Bridge"), nor separators, a version or the repository's owner as a
    source prints it ("FlashAttention", "NeMo 2.0", "Dao-AILab/flash-attention", "mosaicml/llm-foundry")."""
    key = spelled(name)
    key = ALIASES.get(key, key)
    if key in _STACKS:
        return key
    return _SQUASHED.get(_squashed(name.rsplit("/", 1)[-1]), key)


def find_stack(name: str) -> Stack | None:
    """The stack called `name` (or an alias), None for a name no module describes (a RunSpec
    built directly may name a stack the planner has no conventions for; it plans as flopwise)."""
    found = _STACKS.get(name)
    return found if found is not None else _STACKS.get(_key(name))


def get_stack(name: str) -> Stack:
    """The stack called `name` (or one of its aliases); one-line error for an unknown name."""
    key = _key(name)
    if key not in _STACKS:
        raise UserError(f"--stack {name!r} is not one of: {', '.join(STACK_NAMES + tuple(ALIASES))}")
    return _STACKS[key]
