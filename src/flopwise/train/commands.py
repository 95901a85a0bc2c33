"""CLI commands of flopwise.train (registered by flopwise.cli): `flopwise train`."""

from __future__ import annotations

from typing import Optional

import typer

TRAIN_HELP = (
    "Train a model from a YAML config, with `key=value` overrides.\n\n"
    "With no config, trains the embedded default: a small LLaMA-style decoder on the Python standard "
    "library's source, 2 processes with FSDP2 on this CPU, about 2 minutes, then prints predicted vs "
    "measured.\n\n"
    "Examples: `flopwise train` | `flopwise train configs/gpu_single_node.yaml training.max_steps=500` | "
    "`flopwise train parallel.nproc_per_node=1 parallel.strategy=single`"
)


def register(app: typer.Typer) -> None:
    """Add this package's commands to the top-level app."""

    @app.command(name="train", help=TRAIN_HELP)
    def train(
        args: Optional[list[str]] = typer.Argument(
            None, metavar="[CONFIG.yaml] [KEY=VALUE]...", help="A YAML config and/or dotted overrides."
        ),
    ) -> None:
        """Load the config (one-line errors, exit 2) and start the run."""
        from flopwise.train.config_loading import load_config
        from flopwise.train.launch import launch

        config_path, overrides = split_arguments(args or [])
        launch(load_config(config_path, overrides))


def split_arguments(args: list[str]) -> tuple[str | None, list[str]]:
    """The first argument is the config file unless it looks like `key=value`."""
    if args and "=" not in args[0]:
        return args[0], list(args[1:])
    return None, list(args)
