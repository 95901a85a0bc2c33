"""`flopwise report RUN_DIR`: the plots, the findings and predicted vs measured, twice.

`RUN_DIR/report.md` links the figures under `RUN_DIR/plots/` (relative links: copying the
run directory copies its report); `RUN_DIR/report.html` is one self-contained page with
the figures embedded, plus the config and the environment (see html_report.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from typing import Callable

from flopwise.runrecord.diagnosis import Diagnosis
from flopwise.runrecord.run_data import COMPONENT_LABELS, RunData, is_memory_figure, load_run
from flopwise.report import plots
from flopwise.report.html_report import write_html_report
from flopwise.runrecord.records import TIME_COMPONENTS
from flopwise.runrecord.run_dir import RunDir
from flopwise.safe_write import write_file


@dataclass(frozen=True)
class ReportFiles:
    """What `write_report` wrote."""

    report: Path
    plots: list[Path]
    html: Path | None = None


def write_report(run_dir: str | Path, diagnose: Callable[[RunData], Diagnosis]) -> ReportFiles:
    """Diagnose the run, draw its figures, write report.md and report.html; UserError for a bad run dir.

    `diagnose` is `flopwise.diagnose.analyze.diagnose`, handed in by `flopwise.cli` (report reads
    diagnose's result types from runrecord and never imports the diagnose package).
    """
    run = load_run(run_dir)
    diagnosis = diagnose(run)
    plot_dir = RunDir(run.run_dir).plots
    figures = {
        "Loss": plots.plot_loss(run, plot_dir / "loss.png"),
        "Throughput per rank": plots.plot_tokens_per_second(run, plot_dir / "tokens_per_second.png",
                                                            plots.predicted_tokens_per_second(diagnosis)),
        "Step time breakdown": plots.plot_step_breakdown(diagnosis, plot_dir / "step_breakdown.png"),
        "Memory": plots.plot_memory(diagnosis, plot_dir / "memory.png"),
    }
    path = RunDir(run.run_dir).report
    write_file(path, render_markdown(run, diagnosis, figures))
    page = write_html_report(run, diagnosis, figures, summary_rows(run, diagnosis))
    return ReportFiles(path, [p for p in figures.values() if p is not None], page)


def render_markdown(run: RunData, diagnosis: Diagnosis, figures: dict[str, Path | None]) -> str:
    """The report text: summary, findings, breakdown table, predicted vs measured, figures."""
    lines = [f"# Run report: {run.run_dir.name}", ""]
    lines += _summary(run, diagnosis)
    lines += ["", "## Findings", ""]
    if diagnosis.findings:
        for f in diagnosis.findings:
            where = f" (rank {f.rank})" if f.rank is not None else ""
            lines.append(f"- **{f.severity}** `{f.kind}`{where}: {f.message}.  \n  Next: {f.next_step}.")
    else:
        lines.append("No problems found: no straggler, data stall, outlier step, loss spike or plan mismatch.")
    for note in diagnosis.notes:
        lines += ["", f"_Note: {note}._"]
    lines += ["", "## Step time per rank", ""]
    lines += _breakdown_table(diagnosis)
    if diagnosis.plan_rows:
        lines += ["", "## Predicted vs measured", "", "| figure | predicted | measured | measured / predicted |", "|---|---:|---:|---:|"]
        for r in diagnosis.plan_rows:
            ratio = f"{r.ratio:.2f}" if r.predicted else "n/a"
            lines.append(f"| {r.name} | {_fmt(r.name, r.predicted)} | {_fmt(r.name, r.measured)} | {ratio} |")
    lines += ["", "## Figures", ""]
    for title, fig in figures.items():
        if fig is None:
            lines.append(f"- {title}: nothing to plot in this run.")
        else:
            lines += [f"### {title}", "", f"![{title}]({fig.relative_to(run.run_dir).as_posix()})", ""]
    return "\n".join(lines).rstrip() + "\n"


def _summary(run: RunData, diagnosis: Diagnosis) -> list[str]:
    return ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in summary_rows(run, diagnosis)]


def summary_rows(run: RunData, diagnosis: Diagnosis) -> list[tuple[str, str]]:
    """(label, value) pairs: what ran, how far, the final losses (each saying what it is measured on), speed."""
    first = run.steps_by_rank[run.ranks[0]]
    last = first[-1]
    parallel = run.config.get("parallel") or {}
    precision = run.config.get("precision") or {}
    rows = [
        ("run directory", str(run.run_dir)),
        ("ranks", str(len(run.ranks))),
        ("steps recorded", f"{first[0]['step']}..{last['step']} ({diagnosis.steps} per rank)"),
    ]
    if parallel.get("strategy"):
        rows.append(("strategy", str(parallel["strategy"])))
    if precision.get("mode"):
        rows.append(("precision", str(precision["mode"])))
    loss = last.get("loss")
    if isinstance(loss, (int, float)):
        rows.append((f"final train loss (rank {run.ranks[0]}, on its last training batch)", f"{loss:.4f}"))
    val = plots.validation_losses(run)
    if val:
        rows.append(("validation loss (held-out batches)", f"{val[0][1]:.4f} at step {val[0][0]}, "
                                                           f"{val[-1][1]:.4f} at step {val[-1][0]}"))
    tps = [b.tokens_per_second for b in diagnosis.breakdown if b.tokens_per_second]
    if tps:
        rows.append(("tokens/s per rank (all ranks' tokens / the rank's median step)", ", ".join(f"{v:,.0f}" for v in tps)))
    mfu = [r["mfu"] for r in first if isinstance(r.get("mfu"), (int, float))]
    if mfu:
        rows.append(("MFU (last step)", f"{100 * mfu[-1]:.1f} %"))
    if run.skipped_lines:
        rows.append(("unreadable metric lines skipped", str(run.skipped_lines)))
    return rows


def _breakdown_table(diagnosis: Diagnosis) -> list[str]:
    keys = [k for k in (*TIME_COMPONENTS, "other_seconds", "step_seconds") if all(k in b.median for b in diagnosis.breakdown)]
    head = ["rank"] + [f"{COMPONENT_LABELS.get(k, 'step')} ms (median / p90)" for k in keys] + ["tokens/s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for b in diagnosis.breakdown:
        cells = [str(b.rank)] + [f"{b.median[k] * 1e3:.1f} / {b.p90[k] * 1e3:.1f}" for k in keys]
        cells.append(f"{b.tokens_per_second:,.0f}" if b.tokens_per_second else "n/a")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _fmt(name: str, value: float) -> str:
    if is_memory_figure(name):
        return f"{value / 2**20:,.1f} MiB"
    return f"{value:,.4g}"
