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
summed over stages, so every stage clips and skips (fp16 inf/nan) together.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings

import torch
import torch.distributed as dist
from torch import nn

from flopwise.errors import UserError
from flopwise.train.config import RunConfig
from flopwise.train.metrics import MemoryBytes, SavedActivationMeter, measure_memory
from flopwise.train.parallel import DistEnv, simulated_straggler_delay


def stage_layer_ranges(n_layers: int, stages: int) -> list[tuple[int, int]]:
    """Consecutive [start, stop) block ranges, as even as possible, earlier stages taking the remainder."""
    if stages > n_layers:
        raise UserError(
            f"parallel.strategy: pipeline needs at least one transformer block per stage, but "
            f"model.n_layers={n_layers} is fewer than the {stages} stages (one per process); "
            f"raise model.n_layers or lower parallel.nproc_per_node x parallel.nnodes to <= {n_layers}"
        )
    base, extra = divmod(n_layers, stages)
    ranges, start = [], 0
    for stage in range(stages):
        stop = start + base + (1 if stage < extra else 0)
        ranges.append((start, stop))
        start = stop
    return ranges


class DecoderStage(nn.Module):
    """One stage of the built-in decoder: [embeddings] + blocks[start:stop] + [norm + head]."""

    def __init__(self, decoder: nn.Module, start: int, stop: int, first: bool, last: bool):
        super().__init__()
        self.max_seq_len = decoder.cfg.max_seq_len
        self.first, self.last = first, last
        self.tok_emb = decoder.tok_emb if first else None
        self.pos_emb = decoder.pos_emb if first else None
        self.emb_dropout = decoder.emb_dropout if first else None
        self.blocks = nn.ModuleList(decoder.blocks[start:stop])
        self.final_norm = decoder.final_norm if last else None
        self.lm_head = decoder.lm_head if last else None
        self.uses_rope = hasattr(decoder, "rope_cos")
        if self.uses_rope:
            self.register_buffer("rope_cos", decoder.rope_cos, persistent=False)
            self.register_buffer("rope_sin", decoder.rope_sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids on the first stage, hidden states elsewhere; logits out of the last."""
        T = x.shape[1]
        if self.first:
            ids = x
            x = self.tok_emb(ids)
            if self.pos_emb is not None:
                x = x + self.pos_emb(torch.arange(T, device=ids.device))
            x = self.emb_dropout(x)
        rope = (self.rope_cos[:T], self.rope_sin[:T]) if self.uses_rope else None
        for block in self.blocks:
            x = block(x, rope)
        if self.last:
            x = self.lm_head(self.final_norm(x))
        return x


def stage_module(model: nn.Module, env: DistEnv) -> nn.Module:
    """This rank's stage of the built-in decoder, on this rank's device."""
    if not hasattr(model, "tok_emb") or not hasattr(model, "blocks"):
        raise UserError(
            "parallel.strategy: pipeline splits the built-in decoder (model.kind llama or gpt2); "
            "for model.kind=hf use ddp, fsdp or deepspeed"
        )
    if model.cfg.tie_embeddings and env.world_size > 1:
        raise UserError(
            "model.tie_embeddings: a pipeline puts the embedding and the LM head on different stages, "
            "so they cannot share a weight (set model.tie_embeddings=false, or use ddp, fsdp or deepspeed)"
        )
    start, stop = stage_layer_ranges(len(model.blocks), env.world_size)[env.rank]
    stage = DecoderStage(model, start, stop, first=env.rank == 0, last=env.rank == env.world_size - 1)
    stage.total_parameters = sum(p.numel() for p in model.parameters())  # the whole model, for the run header
    return stage.to(env.device)


class PipelineRunner:
    """Drives this rank's stage through a `torch.distributed.pipelining` schedule."""

    def __init__(self, state, cfg: RunConfig, env: DistEnv):
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        p = cfg.parallel
        self.env = env
        self.microbatches = p.pipeline_microbatches
        self.first, self.last = env.rank == 0, env.rank == env.world_size - 1
        self.stage = PipelineStage(state.built.module, stage_index=env.rank, num_stages=env.world_size,
                                   device=env.device)
        self.loss_multiplier = 1.0  # 1 / (micro-batches x passes) x loss scale, set per step
        schedule = Schedule1F1B if p.pipeline_schedule == "1f1b" else ScheduleGPipe
        # Gradients are scaled in the loss (scale_grads=False): the schedule's own scaling
        # would also divide gradients accumulated over earlier passes.
        self.schedule = schedule(self.stage, n_microbatches=self.microbatches, loss_fn=self._loss,
                                 scale_grads=False)
        lo, hi = stage_layer_ranges(cfg.model.n_layers, env.world_size)[env.rank]
        state.built.notes.append(
            f"pipeline {p.pipeline_schedule}: stage {env.rank} of {env.world_size} holds blocks {lo}..{hi - 1}"
            f"{' + embedding' if self.first else ''}{' + norm/head/loss' if self.last else ''}, "
            f"{self.microbatches} micro-batches per pass"
        )

    def _loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        from flopwise.train.loop import loss_fn

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

    def _next_pass(self, loader) -> tuple[torch.Tensor, torch.Tensor]:
        batches = [next(loader) for _ in range(self.microbatches)]
        inputs = torch.cat([b[0] for b in batches]).to(self.env.device)
        targets = torch.cat([b[1] for b in batches]).to(self.env.device)
        return inputs, targets

    def train_step(self, state, cfg: RunConfig, env: DistEnv, grad_accum: int, measure: bool = True):
        """One optimizer step: `grad_accum` schedule passes, then a stage-global clip and step."""
        from flopwise.train.loop import StepResult
        from flopwise.train.precision import autocast_context

        module, optimizer, scaler = state.built.module, state.optimizer, state.scaler
        module.train()
        if scaler is not None:
            # The loss (scaled in `_loss`) lives on the last stage only; `scale()` once on every
            # stage creates the scaler's scale tensor, which `unscale_` needs on each of them.
            scaler.scale(torch.zeros((), device=env.device))
        t_start = time.perf_counter()
        data_s = compute_s = 0.0
        loss_sum = 0.0
        saved_bytes = 0
        for micro in range(grad_accum):
            t0 = time.perf_counter()
            inputs, targets = self._next_pass(state.train_loader)
            t1 = time.perf_counter()
            scale = scaler.get_scale() if scaler is not None else 1.0
            self.loss_multiplier = scale / (self.microbatches * grad_accum)
            if micro == grad_accum - 1:
                simulated_straggler_delay(env)
            meter = SavedActivationMeter(module) if measure and micro == 0 else None
            with meter.measuring() if meter is not None else contextlib.nullcontext():
                with autocast_context(cfg.precision.mode, env.device.type):
                    loss_sum += self._run(inputs, targets) / scale
            if meter is not None:
                saved_bytes = meter.bytes
            _synchronize(env)
            t2 = time.perf_counter()
            data_s += t1 - t0
            compute_s += t2 - t1

        t3 = time.perf_counter()
        skipped, grad_norm, loss_scale = self._optimizer_step(state, cfg)
        memory = measure_memory(module, optimizer, saved_bytes, env.device) if measure else MemoryBytes()
        optimizer.zero_grad(set_to_none=True)
        lr = optimizer.param_groups[0]["lr"]
        with warnings.catch_warnings():
            # A skipped (inf/nan) step still advances the schedule, as in the loop; torch warns about that order.
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
            state.scheduler.step()
        _synchronize(env)
        t4 = time.perf_counter()
        state.step += 1
        return StepResult(
            loss=loss_sum, grad_norm=grad_norm, lr=lr, skipped=skipped, data_seconds=data_s,
            compute_seconds=compute_s, optimizer_seconds=t4 - t3, step_seconds=t4 - t_start,
            memory=memory, loss_scale=loss_scale,
        )

    def _optimizer_step(self, state, cfg: RunConfig) -> tuple[bool, float, float | None]:
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
        if finite and cfg.training.grad_clip is not None and params:
            torch.nn.utils.clip_grads_with_norm_(params, cfg.training.grad_clip,
                                                 torch.tensor(grad_norm, device=self.env.device), foreach=True)
        from flopwise.train.loop import apply_update

        skipped, scale = apply_update(optimizer, scaler, finite)
        return skipped, grad_norm, scale

    @torch.no_grad()
    def evaluate(self, loader, batches: int, cfg: RunConfig, env: DistEnv) -> float:
        """Mean validation loss over `batches` passes of `pipeline_microbatches` held-out micro-batches."""
        from flopwise.train.precision import autocast_context

        module = self.stage.submod
        module.eval()
        self.loss_multiplier = 1.0 / self.microbatches
        total = 0.0
        val = iter(loader.val_batches(batches * self.microbatches))
        for _ in range(batches):
            inputs, targets = self._next_pass(val)
            with autocast_context(cfg.precision.mode, env.device.type):
                total += self._run(inputs, targets, evaluate=True)
        module.train()
        return total / batches


def _synchronize(env: DistEnv) -> None:
    """Wait for queued GPU work so host timers measure it (no-op on CPU)."""
    if env.device.type == "cuda":
        torch.cuda.synchronize(env.device)
