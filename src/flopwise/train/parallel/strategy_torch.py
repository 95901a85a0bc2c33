"""Plain torch as a trainer strategy: one process, DDP or FSDP2 (`parallel.strategy` single / ddp / fsdp).

The model is already wrapped (`parallelize.py`); what this strategy adds to the one
`train_step` is the forward under autocast with gradient synchronisation only on the
last micro-step, and the local unscale / clip / step, where the skip decision uses the
global gradient norm (a DTensor reduction under FSDP2), so every rank skips together
even when only one shard holds the inf.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Iterator

import torch
from torch import nn

from flopwise.train.checkpoint.dcp_state import dcp_state_dict, load_dcp, save_dcp
from flopwise.config.precision import Precision
from flopwise.train.parallel.distributed import DistEnv, all_reduce_mean
from flopwise.train.metrics import MemoryBytes, measure_memory
from flopwise.train.techniques.precision import autocast_context
from flopwise.train.data.chat import IGNORE_INDEX
from flopwise.train.step import StepHooks, apply_update, loss_fn, micro_batch_loss, packed_logits, summed_loss


class TorchStrategy:
    """Drives a torch module (plain, DDP or FSDP2) with the trainer's own optimizer and loss scaler."""

    memory_before_step = False
    checkpoint_format = "dcp"

    def __init__(self, state, precision: Precision, grad_clip: float | None, env: DistEnv,
                 sync_every_micro_step: bool = False):
        self.built = state.built
        # `parallel.fsdp_grad_sync=every_micro_step`: FSDP reduce-scatters on every micro-step
        self.sync_every_micro_step = sync_every_micro_step
        self.scaler = state.scaler
        self.precision = precision  # the run's resolved precision
        self.grad_clip = grad_clip
        self.env = env

    def begin_step(self, state) -> float:
        """Training mode; the LR of this step (the schedule advances after the step)."""
        self.built.model.train()
        return state.optimizer.param_groups[0]["lr"]

    def fetch(self, loader) -> tuple[torch.Tensor, torch.Tensor]:
        """The next micro-batch, copied to the device without blocking the host."""
        batch = next(loader)
        if hasattr(batch, "loss_weight"):  # packed chat rows
            return batch.to(self.env.device, non_blocking=True)
        inputs, targets = batch
        return inputs.to(self.env.device, non_blocking=True), targets.to(self.env.device, non_blocking=True)

    def forward_backward(self, batch, micro: int, grad_accum: int, hooks: StepHooks) -> float:
        """Forward under autocast, backward of the (scaled) loss; gradients sync on the last micro-step only
        (or on every one, `sync_every_micro_step`)."""
        built, last = self.built, micro == grad_accum - 1
        with gradient_sync(built.model, enabled=last or self.sync_every_micro_step):
            with hooks.around_forward(built.module, micro, last, built.forward_context, built.saved_tensor_hooks), \
                    autocast_context(self.precision, self.env.device.type):
                loss = micro_batch_loss(built.model, batch, grad_accum)
            hooks.before_backward(self.env, last)
            (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        return loss.detach().item()

    def clip_and_step(self, state) -> tuple[bool, float, float | None]:
        """Unscale, clip, step (unless a gradient is inf/nan), update the loss scale."""
        optimizer, scaler = state.optimizer, state.scaler
        if scaler is not None:
            scaler.unscale_(optimizer)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        norm = global_grad_norm([p.grad for p in params if p.grad is not None])
        grad_norm = float(norm)
        if self.grad_clip is not None:
            clip_to_norm([p.grad for p in params if p.grad is not None], self.grad_clip, grad_norm)
        skipped, scale = apply_update(optimizer, scaler, math.isfinite(grad_norm))
        return skipped, grad_norm, scale

    def memory(self, state, saved_activation_bytes: int) -> MemoryBytes:
        """Parameters, gradients (still present) and optimizer state of this rank."""
        return measure_memory(self.built.module, state.optimizer, saved_activation_bytes, self.env.device)

    def end_step(self, state, skipped: bool) -> None:
        """Drop the gradients; advance the LR schedule unless the loss scaler skipped the step."""
        end_torch_step(state, skipped)

    def save_state(self, state, folder: Path) -> None:
        """Model and optimizer through DCP (plain module names whatever the wrapping)."""
        save_dcp(self.built.model, state.optimizer, folder)

    def checkpoint_state_dict(self, state) -> dict:
        """Model and optimizer as `save_state` writes them, for a background save to stage."""
        return dcp_state_dict(self.built.model, state.optimizer)

    def load_state(self, state, folder: Path) -> None:
        """Model and optimizer from DCP, resharded to this world size."""
        load_dcp(self.built.model, state.optimizer, folder)

    @torch.no_grad()
    def evaluate(self, loader, batches: int) -> float:
        """Mean validation loss over the first `batches` held-out batches, averaged over ranks."""
        model = self.built.model
        model.eval()
        total = 0.0
        packed, packed_sum, packed_tokens = False, 0.0, 0.0
        for batch in loader.val_batches(batches):
            if hasattr(batch, "loss_weight"):  # packed chat rows: the mean over all labelled tokens
                packed, batch = True, batch.to(self.env.device)
                with autocast_context(self.precision, self.env.device.type):
                    packed_sum += summed_loss(packed_logits(model, batch), batch.targets).item()
                packed_tokens += float((batch.targets != IGNORE_INDEX).sum())
                continue
            inputs, targets = batch
            inputs, targets = inputs.to(self.env.device), targets.to(self.env.device)
            with autocast_context(self.precision, self.env.device.type):
                total += loss_fn(model(inputs), targets).item()
        model.train()
        if packed:
            mean_sum, mean_tokens = all_reduce_mean([packed_sum, packed_tokens], self.env)
            return mean_sum / max(mean_tokens, 1.0)
        return all_reduce_mean([total / batches], self.env)[0]


def global_grad_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of all gradients together, the same plain tensor on every rank.

    Under TP x FSDP2 gradients are DTensors on different meshes (2-D (dp, tp) for sharded
    layers, 1-D dp for the rest), which one `get_total_norm` cannot stack; so each mesh's
    group is reduced by DTensor on its own, then the group norms combine locally.
    """
    groups: dict[object, list[torch.Tensor]] = {}
    for grad in grads:
        groups.setdefault(getattr(grad, "device_mesh", None), []).append(grad)
    norms = []
    for group in groups.values():
        norm = torch.nn.utils.get_total_norm(group, foreach=True)
        norms.append(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    if not norms:
        return torch.zeros(())
    return torch.linalg.vector_norm(torch.stack([n.float() for n in norms]))


def clip_to_norm(grads: list[torch.Tensor], max_norm: float, total_norm: float) -> None:
    """Scale gradients so their total norm is at most `max_norm` (as `clip_grads_with_norm_`).

    The coefficient is a Python number, so DTensor gradients on any mesh take it as they
    are (torch's foreach version would need it as a DTensor on each mesh).
    """
    coef = max_norm / (total_norm + 1e-6)
    if coef < 1.0 and math.isfinite(total_norm):
        for grad in grads:
            grad.mul_(coef)


def end_torch_step(state, skipped: bool) -> None:
    """Zero the gradients; advance the LR schedule only after a real update (shared with the pipeline strategy).

    A step the fp16 loss scaler skipped (inf/nan gradients) changed no weight, so the
    schedule stays where it is, as DeepSpeed's engine does (`engine._take_model_step`).
    """
    state.optimizer.zero_grad(set_to_none=True)
    if not skipped:
        state.scheduler.step()


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Turn gradient synchronisation off for non-final accumulation micro-steps.

    DDP: `no_sync()`; FSDP2: `set_requires_gradient_sync(False)` (gradients stay
    unsharded and accumulate locally until the final micro-step reduce-scatters them).
    """
    if enabled:
        yield
        return
    if hasattr(model, "no_sync"):
        with model.no_sync():
            yield
        return
    if hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
        return
    yield
