"""Bytes of the tensors autograd saves for the backward: what a block's activations really cost,
the oracle the planner's activation counts are checked against."""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def saved_storage_bytes(excluded: set[int]):
    """Within the block, record the storage of every tensor autograd saves (once, by address)
    unless that address is in `excluded` (the weights); yields {address: bytes}."""
    import torch

    storages: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in excluded:
            storages[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield storages
