"""The training loop, readable top to bottom like nanoGPT's `train.py`.

One optimizer step = `grad_accum` micro-steps. Each micro-step: fetch a batch, forward
under autocast, backward (gradient sync only on the last micro-step), then unscale,
clip, step, update the loss scale, advance the LR schedule. Every step appends a metrics
line per rank; every `eval_every` steps the validation loss is computed on the held-out
split. Everything a step needs lives in one `TrainState`, so checkpointing (save/resume)
and other strategies plug in without touching the loop.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import statistics
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from flopwise.errors import UserError
from flopwise.train.build import BuiltModel, build_training_model
from flopwise.train.config import RunConfig, TrainingConfig
from flopwise.train.faults import StepBoundary
from flopwise.train.metrics import (
    MemoryBytes,
    MetricsWriter,
    RunDisplay,
    SavedActivationMeter,
    measure_memory,
    step_record,
)
from flopwise.train.parallel import (
    DistEnv,
    all_reduce_max,
    all_reduce_mean,
    attach_step_runner,
    barrier,
    data_parallel_shape,
    gradient_sync,
    simulated_straggler_delay,
    wait_for_other_ranks,
)


@dataclass
class TrainState:
    """Everything one optimizer step reads or changes; what a checkpoint must hold."""

    built: BuiltModel
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler | None
    train_loader: object
    step: int = 0
    tokens_seen: int = 0


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
    memory: MemoryBytes
    loss_scale: float | None = None
    sync_wait_seconds: float | None = None


@dataclass
class RunResult:
    """A finished run: losses and timings the end-of-run comparison and tests read."""

    steps: int
    train_losses: list[float] = field(default_factory=list)
    val_losses: list[tuple[int, float]] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    memory: MemoryBytes | None = None
    tokens_per_step: int = 0


def batch_layout(cfg: TrainingConfig, world_size: int, micro_batches_per_pass: int = 1) -> tuple[int, int]:
    """(global batch in sequences, accumulation passes); the global batch defaults to one pass.

    A pass is one micro-batch on each of `world_size` data-parallel ranks, or, for a
    pipeline, `micro_batches_per_pass` micro-batches through the stages.
    """
    per_pass = cfg.micro_batch_size * world_size * micro_batches_per_pass
    global_batch = cfg.global_batch_size or per_pass
    if global_batch % per_pass:
        what = "processes" if micro_batches_per_pass == 1 else "parallel.pipeline_microbatches"
        count = world_size if micro_batches_per_pass == 1 else micro_batches_per_pass
        raise UserError(
            f"training.global_batch_size: {global_batch} is not a multiple of micro_batch_size x {what} "
            f"= {cfg.micro_batch_size} x {count} (allowed e.g. {per_pass}, {2 * per_pass}, {4 * per_pass})"
        )
    return global_batch, global_batch // per_pass


def make_optimizer(module: nn.Module, cfg: TrainingConfig) -> torch.optim.Optimizer:
    """AdamW (Loshchilov & Hutter 2019) or SGD with momentum.

    Weight decay applies to matrices and embeddings only, not to norms and biases
    (nanoGPT's `configure_optimizers`).
    """
    params = [p for p in module.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), foreach=True)
    return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, foreach=True)


def lr_at(step: int, cfg: TrainingConfig) -> float:
    """Linear warm-up, then cosine decay to `min_lr` at `max_steps` (nanoGPT's `get_lr`;
    cosine schedule of Loshchilov & Hutter 2017, SGDR). `step` counts from 0."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.max_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)


def make_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainingConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """The LR schedule as a torch scheduler (its state_dict goes into checkpoints)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_at(step, cfg) / cfg.lr)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy, computed in fp32 whatever the logits dtype."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def train_step(state: TrainState, cfg: RunConfig, env: DistEnv, grad_accum: int, measure: bool = True) -> StepResult:
    """One optimizer step over `grad_accum` micro-batches; returns this rank's measurements."""
    from flopwise.train.precision import autocast_context

    if state.built.runner is not None:  # DeepSpeed's engine or a pipeline schedule drives the step
        return state.built.runner.train_step(state, cfg, env, grad_accum, measure)
    built, optimizer, scaler = state.built, state.optimizer, state.scaler
    model = built.model
    model.train()
    sync = _synchronize(env)
    if env.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(env.device)
    t_start = time.perf_counter()
    data_s = compute_s = 0.0
    loss_sum = 0.0
    saved_bytes = 0
    wait_s = None
    for micro in range(grad_accum):
        t0 = time.perf_counter()
        inputs, targets = next(state.train_loader)
        inputs, targets = inputs.to(env.device, non_blocking=True), targets.to(env.device, non_blocking=True)
        t1 = time.perf_counter()
        meter = SavedActivationMeter(built.module, built.saved_tensor_hooks) if measure and micro == 0 else None
        last = micro == grad_accum - 1
        with gradient_sync(model, enabled=last):
            if last:
                simulated_straggler_delay(env)
            with _forward_context(built, meter), autocast_context(cfg.precision.mode, env.device.type):
                loss = loss_fn(model(inputs), targets) / grad_accum
            if last:
                wait_s = wait_for_other_ranks(env, measure_sync_wait(cfg, env))
            (scaler.scale(loss) if scaler is not None else loss).backward()
        if meter is not None:
            saved_bytes = meter.bytes
        loss_sum += loss.detach().item()
        sync()
        t2 = time.perf_counter()
        data_s += t1 - t0
        compute_s += t2 - t1 - (wait_s if last and wait_s else 0.0)

    t3 = time.perf_counter()
    skipped, grad_norm, scale = _optimizer_step(state, cfg.training)
    memory = (
        measure_memory(built.module, optimizer, saved_bytes, env.device) if measure else MemoryBytes()
    )
    optimizer.zero_grad(set_to_none=True)
    lr = optimizer.param_groups[0]["lr"]
    with warnings.catch_warnings():
        # A skipped (inf/nan) step still advances the schedule; torch warns about that order.
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
        state.scheduler.step()
    sync()
    t4 = time.perf_counter()
    state.step += 1
    return StepResult(
        loss=loss_sum,
        grad_norm=grad_norm,
        lr=lr,
        skipped=skipped,
        data_seconds=data_s,
        compute_seconds=compute_s,
        optimizer_seconds=t4 - t3,
        step_seconds=t4 - t_start,
        memory=memory,
        loss_scale=scale,
        sync_wait_seconds=wait_s,
    )


def measure_sync_wait(cfg: RunConfig, env: DistEnv) -> bool:
    """`training.measure_sync_wait`, defaulting to on when there is more than one rank."""
    flag = cfg.training.measure_sync_wait
    return env.world_size > 1 if flag is None else flag


def _optimizer_step(state: TrainState, cfg: TrainingConfig) -> tuple[bool, float, float | None]:
    """Unscale, clip, step (unless a gradient is inf/nan), update the loss scale.

    The skip decision uses the global gradient norm (a DTensor reduction under FSDP2), so
    every rank skips together even when only one shard holds the inf.
    """
    optimizer, scaler = state.optimizer, state.scaler
    if scaler is not None:
        scaler.unscale_(optimizer)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    grads = [p.grad for p in params if p.grad is not None]
    if cfg.grad_clip is not None:
        norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip, foreach=True)
    else:
        norm = torch.nn.utils.get_total_norm(grads, foreach=True)
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    grad_norm = float(norm)
    skipped, scale = apply_update(optimizer, scaler, math.isfinite(grad_norm))
    return skipped, grad_norm, scale


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


@torch.no_grad()
def evaluate(built: BuiltModel, loader, batches: int, cfg: RunConfig, env: DistEnv) -> float:
    """Mean validation loss over the first `batches` batches of the held-out split, averaged over ranks."""
    from flopwise.train.precision import autocast_context

    if built.runner is not None:
        return built.runner.evaluate(loader, batches, cfg, env)
    model = built.model
    model.eval()
    total = 0.0
    for inputs, targets in loader.val_batches(batches):
        inputs, targets = inputs.to(env.device), targets.to(env.device)
        with autocast_context(cfg.precision.mode, env.device.type):
            total += loss_fn(model(inputs), targets).item()
    model.train()
    return all_reduce_mean([total / batches], env)[0]


def make_loader(cfg: RunConfig, env: DistEnv, prepared, split: str):
    """This rank's loader for 'train' (prefetching) or 'val' (synchronous, repeatable)."""
    from flopwise.train.data import TokenLoader

    dp_rank, dp_size, _ = data_parallel_shape(cfg.parallel, env)
    return TokenLoader(
        prepared, split, seq_len=cfg.data.seq_len, micro_batch_size=cfg.training.micro_batch_size,
        rank=dp_rank, world_size=dp_size, seed=cfg.training.seed,
        prefetch=cfg.data.prefetch if split == "train" else 0,
    )


def build_state(cfg: RunConfig, env: DistEnv, prepared) -> TrainState:
    """A fresh TrainState at step 0: model (seeded), optimizer, schedule, loss scaler, loader."""
    from flopwise.train.precision import make_grad_scaler

    torch.manual_seed(cfg.training.seed)  # same initial weights on every rank
    built = build_training_model(cfg, prepared.vocab_size, env)
    optimizer = make_optimizer(built.module, cfg.training)
    state = TrainState(
        built=built,
        optimizer=optimizer,
        scheduler=make_scheduler(optimizer, cfg.training),
        scaler=make_grad_scaler(cfg.precision, env.device.type),
        train_loader=make_loader(cfg, env, prepared, "train"),
    )
    built.runner = attach_step_runner(state, cfg, env)
    return state


def run_training(cfg: RunConfig, env: DistEnv) -> RunResult:
    """A whole run on this rank: data, model, plan, steps, evals, predicted vs measured."""
    from flopwise.train import prediction
    from flopwise.train.config_loading import dump_config
    from flopwise.train.data import prepare_data

    run_dir = Path(cfg.logging.run_dir)
    if env.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(dump_config(cfg))

    # Rank 0 tokenizes and caches; the others wait, then load the cache.
    prepared = prepare_data(cfg.data) if env.is_main else None
    barrier(env)
    if prepared is None:
        prepared = prepare_data(cfg.data)
    if env.is_main and prepared.tokenizer_path is not None:  # `flopwise export` / `generate` read it here
        shutil.copyfile(prepared.tokenizer_path, run_dir / "tokenizer.json")

    _, dp_size, micro_per_pass = data_parallel_shape(cfg.parallel, env)
    global_batch, grad_accum = batch_layout(cfg.training, dp_size, micro_per_pass)
    state = build_state(cfg, env, prepared)
    built = state.built
    val_loader = make_loader(cfg, env, prepared, "val")
    tokens_per_step = global_batch * cfg.data.seq_len

    forecast = prediction.prepare(cfg, prepared.vocab_size, env, grad_accum)
    display = RunDisplay(
        enabled=env.is_main, total_steps=cfg.training.max_steps, run_dir=run_dir,
        progress=cfg.logging.progress, tensorboard=cfg.logging.tensorboard,
        wandb_project=cfg.logging.wandb_project if cfg.logging.wandb else None,
        config=cfg.model_dump(mode="json"),
    )
    for line in _run_header(cfg, prepared, built, env, global_batch, grad_accum, forecast):
        display.print(line)
    boundary = StepBoundary(cfg, env, prepared.vocab_size, global_batch, report=display.print)
    for line in boundary.resume(state):  # the one place a run continues from a checkpoint
        display.print(line)

    writer = MetricsWriter(run_dir, env.rank, append=state.step > 0)
    result = RunResult(steps=0, tokens_per_step=tokens_per_step)
    if state.step == 0:  # the starting point, so the fall of the validation loss is visible
        result.val_losses.append((0, evaluate(built, val_loader, cfg.training.eval_batches, cfg, env)))
        display.eval(0, result.val_losses[-1][1])
    try:
        while state.step < cfg.training.max_steps:
            step = train_step(state, cfg, env, grad_accum)
            state.tokens_seen += tokens_per_step
            tokens_per_second = tokens_per_step / step.step_seconds
            val_loss = None
            if state.step % cfg.training.eval_every == 0 or state.step == cfg.training.max_steps:
                val_loss = evaluate(built, val_loader, cfg.training.eval_batches, cfg, env)
                result.val_losses.append((state.step, val_loss))
                display.eval(state.step, val_loss)
            record = step_record(
                step=state.step, rank=env.rank, loss=step.loss, lr=step.lr, grad_norm=step.grad_norm,
                tokens_per_second=tokens_per_second, step_seconds=step.step_seconds,
                data_seconds=step.data_seconds, compute_seconds=step.compute_seconds,
                optimizer_seconds=step.optimizer_seconds, tokens_seen=state.tokens_seen, memory=step.memory,
                mfu=forecast.mfu(tokens_per_second), skipped=step.skipped, loss_scale=step.loss_scale,
                val_loss=val_loss, sync_wait_seconds=step.sync_wait_seconds,
            )
            writer.write(record)
            log = state.step % cfg.logging.log_every == 0 or state.step == cfg.training.max_steps
            display.step(record, log)
            result.train_losses.append(step.loss)
            result.step_seconds.append(step.step_seconds)
            result.memory = step.memory
            result.steps = state.step
            boundary.after_step(state, step.loss)  # saves when due; stops on a signal or a NaN loss
        boundary.finish(state)
    finally:
        boundary.close()
        writer.close()
        display.close()
        state.train_loader.close()
        val_loader.close()
    if not result.train_losses:  # resumed at or past max_steps: nothing was trained
        return result
    summary = _measured_summary(result, env)
    comparison = forecast.compare(summary)
    if env.is_main:
        prediction.write_comparison(run_dir, comparison)
        print(prediction.format_comparison(comparison), flush=True)
    return result


def _measured_summary(result: RunResult, env: DistEnv) -> dict:
    """Steady-state speed (median step, slowest rank) and the largest per-rank memory."""
    steady = result.step_seconds[len(result.step_seconds) // 5 :] or result.step_seconds
    median_step = all_reduce_max([statistics.median(steady)], env)[0]
    mem = result.memory or MemoryBytes()
    values = [mem.parameters, mem.gradients, mem.optimizer, mem.saved_activations,
              mem.cuda_peak_allocated or 0]
    values = all_reduce_max([float(v) for v in values], env)
    final_loss = all_reduce_mean([result.train_losses[-1]], env)[0] if result.train_losses else None
    return {
        "step_seconds": median_step,
        "tokens_per_second": result.tokens_per_step / median_step,
        "parameters": int(values[0]),
        "gradients": int(values[1]),
        "optimizer": int(values[2]),
        "activations": int(values[3]),
        "cuda_peak_allocated": int(values[4]) if mem.cuda_peak_allocated is not None else None,
        "final_train_loss": final_loss,
        "val_losses": result.val_losses,
        "steps": result.steps,
    }


def _run_header(cfg, prepared, built, env, global_batch, grad_accum, forecast) -> list[str]:
    # FSDP2 DTensors report global sizes; DeepSpeed ZeRO-3 keeps them in `ds_numel`
    n_params = getattr(built.module, "total_parameters", None) or sum(  # a pipeline stage knows the whole
        getattr(p, "ds_numel", p.numel()) for p in built.module.parameters())
    lines = [
        f"run dir: {cfg.logging.run_dir}",
        f"data: {prepared.train_tokens:,} train / {prepared.val_tokens:,} val tokens, vocab {prepared.vocab_size}",
        f"model: {cfg.model.kind}, ~{n_params / 1e6:.2f}M parameters; batch {global_batch} x {cfg.data.seq_len} "
        f"tokens ({grad_accum} micro-step(s) of {cfg.training.micro_batch_size} per rank)",
    ]
    lines += [f"  {note}" for note in built.notes]
    lines += forecast.notes
    if cfg.training.pruning is not None:
        p = cfg.training.pruning
        lines.append(
            f"note: training.pruning ({p.method}, sparsity {p.sparsity}) is not applied during training; "
            "run `flopwise compress` on the trained model to prune it"
        )
    return lines


def _synchronize(env: DistEnv):
    if env.device.type == "cuda":
        return lambda: torch.cuda.synchronize(env.device)
    return lambda: None


def _forward_context(built: BuiltModel, meter: SavedActivationMeter | None):
    """Saved-tensor hooks for this forward: the meter (which wraps compression if any) or compression alone."""
    if meter is not None and (built.saved_tensor_hooks is not None or built.forward_context is contextlib.nullcontext):
        return meter.measuring()
    return built.forward_context()
