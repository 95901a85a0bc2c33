"""Benchmark: LoRA and QLoRA memory per rank, planned (`plan/finetune.py`) against measured.

A tiny llama (2 blocks, hidden 64, saved with save_pretrained by `tests/hf_fixtures.py`; fp32, one run
each with checkpointing, bf16 autocast and bf16-true) is
fine-tuned for 3 steps on gloo CPU processes, where memory is counted exactly (tensor bytes of
this rank's parameters — an NF4 weight's codes and scales included —, gradients, optimizer state,
and the peak of tensors saved for backward; largest rank). Both columns come from the run's own
`predicted_vs_measured.json`. Writes JSON (default benchmarks/results/finetune_memory.json).

Usage: OMP_NUM_THREADS=1 python benchmarks/finetune_memory.py [--out PATH] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_runs import train_and_compare  # noqa: E402

from tests.hf_fixtures import write_jsonl, write_pretrained  # noqa: E402

RUNS = {
    "lora r8, single": ({"method": "lora", "rank": 8}, {"strategy": "single", "nproc_per_node": 1}),
    "qlora r8, single": ({"method": "qlora", "rank": 8}, {"strategy": "single", "nproc_per_node": 1}),
    "lora r8 qkvo, single": ({"method": "lora", "rank": 8, "target_modules": "qkvo"},
                             {"strategy": "single", "nproc_per_node": 1}),
    "lora r8, checkpointed, single": ({"method": "lora", "rank": 8}, {"strategy": "single", "nproc_per_node": 1},
                                      {"gradient_checkpointing": True}),
    "qlora r8, bf16, single": ({"method": "qlora", "rank": 8}, {"strategy": "single", "nproc_per_node": 1},
                               {"precision": "bf16"}),
    "lora r8, bf16-true, single": ({"method": "lora", "rank": 8}, {"strategy": "single", "nproc_per_node": 1},
                                   {"precision": "bf16-true"}),
    "lora r8, ddp 2": ({"method": "lora", "rank": 8}, {"strategy": "ddp", "nproc_per_node": 2}),
    "qlora r8, fsdp 2": ({"method": "qlora", "rank": 8}, {"strategy": "fsdp", "nproc_per_node": 2,
                                                          "fsdp_min_params": 0}),
}


NOTES = {
    "lora r8, checkpointed, single": "the meter cannot see the block rebuilt in backward (torch.utils.checkpoint "
    "saves it through its own hooks), so measured activations are the forward's peak: the block inputs and the "
    "head's end; the plan's are the block inputs and the larger of the head's end and one rebuilt block, which "
    "benchmarks/saved_tensors_hf_block.py measures directly",
}


def config(root: Path, name: str, finetune: dict, parallel: dict, extra: dict | None = None) -> dict:
    """The run's config: fp32 unless `extra` names a precision; checkpointing when it asks for it."""
    extra = extra or {}
    return {
        "model": {"kind": "hf", "pretrained": str(root / "pretrained")},
        "data": {"hf_dataset": str(root / "data.jsonl"), "cache_dir": str(root / "cache"), "seq_len": 32,
                 "prefetch": 0},
        "parallel": parallel, "finetune": finetune, "precision": {"mode": extra.get("precision", "fp32")},
        "training": {"max_steps": 3, "micro_batch_size": 4, "eval_every": 100, "eval_batches": 1,
                     "gradient_checkpointing": extra.get("gradient_checkpointing", False)},
        "checkpoint": {"at_end": False},
        "logging": {"run_dir": str(root / name.replace(" ", "_").replace(",", "")), "progress": False},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "finetune_memory.json")
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_pretrained(root / "pretrained")
        write_jsonl(root / "data.jsonl")
        for name, (finetune, parallel, *extra) in RUNS.items():
            if args.only and name not in args.only:
                continue
            compared = train_and_compare(root, config(root, name, finetune, parallel, *extra))
            if "error" in compared:
                results[name] = compared
            else:
                results[name] = {**({"note": NOTES[name]} if name in NOTES else {}),
                                 "predicted": compared["predicted"]["memory_bytes"],
                                 "measured": compared["measured"]["memory_bytes"],
                                 "measured_over_predicted": {k: v for k, v in compared["measured_over_predicted"].items()
                                                             if k.startswith("memory")}}
            print(name, json.dumps(results[name].get("measured_over_predicted", results[name])), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
