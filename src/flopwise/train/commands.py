"""CLI commands of flopwise.train (registered by flopwise.cli): `flopwise train`, `flopwise launch`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from flopwise.runrecord.run_dir import RunDir


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
        from flopwise.config.loading import load_train_config, split_arguments
        from flopwise.train.launch.start import launch

        set_verbose(verbose)
        config_path, overrides = split_arguments(args or [])
        if resume_from:
            overrides.append(f"checkpoint.resume_from={resume_from}")
        cfg = load_train_config(config_path, overrides, check_compress)
        launch(cfg)
        if not verbose:
            say_where_library_messages_went(Path(cfg.logging.run_dir))

    from flopwise.train.launch.cli import register_launch

    register_launch(app)


def set_verbose(verbose: bool) -> None:
    """Pass `-v` on to this process and to the ranks torchrun starts (they inherit the environment)."""
    import os

    from flopwise.library_noise import VERBOSE_ENV

    if verbose:
        os.environ[VERBOSE_ENV] = "1"


def say_where_library_messages_went(folder: Path) -> None:
    """One line naming the library log files, when libraries said anything."""
    logs = [p for p in RunDir(folder).library_logs() if p.stat().st_size > 0]
    if logs:
        lines = sum(len(p.read_text(encoding="utf-8", errors="replace").splitlines()) for p in logs)
        print(f"library messages ({lines} lines: warnings from torch, DeepSpeed, ...) are in "
              f"{', '.join(str(p) for p in logs)}; -v shows them")
