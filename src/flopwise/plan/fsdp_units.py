"""Which consecutive transformer blocks share one FSDP2 unit (`parallel.fsdp_unit_mb`).

Every FSDP2 unit costs one all-gather before its forward, another before its backward and
one reduce-scatter, each with a fixed latency (the ring's alpha term) however small the
unit. Grouping consecutive blocks into one unit (`fully_shard([block_a, block_b])`, as
torchtitan allows) pays those fixed costs once per group; the price is memory, since the
current and the prefetched unit are both gathered at once (Zhao et al. 2023, PyTorch FSDP
§3.2, "the rate limiter holds two units").

One rule, read by the trainer (`train/parallel/parallelize.apply_fsdp`, with each block's
real parameter bytes) and by the planner (`timing`, `memory`: blocks of equal size), so the
planned units are the trained ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

MIB = 2**20


def group_blocks(block_bytes: Sequence[float], unit_bytes: float) -> tuple[tuple[int, ...], ...]:
    """Indices of the blocks in each unit, in order: a group closes once its parameter bytes
    reach `unit_bytes` (the last group may be smaller); `unit_bytes` <= 0: one block per unit."""
    groups: list[tuple[int, ...]] = []
    current: list[int] = []
    size = 0.0
    for index, nbytes in enumerate(block_bytes):
        current.append(index)
        size += nbytes
        if unit_bytes <= 0 or size >= unit_bytes * (1 - 1e-9):  # float sums of equal blocks
            groups.append(tuple(current))
            current, size = [], 0.0
    if current:
        groups.append(tuple(current))
    return tuple(groups)


def blocks_per_unit(block_bytes: float, unit_bytes: float, blocks: int) -> int:
    """Blocks in each (but perhaps the last) unit when every block holds `block_bytes`
    (`group_blocks` over equal blocks, without listing them)."""
    if blocks <= 0:
        return 1
    if unit_bytes <= 0 or block_bytes <= 0:
        return 1 if unit_bytes <= 0 else blocks
    return max(1, min(blocks, math.ceil(unit_bytes / block_bytes - 1e-9)))


def unit_count(blocks: int, per_unit: int) -> int:
    """Units that `blocks` equal blocks make at `per_unit` blocks each (the last one may be smaller)."""
    return max(1, math.ceil(max(0, blocks) / max(1, per_unit)))


def parameter_bytes(precision: str, finetune: str = "full") -> float:
    """Bytes per parameter as the trainer holds it before sharding (what `fsdp_unit_mb` counts):
    fp32 (FSDP2 keeps fp32 parameters and casts the gathered copy, `MixedPrecisionPolicy`),
    bf16 under pure bf16, and a fine-tune's frozen base in its compute dtype."""
    if precision == "bf16-true" or (finetune != "full" and precision not in ("fp32", "tf32")):
        return 2.0
    return 4.0


def planned_blocks_per_unit(lay, work, layer_params: float, blocks: int) -> int:
    """Blocks per FSDP2 unit the trainer will group for this layout (`Layout.fsdp_unit_mb`)
    out of `blocks` blocks of `layer_params` parameters each; 1 for other frameworks."""
    if lay.framework != "fsdp" or lay.fsdp_unit_mb <= 0:
        return 1
    return blocks_per_unit(layer_params * parameter_bytes(work.precision, work.finetune),
                           lay.fsdp_unit_mb * MIB, blocks)
