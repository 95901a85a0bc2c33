"""Activation (gradient) checkpointing: recompute a block's activations in backward instead of storing them.

Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost" (arXiv:1604.06174):
storing only each block's input trades one extra forward per block for the block's
internal activations. Checkpointing every k-th block (torchtitan's "selective layer" AC)
keeps a fraction 1/k of that trade.

The block's own `forward` is replaced (on the instance) by one that runs the class's
forward under PyTorch's non-reentrant `torch.utils.checkpoint`. Unlike wrapping the block
in `checkpoint_wrapper`, this leaves parameter names and state_dict keys exactly as they
were, so turning the switch off leaves no trace; FSDP2 `fully_shard` applied to the
blocks afterwards keeps its hooks outside the checkpointed region, as it does with the
wrapper (its pre-backward hook gathers the parameters before the recomputation needs them).
"""

from __future__ import annotations

import types

from torch import nn
from torch.utils.checkpoint import checkpoint

from flopwise.errors import UserError
from flopwise.train.model import transformer_blocks


def checkpoint_every(setting: bool | int | None) -> int:
    """`training.gradient_checkpointing` as a period: false/0 = off, true = 1 (every block), k = every k-th."""
    if setting is True:
        return 1
    if setting is False or setting is None:
        return 0
    if setting < 0:
        raise UserError(
            f"training.gradient_checkpointing={setting} is not allowed: use true, false or k >= 0 (every k-th block)"
        )
    return int(setting)


def checkpointed_forward(self: nn.Module, *args, **kwargs):
    """The block's class forward, with its activations recomputed in backward.

    `preserve_rng_state` (the default) replays the same dropout masks in the recomputation.
    Looking the forward up on the class (not a captured bound method) keeps `copy.deepcopy`
    of a checkpointed model pointing at the copy.
    """
    return checkpoint(type(self).forward, self, *args, use_reentrant=False, **kwargs)


def is_checkpointed(block: nn.Module) -> bool:
    """Whether `apply_activation_checkpointing` already made this block recompute its activations."""
    return getattr(block, "activation_checkpointed", False)


def apply_activation_checkpointing(model: nn.Module, every: bool | int | None) -> int:
    """Checkpoint every k-th transformer block (the k-th, 2k-th, ...); returns how many were changed.

    Call it after `apply_fp32_norm` and before FSDP2 / DDP. Applying it twice changes nothing.
    """
    period = checkpoint_every(every)
    if period == 0:
        return 0
    changed = 0
    for index, block in enumerate(transformer_blocks(model)):
        if (index + 1) % period or is_checkpointed(block):
            continue
        block.forward = types.MethodType(checkpointed_forward, block)
        block.activation_checkpointed = True
        changed += 1
    return changed
