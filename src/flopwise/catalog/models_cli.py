"""`flopwise models`: list and show the models catalog."""

from __future__ import annotations

import typer


def register_models(app: typer.Typer) -> None:
    """Add the `models` command."""
