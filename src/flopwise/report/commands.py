"""CLI command of flopwise.report: `flopwise report RUN_DIR`.

matplotlib is imported by `run_report` only when the command runs, so `flopwise --help`
stays fast.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer, diagnose) -> None:
    """Add `report` to the top-level app; `diagnose` (RunData -> Diagnosis) is diagnose's, handed in by `flopwise.cli`."""

    @app.command("report")
    def report(
        run_dir: Annotated[Path, typer.Argument(help="A run directory written by `flopwise train`.")],
    ) -> None:
        """Write RUN_DIR/report.md and a self-contained RUN_DIR/report.html with loss, throughput, step-breakdown and memory plots."""
        write_and_list(run_dir, diagnose)


def write_and_list(run_dir: Path, diagnose) -> None:
    """Write the report and name every file written."""
    from flopwise.report.run_report import write_report  # matplotlib stays off the CLI's import path

    files = write_report(run_dir, diagnose)
    print(f"wrote {files.report}")
    print(f"wrote {files.html} (self-contained: plots, config and environment in one file)")
    for path in files.plots:
        print(f"wrote {path}")
    sys.stdout.flush()
