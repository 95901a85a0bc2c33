"""CLI command of flopwise.catalog: `flopwise hardware` (`flopwise models` counts parameters, so plan owns it)."""

from __future__ import annotations

import typer

from flopwise.catalog.hardware_cli import register_hardware


def register(app: typer.Typer) -> None:
    """Add `hardware` to the top-level app."""
    register_hardware(app)
