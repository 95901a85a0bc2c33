"""Render benchmarks/results/compress_llm.json as the Markdown table BENCHMARKS.md and docs/compress.md show.

Both files hold the table between `<!-- compress_llm:begin -->` and `<!-- compress_llm:end -->`;
`--write` replaces it there, so the two documents always state the same figures as the JSON.

    python benchmarks/render_compress_llm.py [--write]
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "benchmarks" / "results" / "compress_llm.json"
TARGETS = (ROOT / "BENCHMARKS.md", ROOT / "docs" / "compress.md")
BEGIN, END = "<!-- compress_llm:begin -->", "<!-- compress_llm:end -->"


def render(result: dict) -> str:
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
        lines.append(f"- {name}: {c['words']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="replace the table in BENCHMARKS.md and docs/compress.md")
    args = parser.parse_args()
    table = render(json.loads(RESULT.read_text()))
    if not args.write:
        print(table)
        return
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    for target in TARGETS:
        text = target.read_text()
        if BEGIN not in text:
            raise SystemExit(f"{target}: no {BEGIN} marker")
        target.write_text(pattern.sub(lambda _: f"{BEGIN}\n{table}\n{END}", text))
        print(f"updated {target}")


if __name__ == "__main__":
    main()
