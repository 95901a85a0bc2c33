"""Activation offload: a block's saved activations wait in host memory from its forward to its backward.

`training.offload_activations: N` (or `all`) runs the forward of the first N transformer blocks under
`torch.autograd.graph.save_on_cpu(pin_memory=True)`: every tensor autograd saves inside the block is
copied to pinned host memory and brought back when its backward needs it. Device memory then holds
the other blocks' activations only, at the price of two host-link copies per saved byte, queued on the
compute stream (the planner times them so: `plan/activation_offload.py`, copies not hidden). Composer's
`activation_cpu_offload` is the same wrapper (torch's `offload_wrapper`) on every block.

It composes with activation checkpointing (a checkpointed block saves only its inputs, which then go to
the host) and replaces int8 activation compression inside the blocks it covers: saved-tensor hooks
nest, and the innermost, the offload's, decides how a tensor is kept.
"""

from __future__ import annotations

import types

import torch
from torch import nn

from flopwise.errors import UserError
from flopwise.train.model import transformer_blocks
from flopwise.train.techniques.activation_checkpointing import checkpointed_forward, is_checkpointed


def offloaded_block_count(setting: int | str, blocks: int) -> int:
    """Blocks whose activations go to the host: `all` is every block, N at most the model's."""
    if setting == "all":
        return blocks
    if isinstance(setting, bool) or not isinstance(setting, int) or setting < 0:
        raise UserError(f"training.offload_activations={setting!r}: use 'all' or a number of blocks >= 0")
    return min(setting, blocks)


def offloaded_forward(self: nn.Module, *args, **kwargs):
    """The block's forward (checkpointed where checkpointing made it so), its saved tensors kept in
    (pinned, with CUDA) host memory. The forward is looked up on the class, not captured, so a
    `copy.deepcopy` of the model runs the copy's own block."""
    with torch.autograd.graph.save_on_cpu(pin_memory=torch.cuda.is_available()):
        if is_checkpointed(self):
            return checkpointed_forward(self, *args, **kwargs)
        return type(self).forward(self, *args, **kwargs)


def apply_activation_offload(model: nn.Module, setting: int | str) -> int:
    """Offload the saved activations of the first N blocks (all with 'all'); returns how many.

    Call it after activation checkpointing and before FSDP2 / DDP / torch.compile. Applying it twice
    changes nothing more."""
    blocks = transformer_blocks(model)
    count = offloaded_block_count(setting, len(blocks))
    for block in list(blocks)[:count]:
        if getattr(block, "activations_offloaded", False):
            continue
        block.forward = types.MethodType(offloaded_forward, block)
        block.activations_offloaded = True
    return count
