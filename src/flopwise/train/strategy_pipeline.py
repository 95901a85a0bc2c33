"""Pipeline parallelism as a trainer strategy (`parallel.strategy: pipeline`).

The built-in decoder's blocks are split into `world_size` consecutive stages, one per
rank: the token (and position) embedding goes with the first stage, the final norm, the
LM head and the loss with the last. Micro-batches flow through the stages on
`torch.distributed.pipelining`'s schedules: 1F1B (PipeDream-Flush, Narayanan et al. 2021,
arXiv:2104.04473, sec. 2.2), which keeps at most `world_size` micro-batches of
activations alive per stage, or GPipe (Huang et al. 2019, arXiv:1811.06965), which runs
all forwards before all backwards. The bubble is (p - 1) / (m + p - 1) of a step for p
stages and m micro-batches in either schedule; more micro-batches shrink it.

Every rank sees the same batch (the data-parallel degree is 1); a pass feeds
`parallel.pipeline_microbatches` micro-batches of `training.micro_batch_size`. The loss
exists on the last stage and is broadcast for logging; the gradient-norm for clipping is
summed over stages, so every stage clips and skips (fp16 inf/nan) together. The stage
itself is the decoder with the other stages' layers removed (`parallelize.apply_pipeline_stage`).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.distributed as dist

from flopwise.train.checkpoint.dcp_state import load_dcp, save_dcp
from flopwise.train.config import ParallelConfig, PrecisionConfig
from flopwise.train.distributed import DistEnv
from flopwise.train.metrics import MemoryBytes, measure_memory
from flopwise.train.precision import autocast_context
from flopwise.train.step import StepHooks, apply_update, loss_fn
from flopwise.train.strategy_torch import end_torch_step


class PipelineStrategy:
    """Supplies this rank's stage, driven through a `torch.distributed.pipelining` schedule, to the one step."""

    memory_before_step = False
    checkpoint_format = "dcp"

    def __init__(self, state, parallel: ParallelConfig, precision: PrecisionConfig, grad_clip: float | None,
                 env: DistEnv):
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        self.env = env
        self.module = state.built.module
        self.scaler = state.scaler
        self.precision_mode = precision.mode
        self.grad_clip = grad_clip
        self.microbatches = parallel.pipeline_microbatches
        self.first, self.last = env.rank == 0, env.rank == env.world_size - 1
        self.stage = PipelineStage(self.module, stage_index=env.rank, num_stages=env.world_size, device=env.device)
        self.loss_multiplier = 1.0  # 1 / (micro-batches x passes) x loss scale, set per step
        schedule = Schedule1F1B if parallel.pipeline_schedule == "1f1b" else ScheduleGPipe
        # Gradients are scaled in the loss (scale_grads=False): the schedule's own scaling
        # would also divide gradients accumulated over earlier passes.
        self.schedule = schedule(self.stage, n_microbatches=self.microbatches, loss_fn=self._loss,
                                 scale_grads=False)
        lo, hi = self.module.stage_blocks
        state.built.notes.append(
            f"pipeline {parallel.pipeline_schedule}: stage {env.rank} of {env.world_size} holds blocks {lo}..{hi - 1}"
            f"{' + embedding' if self.first else ''}{' + norm/head/loss' if self.last else ''}, "
            f"{self.microbatches} micro-batches per pass"
        )

    def _loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return loss_fn(logits, targets) * self.loss_multiplier

    def _run(self, inputs, targets, evaluate: bool = False) -> float:
        """One pass of the schedule; the summed loss this pass (as the loss function returned it), on every rank."""
        args = (inputs,) if self.first else ()
        kwargs = {"target": targets, "losses": []} if self.last else {}
        (self.schedule.eval if evaluate else self.schedule.step)(*args, **kwargs)
        total = float(sum(l.detach().float().item() for l in kwargs["losses"])) if self.last else 0.0
        return self.broadcast_from_last(total)

    def broadcast_from_last(self, value: float) -> float:
        """The last stage's scalar, on every rank (for logging and the summary)."""
        if self.env.world_size == 1:
            return value
        tensor = torch.tensor([value], dtype=torch.float64, device=self.env.device)
        dist.broadcast(tensor, src=self.env.world_size - 1)
        return float(tensor.item())

    def fetch(self, loader) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass: `pipeline_microbatches` micro-batches, concatenated (the schedule splits them)."""
        batches = [next(loader) for _ in range(self.microbatches)]
        inputs = torch.cat([b[0] for b in batches]).to(self.env.device)
        targets = torch.cat([b[1] for b in batches]).to(self.env.device)
        return inputs, targets

    def begin_step(self, state) -> float:
        """Training mode; the LR of this step."""
        self.module.train()
        if self.scaler is not None:
            # The loss (scaled in `_loss`) lives on the last stage only; `scale()` once on every
            # stage creates the scaler's scale tensor, which `unscale_` needs on each of them.
            self.scaler.scale(torch.zeros((), device=self.env.device))
        return state.optimizer.param_groups[0]["lr"]

    def forward_backward(self, batch, micro: int, grad_accum: int, hooks: StepHooks) -> float:
        """One schedule pass (forwards and backwards of all its micro-batches)."""
        inputs, targets = batch
        scale = self.scaler.get_scale() if self.scaler is not None else 1.0
        self.loss_multiplier = scale / (self.microbatches * grad_accum)
        with hooks.around_forward(self.module, micro, micro == grad_accum - 1):
            with autocast_context(self.precision_mode, self.env.device.type):
                return self._run(inputs, targets) / scale

    def clip_and_step(self, state) -> tuple[bool, float, float | None]:
        """Unscale, clip by the norm over all stages, step unless it is inf/nan, update the scale."""
        optimizer, scaler = state.optimizer, state.scaler
        if scaler is not None:
            scaler.unscale_(optimizer)
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        local = torch.nn.utils.get_total_norm([p.grad for p in params], foreach=True) if params else torch.zeros(())
        squared = torch.tensor([float(local) ** 2], dtype=torch.float64, device=self.env.device)
        if self.env.world_size > 1:
            dist.all_reduce(squared)
        grad_norm = math.sqrt(squared.item()) if math.isfinite(squared.item()) else float("inf")
        finite = math.isfinite(grad_norm)
        if finite and self.grad_clip is not None and params:
            torch.nn.utils.clip_grads_with_norm_(params, self.grad_clip,
                                                 torch.tensor(grad_norm, device=self.env.device), foreach=True)
        skipped, scale = apply_update(optimizer, scaler, finite)
        return skipped, grad_norm, scale

    def memory(self, state, saved_activation_bytes: int) -> MemoryBytes:
        """This stage's parameters, gradients and optimizer state."""
        return measure_memory(self.module, state.optimizer, saved_activation_bytes, self.env.device)

    def end_step(self, state, skipped: bool) -> None:
        """Drop the gradients; advance the LR schedule unless the step was skipped."""
        end_torch_step(state, skipped)

    def save_state(self, state, folder: Path) -> None:
        """This stage's layers and their optimizer state through DCP.

        The stage keeps the whole model's module names (absent layers are simply missing,
        blocks keep their global index: `parallelize.StageBlocks`), and the optimizer's
        hyper-parameters are stored per parameter, so the stages' keys are disjoint.
        """
        save_dcp(self.module, state.optimizer, folder, per_parameter=True)

    def load_state(self, state, folder: Path) -> None:
        """This stage's layers and optimizer state, read by name from whichever stage wrote them."""
        load_dcp(self.module, state.optimizer, folder, per_parameter=True)

    @torch.no_grad()
    def evaluate(self, loader, batches: int) -> float:
        """Mean validation loss over `batches` passes of `pipeline_microbatches` held-out micro-batches."""
        module = self.stage.submod
        module.eval()
        self.loss_multiplier = 1.0 / self.microbatches
        total = 0.0
        val = iter(loader.val_batches(batches * self.microbatches))
        for _ in range(batches):
            inputs, targets = self.fetch(val)
            with autocast_context(self.precision_mode, self.env.device.type):
                total += self._run(inputs, targets, evaluate=True)
        module.train()
        return total / batches
