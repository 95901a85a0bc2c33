"""The one training step: fetch, forward/backward, clip and step, schedule, timed once.

torchtitan's shape: the step is one function, and what differs per strategy is supplied
by a `Strategy` (plain torch for single/DDP/FSDP2, DeepSpeed's engine, a pipeline
schedule), each in its own `strategy_*.py`. Meters (saved-activation bytes, the wait
for other ranks) and test injections (a slowed rank) are `StepHooks` around the step,
not code inside it; turning them off leaves the step's numbers unchanged.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ContextManager, Iterator, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from flopwise.train.parallel.distributed import DistEnv, wait_for_other_ranks
from flopwise.train.metrics import MemoryBytes, SavedActivationMeter


@dataclass
class StepResult:
    """What one optimizer step measured on this rank."""

    loss: float
    grad_norm: float
    lr: float
    skipped: bool
    data_seconds: float
    compute_seconds: float
    optimizer_seconds: float
    step_seconds: float
    memory: MemoryBytes | None  # None: the meters were off for this step (`StepHooks.measure`)
    loss_scale: float | None = None
    sync_wait_seconds: float | None = None


@dataclass
class StepHooks:
    """Meters and injections around a step; the strategy calls `around_forward` and `before_backward`.

    `measure`: count saved-activation bytes (first micro-step) and memory. `sync_wait`:
    time the wait for the other ranks before the gradient-synchronising backward. The loop
    sets both per step from its `MeterSchedule` (they cost a few % of a step, and what they
    read repeats), so a step's result carries memory and wait only when they were measured.
    `before_final_forward`: callables run before the last forward of each step (a test
    slows one rank with it to make a straggler).
    """

    measure: bool = True
    sync_wait: bool = False
    before_final_forward: tuple[Callable[[], None], ...] = ()
    saved_bytes: int = field(default=0, init=False)
    wait_seconds: float | None = field(default=None, init=False)

    def start(self) -> None:
        """Forget the previous step's readings."""
        self.saved_bytes = 0
        self.wait_seconds = None

    @contextlib.contextmanager
    def around_forward(self, module: nn.Module, micro: int, last: bool,
                       forward_context: Callable[[], ContextManager] = contextlib.nullcontext,
                       saved_tensor_hooks: tuple[Callable, Callable] | None = None) -> Iterator[None]:
        """The forward's context: the injections, then the activation meter (composed with
        activation compression's pack/unpack when it exposes them) or compression alone."""
        if last:
            for hook in self.before_final_forward:
                hook()
        meter = None
        if self.measure and micro == 0 and (saved_tensor_hooks is not None
                                            or forward_context is contextlib.nullcontext):
            meter = SavedActivationMeter(module, saved_tensor_hooks)
        with meter.measuring() if meter is not None else forward_context():
            yield
        if meter is not None:
            self.saved_bytes = meter.bytes

    def before_backward(self, env: DistEnv, last: bool) -> None:
        """On the last micro-step, time the wait for the slowest rank (see `wait_for_other_ranks`)."""
        if last:
            self.wait_seconds = wait_for_other_ranks(env, self.sync_wait)


class Strategy(Protocol):
    """What differs per strategy; everything else is `train_step`.

    `memory_before_step` says where memory is read: after the optimizer step (gradients
    still present) for torch optimizers, before it for DeepSpeed (its step frees them).
    `checkpoint_format` names how `save_state` lays out model and optimizer ("dcp", or
    "deepspeed" for the engine's own files); the manifest records it, and a resume with a
    strategy of another format is refused in one line.
    """

    memory_before_step: bool
    checkpoint_format: str

    def begin_step(self, state) -> float:
        """Put the model in training mode; return the learning rate this step uses."""

    def fetch(self, loader) -> tuple[torch.Tensor, torch.Tensor]:
        """The next (inputs, targets) on this rank's device (or a packed `ChatBatch`, see `micro_batch_loss`)."""

    def forward_backward(self, batch, micro: int, grad_accum: int, hooks: StepHooks) -> float:
        """Forward and backward of one micro-step; returns its share of the step's mean loss."""

    def clip_and_step(self, state) -> tuple[bool, float, float | None]:
        """Unscale, clip, step unless non-finite, update the loss scale: (skipped, grad norm, loss scale)."""

    def memory(self, state, saved_activation_bytes: int) -> MemoryBytes:
        """This rank's memory by component."""

    def end_step(self, state, skipped: bool) -> None:
        """Zero the gradients and advance the LR schedule unless the step was skipped (unless the engine does it)."""

    def evaluate(self, loader, batches: int) -> float:
        """Mean validation loss over `batches` held-out batches, the same on every rank."""

    def save_state(self, state, folder: Path) -> None:
        """Write this rank's part of model and optimizer into `folder` (collective; files fsynced)."""

    def load_state(self, state, folder: Path) -> None:
        """Fill model and optimizer from a checkpoint folder (collective); one UserError line when it does not fit."""


def train_step(state, env: DistEnv, grad_accum: int, hooks: StepHooks | None = None) -> StepResult:
    """One optimizer step over `grad_accum` micro-steps; returns this rank's measurements."""
    strategy: Strategy = state.strategy
    hooks = hooks if hooks is not None else StepHooks()
    hooks.start()
    lr = strategy.begin_step(state)
    if env.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(env.device)
    t_start = time.perf_counter()
    data_s = compute_s = loss_sum = 0.0
    for micro in range(grad_accum):
        t0 = time.perf_counter()
        batch = strategy.fetch(state.train_loader)
        t1 = time.perf_counter()
        loss_sum += strategy.forward_backward(batch, micro, grad_accum, hooks)
        synchronize(env.device)
        t2 = time.perf_counter()
        data_s += t1 - t0
        last_wait = hooks.wait_seconds if micro == grad_accum - 1 and hooks.wait_seconds else 0.0
        compute_s += t2 - t1 - last_wait

    t3 = time.perf_counter()
    memory = None
    if hooks.measure and strategy.memory_before_step:
        memory = strategy.memory(state, hooks.saved_bytes)
    skipped, grad_norm, loss_scale = strategy.clip_and_step(state)
    if hooks.measure and not strategy.memory_before_step:
        memory = strategy.memory(state, hooks.saved_bytes)
    strategy.end_step(state, skipped)
    synchronize(env.device)
    t4 = time.perf_counter()
    state.step += 1
    return StepResult(
        loss=loss_sum, grad_norm=grad_norm, lr=lr, skipped=skipped, data_seconds=data_s,
        compute_seconds=compute_s, optimizer_seconds=t4 - t3, step_seconds=t4 - t_start,
        memory=memory, loss_scale=loss_scale, sync_wait_seconds=hooks.wait_seconds,
    )


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy, computed in fp32 whatever the logits dtype."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def summed_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy summed over the labelled tokens (-100 skipped), in fp32."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="sum")


def packed_logits(model: nn.Module, batch) -> torch.Tensor:
    """Logits of packed rows: positions restart and attention stays inside each document."""
    return model(batch.inputs, position_ids=batch.position_ids, segment_ids=batch.segment_ids)


def micro_batch_loss(model: nn.Module, batch, grad_accum: int) -> torch.Tensor:
    """The micro-batch's share of the step's loss, the tensor to backpropagate.

    Plain (inputs, targets): its mean over tokens / grad_accum (every row is full, so this is the
    step's token mean). Packed chat rows (`chat_loader.ChatBatch`): the summed token losses times
    the batch's `loss_weight`, which makes the step's loss the mean over all its labelled tokens
    on all ranks, whatever the split into micro-batches and ranks.
    """
    if hasattr(batch, "loss_weight"):
        return summed_loss(packed_logits(model, batch), batch.targets) * batch.loss_weight
    inputs, targets = batch
    return loss_fn(model(inputs), targets) / grad_accum


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work so host timers measure it (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def apply_update(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None,
                 finite: bool) -> tuple[bool, float | None]:
    """Step the optimizer if the (global) gradient norm is finite; update the loss scale.

    Returns (skipped, loss scale or None). A non-finite step is skipped and the scale backs
    off (Micikevicius et al. 2018, sec. 3.2). Shared by every strategy that owns its step.
    """
    if scaler is None:
        if finite:
            optimizer.step()
        return not finite, None
    if finite:
        scaler.step(optimizer)
        scaler.update()
    else:
        scaler.update(new_scale=scaler.get_scale() * scaler.get_backoff_factor())
    return not finite, float(scaler.get_scale())
