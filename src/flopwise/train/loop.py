"""The training loop, readable top to bottom like nanoGPT's `train.py`.

One optimizer step (`step.train_step`) = `grad_accum` micro-steps of fetch, forward and
backward, then unscale, clip, step, update the loss scale, advance the LR schedule; the
strategy (plain torch, DeepSpeed, pipeline) supplies only what differs. Every step
appends a metrics line per rank; every `eval_every` steps the validation loss is
computed on the held-out split. Everything a step needs lives in one `TrainState`, so
checkpointing (save/resume) and other strategies plug in without touching the loop.
"""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import nn

from flopwise.measure.calibrate import machine_load
from flopwise.train import prediction
from flopwise.train.run_forecast import forecast_line, gpu_config_on_cpu
from flopwise.train.parallel import comm_volume
from flopwise.train.build import BuiltModel, build_strategy, build_training_model
from flopwise.config.resolve import ResolvedRun, resolve_run
from flopwise.config.schema import RunConfig, TrainingConfig
from flopwise.config.loading import dump_config
from flopwise.config.signature import signed_config_text
from flopwise.train.data.chat_loader import ChatLoader
from flopwise.train.data.chat_rows import PreparedChat
from flopwise.train.data.loader import TokenLoader
from flopwise.train.launch.heartbeat import note_step
from flopwise.train.launch.strategy_choice import settle_for_this_device
from flopwise.train.data.prepare import prepare_data
from flopwise.train.parallel.distributed import DistEnv, all_reduce_max, all_reduce_mean, barrier
from flopwise.train.checkpoint.policy import StepBoundary
from flopwise.runrecord.records import MemoryBytes, StepRecord, write_comparison
from flopwise.runrecord.run_dir import RunDir
from flopwise.safe_write import copy_file, make_folder
from flopwise.train.meter_schedule import MeterSchedule
from flopwise.train.metrics import MetricsWriter, RunDisplay
from flopwise.train.techniques.precision import make_grad_scaler, pretrained_precision_default
from flopwise.train.step import Strategy, StepHooks, train_step


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
    strategy: Strategy | None = None  # what the one step calls (`build.build_strategy`)


@dataclass
class RunResult:
    """A finished run: losses and timings the end-of-run comparison and tests read."""

    steps: int
    train_losses: list[float] = field(default_factory=list)
    val_losses: list[tuple[int, float]] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    memory: MemoryBytes | None = None
    tokens_per_step: int = 0
    comm_bytes: dict | None = None  # one step's collective bytes sent by this rank, by dimension and kind


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


def measure_sync_wait(cfg: TrainingConfig, env: DistEnv) -> bool:
    """`training.measure_sync_wait`, defaulting to on when there is more than one rank."""
    flag = cfg.measure_sync_wait
    return env.world_size > 1 if flag is None else flag


def evaluate(state: TrainState, loader, batches: int) -> float:
    """Mean validation loss over the first `batches` held-out batches, the same on every rank."""
    return state.strategy.evaluate(loader, batches)


def make_loader(cfg: RunConfig, env: DistEnv, prepared, split: str, run: ResolvedRun):
    """This rank's loader for 'train' (prefetching) or 'val' (synchronous, repeatable)."""
    if isinstance(prepared, PreparedChat):  # data.mix: packed chat rows, token-weighted per step
        return ChatLoader(prepared, split, micro_batch_size=cfg.training.micro_batch_size,
                          rank=run.mesh.dp_rank_of(env.rank), world_size=run.mesh.dp, seed=cfg.training.seed,
                          grad_accum=run.grad_accum)
    return TokenLoader(
        prepared, split, seq_len=cfg.data.seq_len, micro_batch_size=cfg.training.micro_batch_size,
        rank=run.mesh.dp_rank_of(env.rank), world_size=run.mesh.dp, seed=cfg.training.seed,
        prefetch=cfg.data.prefetch if split == "train" else 0,
    )


def build_state(cfg: RunConfig, env: DistEnv, prepared, run: ResolvedRun | None = None) -> TrainState:
    """A fresh TrainState at step 0: model (seeded), optimizer, schedule, loss scaler, loader, strategy.

    `run`: the run's `ResolvedRun` (None: resolved here for this rank's world).
    """
    run = run if run is not None else resolve_run(cfg, processes=env.world_size)
    torch.manual_seed(cfg.training.seed)  # same initial weights on every rank
    built = build_training_model(cfg, prepared.vocab_size, env, run)
    optimizer = make_optimizer(built.module, cfg.training)
    state = TrainState(
        built=built,
        optimizer=optimizer,
        scheduler=make_scheduler(optimizer, cfg.training),
        scaler=make_grad_scaler(run.precision, cfg.precision, env.device.type),
        train_loader=make_loader(cfg, env, prepared, "train", run),
    )
    state.strategy = build_strategy(state, cfg, env, run)
    return state


def run_training(cfg: RunConfig, env: DistEnv, before_final_forward: Sequence[Callable[[], None]] = ()) -> RunResult:
    """A whole run on this rank: data, model, plan, steps, evals, predicted vs measured.

    `before_final_forward`: callables run before the last forward of every step (tests use
    one to slow a rank down on purpose); a real run has none.
    """
    device_default = pretrained_precision_default(cfg, env.device)  # before anything reads the mode
    if device_default is not None:
        cfg._default_notes.append(device_default)
    choice = settle_for_this_device(cfg, env.world_size)  # parallel.strategy unset: chosen here, not by a launcher
    run = resolve_run(cfg, processes=env.world_size)  # processes, mesh, batch, precision: computed once
    if choice is not None and env.is_main:
        print(choice.line(), flush=True)
    run_dir = Path(cfg.logging.run_dir)
    if env.is_main:
        make_folder(run_dir)
        RunDir(run_dir).write_config(signed_config_text(dump_config(cfg)))

    # Rank 0 tokenizes and caches; the others wait, then load the cache.
    prepared = prepare_data(cfg.data) if env.is_main else None
    barrier(env)
    if prepared is None:
        prepared = prepare_data(cfg.data)
    if env.is_main and prepared.tokenizer_path is not None:  # `flopwise export` / `generate` read it here
        copy_file(prepared.tokenizer_path, RunDir(run_dir).tokenizer)

    grad_accum = run.grad_accum
    state = build_state(cfg, env, prepared, run)
    built = state.built
    val_loader = make_loader(cfg, env, prepared, "val", run)
    tokens_per_step = run.tokens_per_step

    forecast = prediction.prepare(cfg, run, prepared.vocab_size, env)
    display = RunDisplay(
        enabled=env.is_main, total_steps=cfg.training.max_steps, run_dir=run_dir,
        progress=cfg.logging.progress, tensorboard=cfg.logging.tensorboard,
        wandb_project=cfg.logging.wandb_project if cfg.logging.wandb else None,
        config=cfg.model_dump(mode="json"),
    )
    for line in _run_header(cfg, prepared, built, env, run, forecast):
        display.print(line)
    boundary = StepBoundary(cfg, env, prepared.vocab_size, run, report=display.print)
    for line in boundary.resume(state):  # the one place a run continues from a checkpoint
        display.print(line)

    writer = MetricsWriter(run_dir, env.rank, append=state.step > 0)
    meters = MeterSchedule(first_step=state.step, every=cfg.training.measure_every, max_steps=cfg.training.max_steps)
    display.print(meters.header_line())
    sync_wait = measure_sync_wait(cfg.training, env)
    hooks = StepHooks(before_final_forward=tuple(before_final_forward))
    result = RunResult(steps=0, tokens_per_step=tokens_per_step)
    if state.step == 0 and cfg.training.eval_at_start:  # the starting point, when asked: it delays step 1
        result.val_losses.append((0, evaluate(state, val_loader, cfg.training.eval_batches)))
        display.eval(0, result.val_losses[-1][1])
    metered = comm_volume.measuring_step(state.step + 1, cfg.training.max_steps, env.world_size,
                                         cfg.parallel.strategy, cfg.training.compile)
    try:
        while state.step < cfg.training.max_steps:
            hooks.measure = meters.due(state.step + 1)  # the same steps on every rank: the probe is a collective
            hooks.sync_wait = sync_wait and hooks.measure
            if state.step + 1 == metered:  # one step's collectives, counted (its time is left out of the speed)
                with comm_volume.CollectiveBytesMeter(run.mesh) as meter:
                    step = train_step(state, env, grad_accum, hooks)
                result.comm_bytes = meter.to_dict()
            else:
                step = train_step(state, env, grad_accum, hooks)
                result.step_seconds.append(step.step_seconds)
            state.tokens_seen += tokens_per_step
            tokens_per_second = tokens_per_step / step.step_seconds
            val_loss = None
            if state.step % cfg.training.eval_every == 0 or state.step == cfg.training.max_steps:
                val_loss = evaluate(state, val_loader, cfg.training.eval_batches)
                result.val_losses.append((state.step, val_loss))
                display.eval(state.step, val_loss)
            record = StepRecord(
                step=state.step, rank=env.rank, loss=step.loss, lr=step.lr, grad_norm=step.grad_norm,
                tokens_per_second=tokens_per_second, step_seconds=step.step_seconds,
                data_seconds=step.data_seconds, compute_seconds=step.compute_seconds,
                optimizer_seconds=step.optimizer_seconds, tokens_seen=state.tokens_seen, memory=step.memory,
                mfu=forecast.mfu(tokens_per_second), skipped=step.skipped, loss_scale=step.loss_scale,
                val_loss=val_loss, sync_wait_seconds=step.sync_wait_seconds,
            ).to_dict()
            writer.write(record)
            log = state.step % cfg.logging.log_every == 0 or state.step == cfg.training.max_steps
            display.step(record, log)
            result.train_losses.append(step.loss)
            result.memory = step.memory if step.memory is not None else result.memory  # the last measured
            result.steps = state.step
            note_step(state.step)  # carried by this rank's heartbeat (train/launch/heartbeat.py)
            # saves when due; stops on a signal, a NaN loss or endless fp16 overflows
            boundary.after_step(state, step.loss, step.skipped, step.loss_scale)
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
    bubble = getattr(state.strategy, "measured_bubble", lambda: None)()
    if bubble is not None:  # the pipeline's idle share, averaged over ranks
        summary["bubble_fraction"] = all_reduce_mean([bubble], env)[0]
    summary["machine_load"] = {"end": machine_load(), "cpu_count": os.cpu_count(),
                               "own_threads": env.world_size * torch.get_num_threads()
                               if env.device.type == "cpu" else env.world_size}
    comparison = prediction.compare(forecast, summary)
    if env.is_main:
        write_comparison(run_dir, comparison)
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
        "comm_bytes": _largest_comm_bytes(result.comm_bytes, env),
    }


def _largest_comm_bytes(local: dict | None, env: DistEnv) -> dict | None:
    """Collective bytes sent per step by dimension and kind (None: not metered): per dimension,
    those of the rank that sends the most in it (the lowest such rank), so a dimension's
    kinds add up to one rank's traffic, as the planner's busiest-rank figure does."""
    flags = all_reduce_max([0.0 if local is None else 1.0], env)
    if not flags[0]:
        return None
    local = local or {}
    dims = comm_volume.DIMENSIONS
    totals = [float(sum(local.get(dim, {}).values())) for dim in dims]
    largest = all_reduce_max(totals, env)
    # the lowest rank among those sending the most: max of -rank over them
    chosen = all_reduce_max([-float(env.rank) if t == top else -float(env.world_size)
                             for t, top in zip(totals, largest)], env)
    keys = [(dim, kind) for dim in dims for kind in comm_volume.KINDS]
    mine = {dim: -c == env.rank for dim, c in zip(dims, chosen)}
    values = all_reduce_max([float(local.get(dim, {}).get(kind, 0.0)) if mine[dim] else 0.0
                             for dim, kind in keys], env)
    out: dict = {}
    for (dim, kind), value in zip(keys, values):
        if value:
            out.setdefault(dim, {})[kind] = value
    return out


def _run_header(cfg, prepared, built, env, run: ResolvedRun, forecast) -> list[str]:
    # FSDP2 DTensors report global sizes; DeepSpeed ZeRO-3 keeps them in `ds_numel`
    n_params = getattr(built.module, "total_parameters", None) or sum(  # a pipeline stage knows the whole
        getattr(p, "ds_numel", p.numel()) for p in built.module.parameters())
    lines = [
        f"run dir: {cfg.logging.run_dir}",
        f"data: {prepared.train_tokens:,} train / {prepared.val_tokens:,} val tokens, vocab {prepared.vocab_size}"
        if not isinstance(prepared, PreparedChat) else
        f"data: chat mix of {len(cfg.data.mix)} file(s), {len(prepared.train_rows):,} train / "
        f"{len(prepared.val_rows):,} val packed rows, {prepared.train_tokens:,} / {prepared.val_tokens:,} "
        f"tokens with loss (loss_on {cfg.data.loss_on}), vocab {prepared.vocab_size}",
        f"model: {cfg.model.kind}, ~{n_params / 1e6:.2f}M parameters; batch {run.global_batch} x "
        f"{cfg.data.seq_len} tokens ({run.grad_accum} micro-step(s) of {cfg.training.micro_batch_size} per rank)",
    ]
    lines += [f"  {note}" for note in built.notes]
    if cfg.default_notes:
        lines.append("fine-tuning defaults for a pretrained model (give any of them to override):")
        lines += [f"  {note}" for note in cfg.default_notes]
    lines += forecast.notes
    for line in (forecast_line(forecast.plan, forecast.hardware_name),
                 gpu_config_on_cpu(cfg, run.precision, env.device.type,
                                   forecast.plan.time.total_seconds if forecast.plan else None)):
        if line:
            lines.append(line)
    if cfg.training.pruning is not None:
        p = cfg.training.pruning
        lines.append(
            f"note: training.pruning ({p.method}, sparsity {p.sparsity}) is not applied during training; "
            "run `flopwise compress` on the trained model to prune it"
        )
    return lines
