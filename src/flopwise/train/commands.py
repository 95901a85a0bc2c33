"""CLI commands of flopwise.train (registered by flopwise.cli): `flopwise train`, `flopwise export`, `flopwise launch`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from flopwise.errors import UserError
from flopwise.train.trust_options import ACCEPT_RUN_OPTION, TRUST_REMOTE_CODE_OPTION

TRAIN_HELP = (
    "Train a model from a YAML config, with `key=value` overrides.\n\n"
    "With no config, trains the embedded default: a small LLaMA-style decoder on the Python standard "
    "library's source, 2 processes with FSDP2 on this CPU (measured: 1 min 44 s on 2 idle cores, "
    "5 min 34 s on 2 busy ones), then prints predicted vs "
    "measured.\n\n"
    "Examples: `flopwise train` | `flopwise train configs/gpu_single_node.yaml training.max_steps=500` | "
    "`flopwise train parallel.nproc_per_node=1 parallel.strategy=single`"
)


def register(app: typer.Typer, check_compress=None) -> None:
    """Add this package's commands to the top-level app.

    `check_compress` validates a config's `compress:` section before any process starts
    (compress's parser, handed in by `flopwise.cli` so that train does not import compress).
    """

    @app.command(name="train", help=TRAIN_HELP)
    def train(
        args: Optional[list[str]] = typer.Argument(
            None, metavar="[CONFIG.yaml] [KEY=VALUE]...", help="A YAML config and/or dotted overrides."
        ),
        resume_from: Optional[str] = typer.Option(
            None, "--resume-from", help="Continue from this checkpoint: step-N, N, or a checkpoint folder."
        ),
        verbose: bool = typer.Option(
            False, "--verbose", "-v", help="Also show library warnings and logs (always kept in RUN_DIR/library*.log)."
        ),
    ) -> None:
        """Load the config (one-line errors, exit 2) and start the run."""
        # the trainer (and torch) load only when the command runs, not at `flopwise --help`
        from flopwise.train.config_loading import load_train_config, split_arguments
        from flopwise.train.launch import launch

        set_verbose(verbose)
        config_path, overrides = split_arguments(args or [])
        if resume_from:
            overrides.append(f"checkpoint.resume_from={resume_from}")
        cfg = load_train_config(config_path, overrides, check_compress)
        launch(cfg)
        if not verbose:
            say_where_library_messages_went(Path(cfg.logging.run_dir))

    from flopwise.train.generate_cli import register_generate

    register_generate(app)
    register_export(app)
    from flopwise.train.launch_cli import register_launch

    register_launch(app)


def set_verbose(verbose: bool) -> None:
    """Pass `-v` on to this process and to the ranks torchrun starts (they inherit the environment)."""
    import os

    from flopwise.train.library_noise import VERBOSE_ENV

    if verbose:
        os.environ[VERBOSE_ENV] = "1"


def say_where_library_messages_went(folder: Path) -> None:
    """One line naming the library log files, when libraries said anything."""
    logs = sorted(p for p in folder.glob("library*.log") if p.stat().st_size > 0)
    if logs:
        lines = sum(len(p.read_text(encoding="utf-8", errors="replace").splitlines()) for p in logs)
        print(f"library messages ({lines} lines: warnings from torch, DeepSpeed, ...) are in "
              f"{', '.join(str(p) for p in logs)}; -v shows them")


EXPORT_HELP = (
    "Consolidate a run's checkpoint into one model.safetensors (+ config.yaml; + an HF folder for HF "
    "models) in RUN_DIR/export/, the input of `flopwise compress RUN_DIR`.\n\n"
    "Examples: `flopwise export runs/default` | `flopwise export runs/default --step 1200 --out /tmp/model`"
)


def register_export(app: typer.Typer) -> None:
    """`flopwise export RUN_DIR [--step N] [--out DIR]`."""

    @app.command(name="export", help=EXPORT_HELP)
    def export(
        run_dir: str = typer.Argument(..., metavar="RUN_DIR", help="A run directory with checkpoints/."),
        step: Optional[int] = typer.Option(None, "--step", help="Export this step (default: the latest valid)."),
        out: Optional[str] = typer.Option(None, "--out", help="Output folder (default: RUN_DIR/export)."),
        as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
        verbose: bool = typer.Option(False, "--verbose", "-v", help="Also show library warnings and logs."),
        trust_remote_code: bool = TRUST_REMOTE_CODE_OPTION,
        accept_run: bool = ACCEPT_RUN_OPTION,
    ) -> None:
        """Verify and consolidate one checkpoint."""
        import json

        from flopwise.train.library_noise import route_library_noise

        if not Path(run_dir).is_dir():  # before the library log would create RUN_DIR/export
            raise UserError(f"{run_dir}: no such run directory")
        route_library_noise(Path(out) if out else Path(run_dir) / "export", verbose)
        from flopwise.train.export import export_checkpoint

        result = export_checkpoint(run_dir, step, out, trust_remote_code=trust_remote_code, accept_run=accept_run)
        if as_json:
            print(json.dumps({"checkpoint": str(result.checkpoint), "out": str(result.out), "step": result.step,
                              "tensors": result.tensors, "parameters": result.parameters,
                              "hf_folder": str(result.hf_folder) if result.hf_folder else None}))
            return
        print(f"exported {result.checkpoint} (step {result.step}, {result.parameters:,} parameters in "
              f"{result.tensors} tensors) to {result.out / 'model.safetensors'}")
        if result.hf_folder:
            print(f"HF folder: {result.hf_folder}")
