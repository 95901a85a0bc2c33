"""CLI commands of flopwise.compress (registered by flopwise.cli)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this package's commands to the top-level app."""
