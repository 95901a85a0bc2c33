"""The run report's figures: one function per PNG, matplotlib with the file-only Agg backend.

Each function takes parsed run data (`flopwise.runrecord.run_data`, a `Diagnosis`) and a path, writes
one PNG and returns the path, or returns None when the run holds nothing to plot (a
run without validation has no val-loss line; one without memory fields no memory bars).
"""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from flopwise.runrecord.diagnosis import Diagnosis  # noqa: E402
from flopwise.runrecord.run_dir import RunDir  # noqa: E402
from flopwise.runrecord.run_data import COMPONENT_LABELS, PlanRow, RunData, finite_number, is_memory_figure  # noqa: E402
from flopwise.runrecord.records import TIME_COMPONENTS  # noqa: E402
from flopwise.safe_write import make_entry_folder, write_file  # noqa: E402

COMPONENT_COLORS = {
    "data_seconds": "#d62728",
    "compute_seconds": "#1f77b4",
    "sync_wait_seconds": "#9467bd",
    "optimizer_seconds": "#2ca02c",
    "other_seconds": "#7f7f7f",
}
DPI = 110


def _save(fig, path: Path) -> Path:
    make_entry_folder(path.parent)
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, dpi=DPI, format=path.suffix.lstrip(".") or "png")
    plt.close(fig)
    return write_file(path, image.getvalue())  # never through a link planted in the run directory


def validation_losses(run: RunData) -> list[tuple[int, float]]:
    """(step, loss) of every evaluation, step 0 (before training) included.

    The step records carry the evaluations made after a step; the one before the first
    step lives only in predicted_vs_measured.json's `measured.val_losses`.
    """
    points = dict(run.val_losses())
    try:
        import json

        data = json.loads(RunDir(run.run_dir).comparison.read_text())
        for item in data.get("measured", {}).get("val_losses", []):
            loss = finite_number(item.get("loss"))
            if loss is not None and isinstance(item.get("step"), int):
                points.setdefault(item["step"], loss)
    except (OSError, ValueError, AttributeError):
        pass
    return sorted(points.items())


def predicted_tokens_per_second(diagnosis: Diagnosis) -> float | None:
    """The plan's tokens/s for the whole run (all ranks), when the run has a prediction."""
    row = next((r for r in diagnosis.plan_rows if r.name == "tokens_per_second"), None)
    return row.predicted if row is not None and row.predicted > 0 else None


def plot_loss(run: RunData, path: Path) -> Path | None:
    """Train loss (mean over ranks per step) and validation loss (step 0 included) against step."""
    by_step: dict[int, list[float]] = {}
    for records in run.steps_by_rank.values():
        for r in records:
            value = finite_number(r.get("loss"))
            if value is not None:
                by_step.setdefault(r["step"], []).append(value)
    if not by_step:
        return None
    steps = sorted(by_step)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, [sum(by_step[s]) / len(by_step[s]) for s in steps], label="train: this step's batch (mean over ranks)",
            lw=1.2)
    val = validation_losses(run)
    if val:
        ax.plot([s for s, _ in val], [v for _, v in val], "o-", label="validation: held-out batches", lw=1.5, ms=5)
    ax.set_xlim(left=0)
    ax.set_xlabel("optimizer step (0 = before training)")
    ax.set_ylabel("cross-entropy loss (nats per token)")
    ax.set_title("Loss: training and validation")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def plot_tokens_per_second(run: RunData, path: Path, predicted: float | None = None) -> Path | None:
    """Tokens/s of every rank against step, and the plan's prediction as a dashed line."""
    fig, ax = plt.subplots(figsize=(7, 4))
    drawn = False
    for rank in run.ranks:
        points = [(r["step"], finite_number(r.get("tokens_per_second"))) for r in run.steps_by_rank[rank]]
        points = [(s, v) for s, v in points if v is not None]
        if points:
            ax.plot([s for s, _ in points], [v for _, v in points], label=f"rank {rank}", lw=1.0)
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    if predicted:
        ax.axhline(predicted, color="black", ls="--", lw=1.2, label=f"predicted by the plan ({predicted:,.0f})")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("tokens / s (all ranks' tokens / this rank's step time)")
    ax.set_title("Throughput per rank vs plan")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(ncol=min(4, len(run.ranks)))
    return _save(fig, path)


def plot_step_breakdown(diagnosis: Diagnosis, path: Path) -> Path | None:
    """Stacked bars of the median step per rank: data wait, forward+backward, sync wait, optimizer, other."""
    keys = [k for k in (*TIME_COMPONENTS, "other_seconds") if all(k in b.median for b in diagnosis.breakdown)]
    if not keys or not diagnosis.breakdown:
        return None
    ranks = [f"rank {b.rank}" for b in diagnosis.breakdown]
    fig, ax = plt.subplots(figsize=(max(7, 1.2 * len(ranks) + 3), 4))
    bottom = [0.0] * len(ranks)
    for key in keys:
        values = [b.median[key] * 1e3 for b in diagnosis.breakdown]
        ax.bar(ranks, values, bottom=bottom, label=COMPONENT_LABELS[key], color=COMPONENT_COLORS[key])
        bottom = [a + v for a, v in zip(bottom, values)]
    stragglers = [f for f in diagnosis.findings if f.kind == "straggler" and f.rank is not None]
    ranks_shown = [b.rank for b in diagnosis.breakdown]
    for f in stragglers:
        if f.rank in ranks_shown:
            x = ranks_shown.index(f.rank)
            excess = f.evidence.get("excess")
            text = f"straggler: rank {f.rank}" + (f" (+{excess:.0%})" if isinstance(excess, float) else "")
            ax.annotate(text, xy=(x, bottom[x]), xytext=(0, 6), textcoords="offset points", ha="center",
                        color="#d62728", fontweight="bold")
    if stragglers:
        ax.set_ylim(top=max(bottom) * 1.15)
    ax.set_ylabel("median ms per step")
    ax.set_title("Step time per rank, median" + ("" if stragglers else ": no straggler"))
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _save(fig, path)


def memory_rows(rows: list[PlanRow]) -> list[PlanRow]:
    """Predicted-vs-measured rows that are memory (bytes) figures."""
    return [r for r in rows if is_memory_figure(r.name)]


def plot_memory(diagnosis: Diagnosis, path: Path) -> Path | None:
    """Memory per component: predicted beside measured when the plan has them, else measured per rank."""
    rows = memory_rows(diagnosis.plan_rows)
    largest = max(
        [max(r.predicted, r.measured) for r in rows]
        + [v for b in diagnosis.breakdown for v in b.peak_memory_bytes.values()]
        + [0]
    )
    unit, scale = ("GiB", 2**30) if largest >= 4 * 2**30 else ("MiB", 2**20)
    fig, ax = plt.subplots(figsize=(7, 4))
    if rows:
        labels = [r.name.split(".")[-1].replace("_", " ") for r in rows]
        xs = range(len(rows))
        ax.bar([x - 0.2 for x in xs], [r.predicted / scale for r in rows], width=0.4, label="predicted", color="#aec7e8")
        ax.bar([x + 0.2 for x in xs], [r.measured / scale for r in rows], width=0.4, label="measured", color="#1f77b4")
        ax.set_xticks(list(xs), labels, rotation=20, ha="right")
        ax.set_title("Memory per component (largest rank): predicted vs measured")
    else:
        comps = sorted({k for b in diagnosis.breakdown for k in b.peak_memory_bytes})
        if not comps:
            plt.close(fig)
            return None
        width = 0.8 / len(diagnosis.breakdown)
        for i, b in enumerate(diagnosis.breakdown):
            ax.bar(
                [c + (i - (len(diagnosis.breakdown) - 1) / 2) * width for c in range(len(comps))],
                [b.peak_memory_bytes.get(k, 0) / scale for k in comps],
                width=width,
                label=f"rank {b.rank}",
            )
        ax.set_xticks(range(len(comps)), [c.replace("_", " ") for c in comps], rotation=20, ha="right")
        ax.set_title("Measured memory per component and rank (no prediction found)")
    ax.set_ylabel(unit)
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    return _save(fig, path)
