"""Tables that stay readable in a narrow terminal (80 columns: CI logs, piped output).

Rich fits a too-wide table by squeezing columns, down to zero width, and truncating cells
with an ellipsis: the rank column of `diagnose` vanished and `flopwise hardware` cut the
very keys a user must type. Commands here build their wide table first; when it does not
fit, they print a narrower layout (fewer columns, shorter headers, or the table folded
into several) instead of letting rich squeeze it.
"""

from __future__ import annotations

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table


def terminal() -> Console:
    """A console as wide as the terminal (or COLUMNS; 80 when output is piped)."""
    return Console()


def fits(console: Console, table: Table) -> bool:
    """True when `table` prints at its natural width without squeezing any column."""
    unconstrained = console.options.update_width(100_000)
    return Measurement.get(console, unconstrained, table).maximum <= console.width


def print_first_that_fits(console: Console, *layouts: Table | list[Table]) -> None:
    """Print the first layout whose tables all fit; the last one when none does."""
    for layout in layouts:
        tables = layout if isinstance(layout, list) else [layout]
        if all(fits(console, t) for t in tables) or layout is layouts[-1]:
            for t in tables:
                console.print(t)
            return
