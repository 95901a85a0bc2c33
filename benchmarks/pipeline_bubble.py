"""Benchmark: the pipeline bubble measured on CPU against the planner's, as compute per micro-batch grows.

A 2-stage 1F1B pipeline (4 llama blocks, seq 64, 4 micro-batches of 2 sequences, fp32,
gloo, one thread per process) is trained for 8 steps at three widths. Each run reports
the planner's `bubble_fraction` and the measured idle share of a pass (`flopwise train`'s
predicted_vs_measured.json: 1 - time inside the stages' forward/backward / pass time,
median over passes, mean over ranks). If the gap between them is a fixed cost per
micro-batch message (gloo point-to-point copies and the schedule's Python between
actions), then the idle seconds above the planned bubble, per message, stay about the
same while compute per micro-batch grows, and the measured fraction falls toward the
planned one. Writes JSON (default benchmarks/results/pipeline_bubble.json).

Usage: OMP_NUM_THREADS=1 python benchmarks/pipeline_bubble.py [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from tiny_runs import train_and_compare, write_corpus

WIDTHS = (32, 128, 256)
STAGES, MICRO_BATCHES, STEPS = 2, 4, 8


def config(root: Path, hidden: int) -> dict:
    return {
        "model": {"n_layers": 4, "hidden": hidden, "n_heads": 4, "max_seq_len": 64},
        "data": {"paths": [str(root / "text")], "cache_dir": str(root / "cache"), "vocab_size": 320,
                 "seq_len": 64, "prefetch": 2, "tokenizer_train_bytes": 200000},
        "parallel": {"strategy": "pipeline", "nproc_per_node": STAGES, "pipeline_microbatches": MICRO_BATCHES},
        "training": {"max_steps": STEPS, "micro_batch_size": 2, "warmup_steps": 1, "eval_every": STEPS,
                     "eval_batches": 1},
        "checkpoint": {"at_end": False},
        "logging": {"run_dir": str(root / f"h{hidden}"), "progress": False},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "pipeline_bubble.json")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_corpus(root)
        for hidden in WIDTHS:
            cfg = config(root, hidden)
            comparison = train_and_compare(root, cfg)
            if "error" in comparison:
                rows.append({"hidden": hidden, **comparison})
                continue
            measured, predicted = comparison["measured"], comparison["predicted"]
            step = measured["step_seconds"]  # one pass per step here
            excess = measured["bubble_fraction"] - predicted["bubble_fraction"]
            # per rank and pass: one activation or gradient sent and one received per micro-batch
            messages = 2 * MICRO_BATCHES
            rows.append({
                "hidden": hidden,
                "step_seconds": round(step, 4),
                "predicted_bubble_fraction": round(predicted["bubble_fraction"], 3),
                "measured_bubble_fraction": round(measured["bubble_fraction"], 3),
                "idle_seconds_above_planned_per_message": round(excess * step / messages, 5),
            })
            print(rows[-1], flush=True)
    args.out.write_text(json.dumps({
        "setup": f"llama 4 blocks, seq 64, {STAGES}-stage 1F1B, {MICRO_BATCHES} micro-batches of 2, fp32, "
                 f"{STEPS} steps, CPU gloo, 1 thread per process",
        "source": "benchmarks/pipeline_bubble.py; each run's predicted_vs_measured.json",
        "runs": rows,
    }, indent=2) + "\n")


if __name__ == "__main__":
    main()
