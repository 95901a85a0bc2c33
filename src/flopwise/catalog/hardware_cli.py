"""`flopwise hardware`: list and show the hardware catalog."""

from __future__ import annotations

import typer


def register_hardware(app: typer.Typer) -> None:
    """Add the `hardware` command."""
