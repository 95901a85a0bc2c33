"""The before/after report of a "model" compression run: the terminal table, JSON, Markdown and a PNG."""

from __future__ import annotations

import json
from pathlib import Path

from flopwise.compress.result import CompressResult

MB = 1e6


def rows(result: dict) -> list[dict]:
    """One flat row per measured model (fp32 baselines, then the compressed one)."""
    metric = result["quality_metric"]
    out = []
    for entry in result["baselines"] + [result["compressed"]]:
        lat = entry["latency"]["by_batch"]
        nonzero = entry.get("nonzero_parameters")
        out.append({
            "model": entry["label"],
            "parameters": entry["parameters"],
            "nonzero_parameters": nonzero if nonzero is not None else entry["parameters"],
            "memory_mb": entry["bytes_in_memory"] / MB,
            "disk_mb": entry["bytes_on_disk"] / MB,
            "latency_b1_ms": lat[0]["median_ms"],
            f"latency_b{lat[-1]['batch_size']}_ms": lat[-1]["median_ms"],
            f"throughput_b{lat[-1]['batch_size']}_per_s": lat[-1]["throughput_per_s"],
            metric: entry["quality"][metric],
        })
    return out


def notes(result: dict) -> list[str]:
    """Plain statements the numbers need: backend, threads, what does not get faster."""
    details = result["details"]
    lines = [f"task {result['task']}, method {result['method']}, backend {result['backend']}"
             f"{' (torch.compile, Inductor freezing)' if result['compiled'] else ''}, {result['threads']} thread(s)"]
    if result.get("quality_basis"):
        lines.append(f"measured on: {result['quality_basis']}")
    if result.get("activation_bits") == 7:
        lines.append("activations kept to 7 bits: this CPU has no VNNI/AMX int8 dot product, and oneDNN's "
                     "AVX2 path sums u8 x s8 pairs in saturating 16-bit lanes (as fbgemm's reduce_range)")
    if "note" in details:
        lines.append(details["note"])
    if "kernel" in details:
        lines.append(details["kernel"])
    if "sparsity" in details:
        lines.append(f"achieved sparsity {details['sparsity']['overall']:.3f} over prunable weights")
    s = result["summary"]
    several = len(result.get("baselines", (None, None))) > 1  # a compiled fp32 baseline as well
    speed = "; ".join(f"batch {b}: {_ratio(v, 'fp32_eager', 'fp32 eager')}"
                      + (f", {_ratio(v, 'fastest_fp32', 'fastest fp32')}" if several else "")
                      for b, v in s["speedup"].items())
    lines.append(f"speed {speed}")
    lines.append(f"memory {s['memory_ratio']:.2f}x smaller, disk {s['disk_ratio']:.2f}x smaller; "
                 f"{result['quality_metric']} {s['quality_before']:.4f} -> {s['quality_after']:.4f} "
                 f"(relative loss {100 * s['relative_quality_loss']:.2f}%)")
    if "qat_recovery" in s:
        r = s["qat_recovery"]
        recovered = (f"QAT recovers {100 * r['recovered_fraction']:.0f}% of the PTQ loss" if r["recovered_fraction"] is not None
                     else "PTQ lost nothing measurable here, so there is nothing for QAT to recover")
        lines.append(f"same settings, PTQ relative loss {100 * r['ptq_relative_loss']:.2f}%, QAT {100 * r['qat_relative_loss']:.2f}%: {recovered}")
    return lines


def _ratio(entry: dict, key: str, label: str) -> str:
    """"2.10x faster than X", or "no measurable difference from X" when the latency quartile ranges overlap."""
    if not entry.get(f"measurable_vs_{key}", True):
        return f"no measurable difference from {label} (interquartile ranges overlap)"
    ratio = entry[f"vs_{key}"]
    return f"{ratio:.2f}x faster than {label}" if ratio >= 1 else f"{1 / ratio:.2f}x slower than {label}"


def model_result(result: dict, out: Path) -> CompressResult:
    """The record with its before/after table and notes for the terminal (printed by `result.print_result`)."""
    data = rows(result)
    columns = []
    for key in data[0]:
        header = key.replace("_parameters", "").replace("latency_", "").replace("throughput_", "").replace("_per_s", " /s")
        columns.append((header.replace("_ms", " ms").replace("_mb", " MB"), "left" if key == "model" else "right"))
    cells = tuple(tuple(v if isinstance(v, str) else (f"{v:,}" if isinstance(v, int) else f"{v:.4g}") for v in row.values())
                  for row in data)
    return CompressResult(
        record=result,
        title=f"flopwise compress: {result['method']} on {result['task']}",
        columns=tuple(columns),
        rows=cells,
        notes=tuple(f"- {line}" for line in notes(result)),
        next_step=f"compressed model: {out} (load with flopwise.compress.load_compressed({str(out)!r}))",
    )


def write_json(result: dict, path: Path) -> Path:
    """Write the full result (every measurement, per-layer sparsity) as JSON."""
    path.write_text(json.dumps(result, indent=2, default=str), encoding="utf-8")
    return path


PANEL_TITLES = {"disk_mb": "Size on disk", "val_loss": "Validation loss", "accuracy": "Accuracy", "perplexity": "Perplexity"}


def write_plot(result: dict, path: Path) -> Path:
    """Three panels per model: latency at the large batch (p10-p90 bars), size on disk, quality (± its stderr)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = rows(result)
    entries = result["baselines"] + [result["compressed"]]
    names = [r["model"] for r in data]
    metric = result["quality_metric"]
    large = entries[0]["latency"]["by_batch"][-1]["batch_size"]
    spreads = [_spread(e["latency"]["by_batch"][-1]) for e in entries]
    latency_errors = [[below for below, _ in spreads], [above for _, above in spreads]]
    stderr = [e["quality"].get(f"{metric}_stderr") for e in entries]
    panels = [
        (f"Latency at batch {large}", "milliseconds per batch (median; bars p10-p90)",
         [e["latency"]["by_batch"][-1]["median_ms"] for e in entries], latency_errors),
        (PANEL_TITLES["disk_mb"], "megabytes (10^6 bytes)", [r["disk_mb"] for r in data], None),
        (PANEL_TITLES.get(metric, metric), _quality_unit(metric) + ("; bars ± standard error" if all(stderr) else ""),
         [r[metric] for r in data], [[v or 0 for v in stderr]] * 2 if all(stderr) else None),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, (title, unit, values, errors) in zip(axes, panels):
        ax.bar(names, values, yerr=errors, capsize=4, color=["#888888"] * (len(names) - 1) + ["#1f77b4"])
        ax.set_title(title)
        ax.set_ylabel(unit, fontsize=8)
        ax.tick_params(axis="x", rotation=20)
        for i, v in enumerate(values):
            ax.text(i, v, f"{v:.4g}", ha="center", va="bottom", fontsize=8)
    fig.suptitle(f"{result['method']} on {result['task']}: before (grey) and after (blue) "
                 f"({result['backend']}, {result['threads']} thread(s))")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _spread(latency: dict) -> list[float]:
    """[below, above] the median: the measured p10 and p90 as an error bar."""
    return [max(0.0, latency["median_ms"] - latency.get("p10_ms", latency["median_ms"])),
            max(0.0, latency.get("p90_ms", latency["median_ms"]) - latency["median_ms"])]


def _quality_unit(metric: str) -> str:
    return {"val_loss": "cross-entropy, nats per token (lower is better)",
            "accuracy": "share correct (higher is better)"}.get(metric, metric)


def write_report(result: dict, out: Path) -> dict:
    """report.json, report.md and report.png in `out`; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    data = rows(result)
    lines = ["| " + " | ".join(data[0]) + " |", "|" + "---|" * len(data[0])]
    for row in data:
        lines.append("| " + " | ".join(str(v) if isinstance(v, (str, int)) else f"{v:.4g}" for v in row.values()) + " |")
    md = out / "report.md"
    md.write_text("\n".join(lines + [""] + [f"- {n}" for n in notes(result)]) + "\n", encoding="utf-8")
    return {"json": str(write_json(result, out / "report.json")), "markdown": str(md), "plot": str(write_plot(result, out / "report.png"))}
