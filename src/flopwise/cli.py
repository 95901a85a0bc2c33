"""The `flopwise` command line: one entry point, one sub-command per capability.

Each capability keeps its commands in its own package (`plan/commands.py`,
`train/commands.py`, ...); this module only registers them. Command modules import
heavy libraries (torch) inside the command functions, so `flopwise plan` stays fast and
works where torch is absent.
"""

from __future__ import annotations

import sys

import typer

from flopwise import __version__
from flopwise.errors import UserError

app = typer.Typer(
    name="flopwise",
    help="Plan, train, compress and diagnose large-model training.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _register() -> None:
    # Imported when the app is built, not at `import flopwise.cli`: tests and tools import the
    # CLI module without paying for every capability's command module.
    from flopwise.catalog import commands as catalog_commands
    from flopwise.compress import commands as compress_commands
    from flopwise.diagnose import commands as diagnose_commands
    from flopwise.plan import commands as plan_commands
    from flopwise.report import commands as report_commands
    from flopwise.train import commands as train_commands

    from flopwise.train.config_loading import load_config

    # The composition root: `plan --config` reads a training config with the trainer's own
    # (torch-free) loader, handed in here so that plan never imports train.
    plan_commands.register(app, load_training_config=load_config)
    for module in (catalog_commands, train_commands, compress_commands, diagnose_commands, report_commands):
        module.register(app)


@app.command()
def version() -> None:
    """Print the flopwise version."""
    print(__version__)


_register()


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; a UserError becomes one line on stderr and exit code 2.

    Usage errors (unknown flag, missing argument) are handled by typer/click in
    standalone mode and also exit with code 2.
    """
    try:
        app(args=argv, prog_name="flopwise")
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
