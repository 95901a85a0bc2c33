"""Mixing several datasets by weight (`data.mix: [{path, weight}]`).

Which dataset the next example comes from follows smooth weighted round-robin (the scheme of
nginx's upstream balancer): deterministic, and after any number of draws each dataset's share
is within one example of its weight's share, so a small run sees the mixture it asked for
rather than a random draw from it. Within a dataset, examples are taken in a fresh seeded
order each pass (an exhausted small dataset is repeated, as weighted mixing means).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

import numpy as np

from flopwise.errors import UserError

T = TypeVar("T")


def mix_order(weights: Sequence[float]) -> Iterator[int]:
    """Endless dataset indices whose running counts track `weights` (smooth weighted round-robin)."""
    if not weights or any(not w > 0 for w in weights):
        raise UserError("data.mix: every weight must be > 0")
    total = float(sum(weights))
    current = [0.0] * len(weights)
    while True:
        for i, weight in enumerate(weights):
            current[i] += weight
        chosen = max(range(len(weights)), key=current.__getitem__)
        current[chosen] -= total
        yield chosen


def _passes(items: Sequence[T], seed: int) -> Iterator[T]:
    rng = np.random.default_rng(seed)
    while True:
        for index in rng.permutation(len(items)):
            yield items[int(index)]


def mix(datasets: Sequence[Sequence[T]], weights: Sequence[float], count: int, seed: int = 0) -> list[T]:
    """`count` examples drawn from `datasets` in the proportions of `weights`."""
    if len(datasets) != len(weights):
        raise UserError(f"data.mix: {len(datasets)} datasets but {len(weights)} weights")
    for number, items in enumerate(datasets):
        if not items:
            raise UserError(f"data.mix: dataset {number} has no examples")
    streams = [_passes(items, seed + number) for number, items in enumerate(datasets)]
    order = mix_order(weights)
    return [next(streams[next(order)]) for _ in range(count)]
