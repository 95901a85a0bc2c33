"""CLI commands of flopwise.catalog: `flopwise hardware` and `flopwise models`."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add `hardware` and `models` to the top-level app."""
    from flopwise.catalog.hardware_cli import register_hardware
    from flopwise.catalog.models_cli import register_models

    register_hardware(app)
    register_models(app)
