"""`flopwise plan --json`, `plan --search --json` and a plain `flopwise plan` without the typer
app: the options are parsed from the same table (plan/options.py), so a JSON plan loads
neither typer, rich nor pydantic, and the tables load only what printing them needs (not
every capability's commands). Anything else (help, spot, tables of a search, --profile,
--config, a malformed value) is left to the typer command and its messages.
"""

from __future__ import annotations


def run_json_plan(argv: list[str]) -> bool:
    """Plan and print JSON for a plain `plan --json` command line; False when not one.

    A UserError propagates to `flopwise.cli.main`, which prints its one line.
    """
    from flopwise.plan.options import parse_json_plan_args, runspec_kwargs

    values = parse_json_plan_args(argv, allow_search=True, allow_tables=True)
    if values is None or values["profile"] is not None:  # --profile: the typer command reads it
        return False
    if values.get("config") is not None or values.get("overrides"):
        return False
    from flopwise.plan.flag_bounds import check_flag_values
    from flopwise.plan.planner import build_runspec, plan

    check_flag_values(values)  # the same ranges as the typer command
    if values["search"]:
        out = _search(values)
    elif not values["as_json"]:  # the tables, as the typer command prints them, without building its app
        from flopwise.plan.commands import _checkpoint_cost, _print_checkpoint_cost, print_plan

        result = plan(build_runspec(**runspec_kwargs(values)))
        print_plan(result)
        _print_checkpoint_cost(_checkpoint_cost(result, values))  # --storage-gbps, as the typer command
        return True
    else:
        result = plan(build_runspec(**runspec_kwargs(values)))
        out = result.to_dict()
        if values.get("storage_gbps") is not None:  # --storage-gbps: the checkpoint section
            from flopwise.plan.checkpoint_cost import for_plan

            out["checkpoint"] = for_plan(result, values).to_dict()
    import json

    try:
        print(json.dumps(out, indent=2, allow_nan=False, default=str))
    except BrokenPipeError:  # `flopwise plan --json | head`: the reader left, nothing more to say
        import os
        import sys

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return True


def _search(values: dict) -> dict:
    """`plan --search --json` as the typer command runs it (`commands.plan_command` and
    `search_cli.run_search_and_spot`): the search picks the layout over --gpus devices."""
    from flopwise.errors import UserError
    from flopwise.plan.options import runspec_kwargs, search_devices_and_base
    from flopwise.plan.planner import build_runspec
    from flopwise.plan.search import nothing_fits_message, search_layouts, with_expert_parallel

    devices, o = search_devices_and_base(values)
    spec = with_expert_parallel(build_runspec(**runspec_kwargs(o)), o["search_ep"])
    host = None
    if o["host_memory_gib"] is not None:
        if o["host_memory_gib"] <= 0:
            raise UserError(f"--host-memory-gib must be > 0, got {o['host_memory_gib']}")
        per_node = spec.cluster.devices_per_node or spec.cluster.hardware.devices_per_node or 8
        host = o["host_memory_gib"] / min(devices, per_node)
    result = search_layouts(spec, devices, objective=o["objective"], top=o["top"], host_memory_per_device_gib=host,
                            sequence_parallel=o["sequence_parallel"] is not False)
    if result.best is None:
        raise UserError(nothing_fits_message(result, host_memory_per_device_gib=host))
    return result.to_dict()
