"""What every compression method returns, and the one printer for it: a table, or JSON alone.

Both flows (a task's network, `compress/run.py`; an HF causal-LM folder, `compress/llm.py`)
hand back a `CompressResult`: the record `--json` prints (and the report files hold), plus
the rows and notes the terminal shows. The command prints it without knowing the method.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

# Keys every record holds, whatever the flow: which method ran, which flow's fields follow, where
# the compressed model is, and the thread count every timing used.
COMMON_KEYS = ("method", "flow", "out", "threads")


@dataclass(frozen=True)
class CompressResult:
    """A method's outcome: `record` is the JSON (`COMMON_KEYS`, then the flow's own fields, whose
    names scripts and tests read); the rest is how a terminal shows it."""

    record: dict
    title: str
    columns: tuple[tuple[str, str], ...]  # (header, justify) of each column
    rows: tuple[tuple[str, ...], ...]  # cells, already formatted
    notes: tuple[str, ...] = ()  # lines under the table, printed as they are
    next_step: str = ""  # where the compressed model is and how to use it

    def __post_init__(self):
        missing = [key for key in COMMON_KEYS if key not in self.record]
        if missing:
            raise ValueError(f"a compress record lacks the common keys {missing}")


def print_result(result: CompressResult, as_json: bool = False) -> None:
    """With `as_json`, the record alone on stdout; otherwise the table, its notes and the next step."""
    if as_json:
        print(json.dumps(result.record, indent=2, default=str))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=result.title)
    for header, justify in result.columns:
        table.add_column(header, justify=justify)
    for row in result.rows:
        table.add_row(*row)
    console = Console(width=None if Console().is_terminal else 140)
    console.print(table)
    for line in result.notes:
        console.print(line, markup=False)
    if result.next_step:
        print(result.next_step)
