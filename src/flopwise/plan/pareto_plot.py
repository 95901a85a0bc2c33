"""The time-vs-cost figure of `flopwise compare`: every priced (device, count) option as a
point, the Pareto front as a line, matplotlib with the file-only Agg backend.

Takes plain rows (dicts with hardware, devices, days, on_demand_usd, pareto) so it knows
nothing about the planner; imported only when the figure is written.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

DPI = 110


def plot_pareto(rows: list[dict], path: str | Path, title: str, unpriced: list[str] = ()) -> Path:
    """Scatter time (days) against on-demand cost, one colour per device; draw the front; name unpriced devices."""
    path = Path(path)
    fig, ax = plt.subplots(figsize=(8, 5.5))
    priced = [r for r in rows if r.get("on_demand_usd") is not None]
    devices = sorted({r["hardware"] for r in priced})
    cmap = plt.get_cmap("tab20")
    for i, device in enumerate(devices):
        points = [r for r in priced if r["hardware"] == device]
        ax.scatter([r["days"] for r in points], [r["on_demand_usd"] for r in points], s=28,
                   color=cmap(i % 20), label=device)
        for r in points:
            ax.annotate(f"{r['devices']}", (r["days"], r["on_demand_usd"]), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")
    front = sorted((r for r in priced if r.get("pareto")), key=lambda r: r["days"])
    if front:
        ax.plot([r["days"] for r in front], [r["on_demand_usd"] for r in front], color="black", lw=1.2,
                ls="--", marker="o", markersize=10, markerfacecolor="none", label="Pareto front")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("job time (days, log)")
    ax.set_ylabel("on-demand cost (USD, log)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    if devices:
        ax.legend(fontsize=7, loc="best")
    if unpriced:
        fig.text(0.01, 0.01, "no published price, not plotted: " + ", ".join(unpriced), fontsize=7)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
