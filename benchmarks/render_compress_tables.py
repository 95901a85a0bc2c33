"""Render benchmarks/results/compress.json and compress_llm.json as the Markdown tables that
BENCHMARKS.md and docs/compress.md show.

Both files hold each table between `<!-- NAME:begin -->` and `<!-- NAME:end -->` (NAME is
`compress` or `compress_llm`); `--write` replaces them there, so the two documents always
state the same figures as the JSON. A speed-up is printed only when the two latency ranges
(quartiles; p10-p90 in records written before quartiles were kept) do not overlap.

    python benchmarks/render_compress_tables.py [--write]
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
TARGETS = (ROOT / "BENCHMARKS.md", ROOT / "docs" / "compress.md")


def _range(entry: dict) -> tuple[float, float]:
    return entry.get("q1_ms", entry["p10_ms"]), entry.get("q3_ms", entry["p90_ms"])


def _speed(base: dict, after: dict) -> str:
    """"2.1x (4.9 -> 2.3 ms)", or "no measurable difference" when the latency ranges overlap."""
    (lo_b, hi_b), (lo_a, hi_a) = _range(base), _range(after)
    ms = f"{base['median_ms']:.2f} -> {after['median_ms']:.2f} ms"
    if not (hi_b < lo_a or hi_a < lo_b):
        return f"no measurable difference ({ms})"
    ratio = base["median_ms"] / after["median_ms"]
    return f"{ratio:.2f}x faster ({ms})" if ratio >= 1 else f"{1 / ratio:.2f}x slower ({ms})"


def render_compress(result: dict) -> str:
    """The INT8 / QAT / pruning / 2:4 table: speed vs fp32 eager at each batch, sizes, quality."""
    machine = result["machine"]
    case0 = next(iter(result["cases"].values()))
    batches = [str(b["batch_size"]) for b in case0["models"][0]["latency"]["by_batch"]]
    ranges = "quartile" if "q1_ms" in case0["models"][0]["latency"]["by_batch"][0] else "p10-p90"
    lines = [
        f"`benchmarks/compress.py` (JSON: `benchmarks/results/compress.json`), {machine['cpu']}, "
        f"{machine['threads']} thread(s), torch {machine['torch']}, torchao {machine.get('torchao', '?')}. "
        f"Speed is the compressed model's median latency against fp32 eager; it is called a difference only "
        f"when the {ranges} ranges of the two do not overlap. {result['note']}.",
        "",
        "| case | method (backend) | " + " | ".join(f"batch {b}" for b in batches)
        + " | memory smaller | disk smaller | quality before -> after |",
        "|---|---|" + "---|" * len(batches) + "---|---|---|",
    ]
    for name, case in result["cases"].items():
        base, after = case["models"][0], case["models"][-1]
        speeds = [_speed(b, a) for b, a in zip(base["latency"]["by_batch"], after["latency"]["by_batch"])]
        s = case["summary"]
        quality = f"{s['quality_before']:.3f} -> {s['quality_after']:.3f}"
        if "qat_recovery" in s and s["qat_recovery"].get("recovered_fraction") is not None:
            quality += f" ({100 * s['qat_recovery']['recovered_fraction']:.0f}% of the PTQ loss recovered)"
        lines.append(f"| {name} | {case['method']} ({case['backend']}) | " + " | ".join(speeds)
                     + f" | {s['memory_ratio']:.2f}x | {s['disk_ratio']:.2f}x | {quality} |")
    return "\n".join(lines)


def render_compress_llm(result: dict) -> str:
    """The table and its conditions, as Markdown."""
    model = result["model"]
    lines = [
        f"`benchmarks/compress_llm.py` (JSON: `benchmarks/results/compress_llm.json`): a "
        f"{model['parameters'] / 1e6:.0f}M-parameter llama-architecture decoder ({model['num_hidden_layers']} x "
        f"{model['hidden_size']}, vocab {model['vocab_size']}, random weights), greedy generation with KV cache, "
        f"batch {result['latency_batch']}, {result['prompt_tokens']}-token prompt + {result['new_tokens']} new tokens, "
        f"{result['threads']} thread(s) pinned, {result['machine']['cpu']}, torch {result['torch']}; "
        f"{result['timer']}.",
        "",
        "| variant | tokens/s median | IQR | blocks | memory (MiB) | disk (MiB) |",
        "|---|---|---|---|---|---|",
    ]
    for name, v in result["variants"].items():
        tps = v["tokens_per_second"]
        lines.append(f"| {name} | {tps['median']:.2f} | {tps['low']:.2f}–{tps['high']:.2f} | {v['blocks']} | "
                     f"{v['memory_bytes'] / 2**20:.0f} | {v['disk_bytes'] / 2**20:.0f} |")
    lines.append("")
    for name, c in result["comparisons"].items():
        method, reference = name.split(" vs ")
        lines.append(f"- {name}: {_llm_speed(result['variants'][reference], result['variants'][method])}")
    return "\n".join(lines)


def _llm_speed(reference: dict, variant: dict) -> str:
    """The same rule as `flopwise.compress.llm_timing.speedup_text`, from the stored quartiles."""
    if variant["q1_s"] <= reference["q3_s"] and reference["q1_s"] <= variant["q3_s"]:
        return "no measurable difference (the interquartile ranges overlap)"
    ratio = reference["median_s"] / variant["median_s"]
    words = f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower"
    return f"{words} (interquartile ranges apart)"


RENDERERS = {"compress": render_compress, "compress_llm": render_compress_llm}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="replace the tables in BENCHMARKS.md and docs/compress.md")
    args = parser.parse_args()
    tables = {name: render(json.loads((RESULTS / f"{name}.json").read_text())) for name, render in RENDERERS.items()}
    if not args.write:
        for name, table in tables.items():
            print(f"## {name}\n\n{table}\n")
        return
    for target in TARGETS:
        text = target.read_text()
        for name, table in tables.items():
            begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
            if begin not in text:
                raise SystemExit(f"{target}: no {begin} marker")
            pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
            text = pattern.sub(lambda _: f"{begin}\n{table}\n{end}", text)
        target.write_text(text)
        print(f"updated {target}")


if __name__ == "__main__":
    main()
