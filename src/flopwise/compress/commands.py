"""CLI commands of flopwise.compress (registered by flopwise.cli).

`flopwise compress CONFIG.yaml` | `flopwise compress RUN_DIR --method ...` |
`flopwise compress --task digits-cnn --method ...`. The command knows no method: it asks the
registry (`compress/methods/`) for the one named and prints what its `run` returns. torch is
imported inside the command only.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from flopwise.compress.methods import Job, get_method, method_help
from flopwise.errors import UserError
from flopwise.artifacts.trust_options import ACCEPT_RUN_OPTION, TRUST_REMOTE_CODE_OPTION
from flopwise.runrecord.run_dir import RunDir

BUILTIN_TASKS = ("digits-cnn", "digits-mlp")


def _is_yaml(target: str) -> bool:
    return target.endswith((".yaml", ".yml"))


def resolve_config(target: Optional[str], options: dict):
    """(CompressConfig, where the model comes from) from the target and the command-line options."""
    from flopwise.compress.config import check_method, parse_compress_config

    if options.get("method") is not None:
        check_method(options["method"])
    set_options = {k: v for k, v in options.items() if v is not None}
    if target is not None and _is_yaml(target):
        from flopwise.config.loading import load_config

        run = load_config(Path(target))
        if run.compress is None and run.training.pruning is None:
            raise UserError(f"{target}: no `compress:` section and no `training.pruning` block; nothing to compress")
        cfg = parse_compress_config({**(run.compress or {}), **set_options}, run.training.pruning, source=target)
        source = run.logging.run_dir if (cfg.task or "lm") == "lm" else cfg.task
        return cfg, source
    if target in BUILTIN_TASKS:
        set_options.setdefault("task", target)
    if target is None and "task" not in set_options:
        raise UserError("give a CONFIG.yaml, a RUN_DIR / model.safetensors, or --task (allowed: digits-cnn, digits-mlp)")
    cfg = parse_compress_config(set_options, source="command line")
    if cfg.task in BUILTIN_TASKS:
        return cfg, cfg.task
    return cfg.model_copy(update={"task": "lm"}), Path(target)


def default_out(cfg, source) -> Path:
    """runs/compress-<task>-<method> for built-in tasks; RUN_DIR/compressed/<method> for a run."""
    method = cfg.method.replace(":", "-")
    if cfg.task in BUILTIN_TASKS:
        return Path("runs") / f"compress-{cfg.task}-{method}"
    source = Path(source)
    run_dir = source if source.is_dir() else source.parent
    if run_dir == RunDir(run_dir.parent).export:
        run_dir = run_dir.parent
    return RunDir(run_dir).compressed / method


def json_keeps_stdout(as_json: bool):
    """With --json, stdout carries the JSON alone: progress, and whatever a library imported on the
    way prints there (DeepSpeed's logger binds a stdout handler when accelerate imports it), goes
    to stderr until the work is done."""
    import contextlib

    return contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext()


def register(app: typer.Typer) -> None:
    """Add this package's commands to the top-level app."""

    @app.command("compress")
    def compress(
        target: Optional[str] = typer.Argument(None, help="CONFIG.yaml, RUN_DIR (with export/model.safetensors), or digits-cnn / digits-mlp"),
        method: Optional[str] = typer.Option(None, "--method", "-m", help=method_help()),
        task: Optional[str] = typer.Option(None, "--task", help="built-in task: digits-cnn | digits-mlp"),
        sparsity: Optional[float] = typer.Option(None, "--sparsity", help="prune: fraction of weights set to zero"),
        scope: Optional[str] = typer.Option(None, "--scope", help="prune: layer | global"),
        schedule: Optional[str] = typer.Option(None, "--schedule", help="prune: oneshot | gradual (needs --finetune-steps)"),
        calib_batches: Optional[int] = typer.Option(None, "--calib-batches", help="int8-static/qat: calibration batches"),
        observer: Optional[str] = typer.Option(None, "--observer", help="minmax | histogram | percentile"),
        qat_steps: Optional[int] = typer.Option(None, "--qat-steps", help="qat: fine-tuning steps with fake quantization"),
        finetune_steps: Optional[int] = typer.Option(None, "--finetune-steps", help="prune / 2:4: fine-tuning steps with masks"),
        backend: Optional[str] = typer.Option(None, "--backend", help="auto | pt2e-x86 | torchao | eager"),
        threads: Optional[int] = typer.Option(None, "--threads", help="intra-op threads for latency (default: torch's)"),
        no_compile: bool = typer.Option(False, "--no-compile", help="measure the INT8 graph in eager mode (slow, no INT8 kernels)"),
        latency_batch: Optional[int] = typer.Option(None, "--latency-batch", help="batch of the timed calls (LLM methods: default 1)"),
        new_tokens: Optional[int] = typer.Option(None, "--new-tokens", help="LLM methods: tokens generated per timed call"),
        out: Optional[Path] = typer.Option(None, "--out", help="output folder"),
        as_json: bool = typer.Option(False, "--json", help="print the result as JSON"),
        verbose: bool = typer.Option(False, "--verbose", "-v", help="also show library warnings and logs (kept in OUT/library.log)"),
        trust_remote_code: bool = TRUST_REMOTE_CODE_OPTION,
        accept_run: bool = ACCEPT_RUN_OPTION,
    ) -> None:
        """Compress a model (INT8 PTQ/QAT, pruning, 2:4) and report what was measured before and after."""
        options = dict(
            method=method, task=task, sparsity=sparsity, scope=scope, schedule=schedule, calib_batches=calib_batches,
            observer=observer, qat_steps=qat_steps, finetune_steps=finetune_steps, backend=backend, threads=threads,
            compile=False if no_compile else None, new_tokens=new_tokens,
            latency_batch=latency_batch if latency_batch is None or latency_batch >= 2 else None,
        )
        cfg, source = resolve_config(target, options)
        out_dir = Path(out or cfg.out or default_out(cfg, source))
        from flopwise.compress.result import print_result
        from flopwise.library_noise import route_library_noise

        if latency_batch is not None and latency_batch < 1:
            raise UserError(f"--latency-batch: {latency_batch} must be >= 1")
        method = get_method(cfg.method)
        job = Job(cfg=cfg, source=source, out=out_dir, latency_batch=method.timed_batch(cfg, latency_batch),
                  trust_remote_code=trust_remote_code, accept_run=accept_run,
                  progress=lambda line: print(line, flush=True))

        # torchao logs each CUDA kernel library it cannot load on a CPU, plus deprecation chatter
        # from torch.export: kept in OUT/library.log, shown with -v.
        route_library_noise(out_dir, verbose)
        with json_keeps_stdout(as_json):
            result = method.run(job)
        print_result(result, as_json)
