"""The `flopwise` command line: one entry point, one sub-command per capability.

Each capability keeps its commands in its own package (`plan/commands.py`,
`train/commands.py`, ...); this module only registers them. Command modules import
heavy libraries (torch) inside the command functions, so `flopwise plan` stays fast and
works where torch is absent. The typer app itself is built on first use: a plain
`flopwise plan --json` is parsed from the same option table without it (plan/fast_json.py).
"""

from __future__ import annotations

import functools
import sys

from flopwise import __version__
from flopwise.errors import UserError


@functools.lru_cache(maxsize=1)
def build_app():
    """The typer app with every capability's commands registered."""
    import typer

    # Imported when the app is built, not at `import flopwise.cli`: tests and tools import the
    # CLI module without paying for every capability's command module.
    from flopwise.artifacts import commands as artifacts_commands
    from flopwise.catalog import commands as catalog_commands
    from flopwise.compress import commands as compress_commands
    from flopwise.diagnose import commands as diagnose_commands
    from flopwise.evaluate import commands as evaluate_commands
    from flopwise.plan import commands as plan_commands
    from flopwise.report import commands as report_commands
    from flopwise.train import commands as train_commands

    from flopwise.compress.config import parse_compress_config
    from flopwise.config.loading import load_config
    from flopwise.diagnose.analyze import diagnose

    app = typer.Typer(
        name="flopwise",
        help="Plan, train, compress and diagnose large-model training.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    # The composition root: `plan --config` reads a training config with the trainer's own
    # (torch-free) loader, handed in here so that plan never imports train.
    plan_commands.register(app, load_training_config=load_config)
    # ... and `flopwise train` validates a `compress:` section with compress's own parser.
    train_commands.register(app, check_compress=parse_compress_config)
    artifacts_commands.register(app)
    for module in (catalog_commands, compress_commands, diagnose_commands, evaluate_commands):
        module.register(app)
    # ... and `report` renders a diagnosis made by diagnose's own analysis (report never imports diagnose).
    report_commands.register(app, diagnose=diagnose)
    app.command()(version)
    return app


def version() -> None:
    """Print the flopwise version."""
    print(__version__)


def __getattr__(name: str):
    """`flopwise.cli.app` builds the typer app on first access."""
    if name == "app":
        return build_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; a UserError becomes one line on stderr and exit code 2.

    Usage errors (unknown flag, missing argument) are handled by typer/click in
    standalone mode and also exit with code 2.
    """
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        if args[:1] == ["plan"]:
            from flopwise.plan.fast_json import run_json_plan
            from flopwise.plan.launcher_flags import rewrite

            args = ["plan"] + rewrite(args[1:])  # Megatron's / NeMo's recompute flags as --recompute

            if run_json_plan(args[1:]):
                return
        build_app()(args=args, prog_name="flopwise")
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
    except ModuleNotFoundError as err:  # an optional extra that is not installed
        from flopwise.extras import missing_extra_message

        message = missing_extra_message(err)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
