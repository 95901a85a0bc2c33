"""Pipeline parallelism as a trainer strategy (`parallel.strategy: pipeline`).

The built-in decoder's blocks are split into `pp x pipeline_virtual_stages` consecutive
stages by the planner's split rule (`parallelize.stage_layer_ranges`); process r of the
stage group runs stages r, r + pp, ... The token (and position) embedding goes with the
first stage, the final norm, the LM head and the loss with the last. Micro-batches flow
through the stages on `torch.distributed.pipelining`'s schedules: 1F1B (PipeDream-Flush,
Narayanan et al. 2021, arXiv:2104.04473, sec. 2.2), which keeps at most `pp` micro-batches
of activations alive per stage; GPipe (Huang et al. 2019, arXiv:1811.06965), which runs
all forwards before all backwards; and the multi-stage interleaved 1F1B, looped BFS and
interleaved zero-bubble schedules. The bubble is (p - 1) / (m + p - 1) of a step for p
stages and m micro-batches with one stage per process; interleaving v stages divides it by v.

On a mesh with other dimensions (PP x FSDP2, PP x TP) the stages talk over the mesh's
"pp" group and every data-parallel replica feeds its own batch; otherwise every rank sees
the same batch. A pass feeds `parallel.pipeline_microbatches` micro-batches of
`training.micro_batch_size`. The loss exists on the last stage and is broadcast within the
stage group for logging; the gradient norm for clipping is summed over stages, so every
stage clips and skips (fp16 inf/nan) together.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from flopwise.train.checkpoint.dcp_state import dcp_state_dict, load_dcp, save_dcp
from flopwise.config.precision import Precision
from flopwise.config.schema import ParallelConfig
from flopwise.train.parallel.distributed import DistEnv, all_reduce_mean
from flopwise.train.metrics import MemoryBytes, measure_memory
from flopwise.train.techniques.precision import autocast_context
from flopwise.train.step import StepHooks, apply_update, loss_fn
from flopwise.train.parallel.strategy_torch import clip_to_norm, end_torch_step, global_grad_norm


_MULTI_STAGE = ("ScheduleInterleaved1F1B", "ScheduleLoopedBFS", "ScheduleInterleavedZeroBubble")


def _schedule_class(name: str):
    """The `torch.distributed.pipelining` schedule a `parallel.pipeline_schedule` names."""
    from torch.distributed import pipelining

    return getattr(pipelining, {
        "1f1b": "Schedule1F1B", "gpipe": "ScheduleGPipe", "interleaved-1f1b": "ScheduleInterleaved1F1B",
        "looped-bfs": "ScheduleLoopedBFS", "interleaved-zero-bubble": "ScheduleInterleavedZeroBubble",
    }[name])


class PipelineStrategy:
    """Supplies this rank's stage, driven through a `torch.distributed.pipelining` schedule, to the one step."""

    memory_before_step = False
    checkpoint_format = "dcp"

    def __init__(self, state, parallel: ParallelConfig, precision: Precision, grad_clip: float | None,
                 env: DistEnv, pp_group=None):
        from torch.distributed.pipelining import PipelineStage

        self.env = env
        self.pp_group = pp_group  # None: every process is one stage of the same pipeline
        pp = dist.get_world_size(pp_group) if env.distributed else 1
        self.module = state.built.module  # `parallelize.PipelineChunks`: this rank's stage(s)
        self.scaler = state.scaler
        self.precision = precision  # the run's resolved precision
        self.grad_clip = grad_clip
        self.microbatches = parallel.pipeline_microbatches
        chunks, indices = list(self.module.chunks), self.module.stage_indices
        num_stages = pp * len(chunks)
        self.last_rank = dist.get_global_rank(pp_group, pp - 1) if pp_group is not None else env.world_size - 1
        self.first, self.last = 0 in indices, num_stages - 1 in indices
        self.stages = [PipelineStage(chunk, stage_index=index, num_stages=num_stages, device=env.device,
                                     group=pp_group)
                       for chunk, index in zip(chunks, indices)]
        self.loss_multiplier = 1.0  # 1 / (micro-batches x passes) x loss scale, set per step
        self.busy_seconds = 0.0  # this rank's time inside its stages' forward/backward, this pass
        self.idle_fractions: list[float] = []  # per training pass: 1 - busy / pass wall time
        for stage in self.stages:
            _time_stage_compute(stage, self)
        schedule = _schedule_class(parallel.pipeline_schedule)
        # Gradients are scaled in the loss (scale_grads=False): the schedule's own scaling
        # would also divide gradients accumulated over earlier passes.
        self.schedule = schedule(self.stages if schedule.__name__ in _MULTI_STAGE else self.stages[0],
                                 n_microbatches=self.microbatches, loss_fn=self._loss, scale_grads=False)
        held = "; ".join(
            f"stage {index} holds blocks {chunk.stage_blocks[0]}..{chunk.stage_blocks[1] - 1}"
            f"{' + embedding' if index == 0 else ''}{' + norm/head/loss' if index == num_stages - 1 else ''}"
            for chunk, index in zip(chunks, indices))
        state.built.notes.append(
            f"pipeline {parallel.pipeline_schedule}: rank {env.rank} of {env.world_size}: {held}; "
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
        dist.broadcast(tensor, src=self.last_rank, group=self.pp_group)
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
            with autocast_context(self.precision, self.env.device.type):
                self.busy_seconds, start = 0.0, time.perf_counter()
                loss = self._run(inputs, targets) / scale
                elapsed = time.perf_counter() - start
                self.idle_fractions.append(max(0.0, 1.0 - self.busy_seconds / elapsed) if elapsed > 0 else 0.0)
                return loss

    def measured_bubble(self) -> float | None:
        """This rank's idle share of a pass (median over passes after the first): the bubble
        plus point-to-point waits, what the planner's bubble fraction predicts."""
        steady = self.idle_fractions[1:] or self.idle_fractions
        return statistics.median(steady) if steady else None

    def clip_and_step(self, state) -> tuple[bool, float, float | None]:
        """Unscale, clip by the norm over all stages, step unless it is inf/nan, update the scale."""
        optimizer, scaler = state.optimizer, state.scaler
        if scaler is not None:
            scaler.unscale_(optimizer)
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        local = global_grad_norm([p.grad for p in params])  # this stage's, whole over its dp/tp peers
        squared = torch.tensor([float(local) ** 2], dtype=torch.float64, device=self.env.device)
        if self.env.world_size > 1:
            dist.all_reduce(squared, group=self.pp_group)  # summed over the stages
        grad_norm = math.sqrt(squared.item()) if math.isfinite(squared.item()) else float("inf")
        finite = math.isfinite(grad_norm)
        if finite and self.grad_clip is not None and params:
            clip_to_norm([p.grad for p in params], self.grad_clip, grad_norm)
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

    def checkpoint_state_dict(self, state) -> dict:
        """This stage's layers and optimizer state as `save_state` writes them, for a background save."""
        return dcp_state_dict(self.module, state.optimizer, per_parameter=True)

    def load_state(self, state, folder: Path) -> None:
        """This stage's layers and optimizer state, read by name from whichever stage wrote them."""
        load_dcp(self.module, state.optimizer, folder, per_parameter=True)

    @torch.no_grad()
    def evaluate(self, loader, batches: int) -> float:
        """Mean validation loss over `batches` passes of `pipeline_microbatches` held-out micro-batches."""
        module = self.module
        module.eval()
        self.loss_multiplier = 1.0 / self.microbatches
        total = 0.0
        val = iter(loader.val_batches(batches * self.microbatches))
        for _ in range(batches):
            inputs, targets = self.fetch(val)
            with autocast_context(self.precision, self.env.device.type):
                total += self._run(inputs, targets, evaluate=True)
        module.train()
        return all_reduce_mean([total / batches], self.env)[0]  # the mean over data-parallel replicas


def _time_stage_compute(stage, strategy: PipelineStrategy) -> None:
    """Add the time `stage` spends computing (forward, backward, deferred weight gradients) to
    `strategy.busy_seconds`; everything else in a pass is waiting."""
    for name in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk"):
        method = getattr(stage, name, None)
        if method is None:
            continue

        @functools.wraps(method)
        def timed(*args, _method=method, **kwargs):
            start = time.perf_counter()
            try:
                return _method(*args, **kwargs)
            finally:
                strategy.busy_seconds += time.perf_counter() - start

        setattr(stage, name, timed)
