"""Activation offload: saved activations that wait in host memory between a block's forward and its backward.

A block's saved tensors go to host memory as its forward ends and come back before its backward
starts. Device memory keeps the other blocks' activations and a window of blocks in transit; the host
holds the rest; each offloaded block crosses the host link twice per micro-batch. How the stacks do it:

- Megatron-Core / NeMo (Transformer Engine's CPU offload, `cpu_offloading_num_layers`; NeMo's
  performance scripts' `activation_offload_layers`): the first N blocks of a model chunk, their copies
  on a stream of their own beside the compute, double-buffered (`cpu_offloading_double_buffering`):
  a copy is hidden while it is no longer than the next block's forward (or the previous block's
  backward) it overlaps. Megatron-Core refuses it beside pipeline parallelism and recompute
  (`transformer_config.py`, `__post_init__`); its fine-grained offload (`--offload-modules`) lifts that
  and is planned the same way, per block.
- Composer / llm-foundry (`fsdp_config.activation_cpu_offload`) and plain PyTorch: torch's
  `offload_wrapper` on every block, i.e. `torch.autograd.graph.save_on_cpu(pin_memory=True)`, whose
  copies are queued on the compute stream: nothing hides them, and the backward waits for each reload.

The host link is the device's (`HardwareSpec.host_link_gbs`: PCIe x16 per direction, NVLink-C2C on
Grace systems) at `COPY_EFFICIENCY` of its rate.
"""

from __future__ import annotations

from flopwise.errors import UserError

ALL_BLOCKS = 1_000_000
"""`--offload-activations all`: every block of every stage (more than any model has)."""

WINDOW_BLOCKS = 2
"""Blocks' activations on the device while offloading: the one whose copy to the host is in flight
while the next runs, and the one brought back ahead of its backward (Transformer Engine's double
buffering; torch's save_on_cpu holds one at a time, so the window is an upper bound there)."""

COPY_EFFICIENCY = 0.8
"""Share of a PCIe x16 link's per-direction rate that pinned-memory copies reach (assumption: CUDA's
bandwidthTest and nvbandwidth report about 25-26 GB/s on Gen4 x16 of 32 and 50-55 GB/s on Gen5 of 64)."""

FALLBACK_HOST_BYTES_PER_S = 25e9
"""Host link of a device with no catalogued figure: PCIe Gen4 x16 at `COPY_EFFICIENCY` (assumption)."""

_NONE_WORDS = ("", "0", "none", "no", "false", "off")
_ALL_WORDS = ("all", "yes", "true", "on")


def parse_blocks(value: str | int | None) -> int:
    """Blocks per stage from `--offload-activations`: a count, `all` (true/yes), or none (0/false)."""
    if value is None or isinstance(value, bool):
        return ALL_BLOCKS if value else 0
    if isinstance(value, int):
        blocks = value
    else:
        word = str(value).strip().lower()
        if word in _NONE_WORDS:
            return 0
        if word in _ALL_WORDS:
            return ALL_BLOCKS
        try:
            blocks = int(word)
        except ValueError:
            raise UserError(f"--offload-activations '{value}' must be a number of blocks per stage or 'all'") from None
    if blocks < 0:
        raise UserError(f"--offload-activations must be >= 0 blocks per stage, got {blocks}")
    return min(blocks, ALL_BLOCKS)


def check(lay, model, stack=None) -> None:
    """Refuse what has no saved activations to offload, and what the stack's offload cannot run
    (`Stack.layer_offload_limits`: Megatron-Core's layer-level CPU offload)."""
    if lay.offload_activations and model.arch == "cnn":
        raise UserError(f"--offload-activations: {model.key} is a CNN, whose activation memory is not modelled")
    if not lay.offload_activations or stack is None or not stack.layer_offload_limits:
        return
    source = "(megatron/core/transformer/transformer_config.py; its fine-grained --offload-modules is not planned)"
    if lay.pp > 1:
        raise UserError(f"--offload-activations with --pp {lay.pp}: Megatron-Core's layer-level CPU offload "
                        f"supports no pipeline parallelism {source}")
    if lay.recompute != "none":
        raise UserError(f"--offload-activations with --recompute {lay.recompute}: Megatron-Core's layer-level CPU "
                        f"offload does not work with activation recomputation {source}")
    if lay.offload_activations >= model.n_layers:
        count = "all" if lay.offload_activations == ALL_BLOCKS else lay.offload_activations
        raise UserError(f"--offload-activations {count}: Megatron-Core's layer-level CPU offload takes fewer "
                        f"layers than the model's {model.n_layers} (cpu_offloading_num_layers < num_layers) {source}")


def describe(blocks: int) -> str:
    """'all' or the count, as a plan prints it."""
    return "all" if blocks >= ALL_BLOCKS else str(blocks)


def offloaded_blocks(lay, stage_blocks: int) -> int:
    """Blocks of a stage whose activations are offloaded (the count asked, at most the stage's)."""
    return min(lay.offload_activations, stage_blocks)


def device_and_host_bytes(lay, per_layer: float, inflight_layers: float, stage_blocks: int) -> tuple[float, float]:
    """(bytes the device no longer holds, bytes the host holds) of one stage's saved activations.

    `per_layer` is one block of one micro-batch; `inflight_layers` the stage's blocks times the
    micro-batches it holds at its peak. The offloaded share of them moves to the host but for the
    window in transit (`WINDOW_BLOCKS`), which stays on the device."""
    off = offloaded_blocks(lay, stage_blocks)
    if not off or not stage_blocks or per_layer <= 0:
        return 0.0, 0.0
    moved = per_layer * inflight_layers * off / stage_blocks
    window = min(moved, per_layer * min(WINDOW_BLOCKS, off))
    return moved - window, moved


def host_bytes_per_second(hw) -> float:
    """The device's host link as copies use it."""
    gbs = getattr(hw, "host_link_gbs", None)
    return gbs * 1e9 * COPY_EFFICIENCY if gbs else FALLBACK_HOST_BYTES_PER_S


def exposed_seconds(lay, stage_blocks: int, per_layer: float, forward: float, backward: float,
                    host_bps: float, own_stream: bool) -> float:
    """Seconds per step the copies add to the busiest stage's critical path.

    Each offloaded block of each micro-batch goes out once (forward) and back once (backward).
    On a stream of its own (`own_stream`) a copy hides behind the block computed meanwhile, so only
    what exceeds that block's forward (`forward`) or backward (`backward`, recompute included)
    shows; on the compute stream every copy shows."""
    off = offloaded_blocks(lay, stage_blocks)
    if not off or per_layer <= 0 or host_bps <= 0:
        return 0.0
    copy = per_layer / host_bps
    per_block = 2 * copy if not own_stream else max(0.0, copy - forward) + max(0.0, copy - backward)
    return lay.grad_accum * off * per_block
