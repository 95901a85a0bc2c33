"""`flopwise plan --json` without the typer app: the options are parsed from the same table
(plan/options.py), so the process loads neither typer, rich nor pydantic and costs little
more than the interpreter's start. Anything but a plain `--json` plan (help, search, spot,
tables, a malformed value) is left to the typer command and its messages.
"""

from __future__ import annotations


def run_json_plan(argv: list[str]) -> bool:
    """Plan and print JSON for a plain `plan --json` command line; False when not one.

    A UserError propagates to `flopwise.cli.main`, which prints its one line.
    """
    from flopwise.plan.options import parse_json_plan_args, runspec_kwargs

    values = parse_json_plan_args(argv)
    if values is None or values["profile"] is not None:  # --profile: the typer command reads it
        return False
    from flopwise.plan.flag_bounds import check_flag_values
    from flopwise.plan.planner import build_runspec, plan

    check_flag_values(values)  # the same ranges as the typer command
    result = plan(build_runspec(**runspec_kwargs(values)))
    import json

    data = result.to_dict()
    if values.get("storage_gbps") is not None:  # --storage-gbps: the checkpoint section
        from flopwise.plan.checkpoint_cost import for_plan

        data["checkpoint"] = for_plan(result, values).to_dict()
    try:
        print(json.dumps(data, indent=2, allow_nan=False, default=str))
    except BrokenPipeError:  # `flopwise plan --json | head`: the reader left, nothing more to say
        import os
        import sys

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return True
