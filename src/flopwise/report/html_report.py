"""RUN_DIR/report.html: the run report as one self-contained page.

Plots are embedded as base64 PNG and the style is inline, so the file can be mailed,
attached to a ticket or opened offline: it loads nothing from the network and runs no
script. Sections: summary, findings, the four figures, step time per rank, predicted
vs measured, the resolved config and the environment the run ran in.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

from flopwise.runrecord.diagnosis import Diagnosis
from flopwise.runrecord.run_dir import RunDir
from flopwise.runrecord.run_data import COMPONENT_LABELS, COMPONENTS, RunData, is_memory_figure
from flopwise.safe_write import write_file

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1000px;
       padding: 0 1em; color: #222; line-height: 1.45; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ddd; padding-bottom: .2em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: .5em 0; font-size: .92em; }
th, td { border: 1px solid #ddd; padding: .25em .6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
figure { margin: 1em 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: .9em; color: #555; }
pre { background: #f6f8fa; padding: .8em; overflow-x: auto; font-size: .85em; }
.warn { color: #9a6700; } .critical { color: #cf222e; font-weight: bold; } .info { color: #0969da; }
"""


def write_html_report(run: RunData, diagnosis: Diagnosis, figures: dict[str, Path | None],
                      summary: list[tuple[str, str]]) -> Path:
    """Write RUN_DIR/report.html from the same facts as report.md; returns its path."""
    path = RunDir(run.run_dir).report_html
    write_file(path, render_html(run, diagnosis, figures, summary))
    return path


def render_html(run: RunData, diagnosis: Diagnosis, figures: dict[str, Path | None],
                summary: list[tuple[str, str]]) -> str:
    """The page as a string."""
    e = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>Run report: {e(run.run_dir.name)}</title><style>{STYLE}</style></head><body>",
        f"<h1>Run report: {e(run.run_dir.name)}</h1>",
        _table(["", ""], summary, header=False),
        "<h2>Findings</h2>",
    ]
    if diagnosis.findings:
        parts.append("<ul>")
        for f in diagnosis.findings:
            where = f" (rank {f.rank})" if f.rank is not None else ""
            parts.append(f'<li><span class="{e(f.severity)}">{e(f.severity)}</span> <code>{e(f.kind)}</code>{e(where)}: '
                         f"{e(f.message)}.<br>Next: {e(f.next_step)}.</li>")
        parts.append("</ul>")
    else:
        parts.append("<p>No problems found: no straggler, data stall, outlier step, loss spike or plan mismatch.</p>")
    parts += [f"<p><em>Note: {e(note)}.</em></p>" for note in diagnosis.notes]
    parts.append("<h2>Figures</h2>")
    for title, figure in figures.items():
        if figure is None:
            parts.append(f"<p>{e(title)}: nothing to plot in this run.</p>")
            continue
        data = base64.b64encode(figure.read_bytes()).decode("ascii")
        parts.append(f'<figure><img src="data:image/png;base64,{data}" alt="{e(title)}">'
                     f"<figcaption>{e(title)}</figcaption></figure>")
    parts += ["<h2>Step time per rank</h2>", _breakdown(diagnosis)]
    if diagnosis.plan_rows:
        rows = [(r.name, _fmt(r.name, r.predicted), _fmt(r.name, r.measured), f"{r.ratio:.2f}" if r.predicted else "n/a")
                for r in diagnosis.plan_rows]
        parts += ["<h2>Predicted vs measured</h2>", _table(["figure", "predicted", "measured", "measured / predicted"], rows)]
    parts += ["<h2>Config</h2>", "<details><summary>config.yaml as resolved for this run (click to open)</summary>",
              _file_block(RunDir(run.run_dir).config, "no config.yaml in the run directory"), "</details>"]
    parts += ["<h2>Environment</h2>", _environment(RunDir(run.run_dir).environment)]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _table(head: list[str], rows: list[tuple], header: bool = True) -> str:
    e = html.escape
    out = ["<table>"]
    if header:
        out.append("<tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>")
    for row in rows:
        out.append("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in row) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _breakdown(diagnosis: Diagnosis) -> str:
    keys = [k for k in (*COMPONENTS, "other_seconds", "step_seconds") if all(k in b.median for b in diagnosis.breakdown)]
    head = ["rank"] + [f"{COMPONENT_LABELS.get(k, 'step')} ms (median / p90)" for k in keys] + ["tokens/s"]
    rows = [(b.rank, *(f"{b.median[k] * 1e3:.1f} / {b.p90[k] * 1e3:.1f}" for k in keys),
             f"{b.tokens_per_second:,.0f}" if b.tokens_per_second else "n/a") for b in diagnosis.breakdown]
    return _table(head, rows)


def _file_block(path: Path, missing: str) -> str:
    if not path.is_file():
        return f"<p>{html.escape(missing)}</p>"
    return f"<pre>{html.escape(path.read_text(encoding='utf-8', errors='replace'))}</pre>"


def _environment(path: Path) -> str:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "<p>no environment.json in the run directory (written by flopwise train from version 0.2)</p>"
    rows = [(key, json.dumps(value) if isinstance(value, (dict, list)) else value) for key, value in data.items()]
    return _table(["", ""], rows, header=False)


def _fmt(name: str, value: float) -> str:
    if is_memory_figure(name):
        return f"{value / 2**20:,.1f} MiB"
    return f"{value:,.4g}"
