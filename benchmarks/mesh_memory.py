"""Benchmark: the planner's per-rank memory and communication against what `flopwise train` measures, per layout.

Each layout trains a tiny llama (4 blocks, hidden 32, seq 32, vocabulary 320, AdamW, fp32)
for 3 steps on gloo CPU processes, where memory is counted exactly (tensor bytes of this
rank's parameters, gradients, optimizer state, and the peak of tensors saved for backward;
largest rank), and the bytes each rank's collectives send in one step, by mesh dimension
(`train/parallel/comm_volume.py`; largest rank). The run's own `predicted_vs_measured.json` is collected, so both columns
come from the same run. Writes JSON (default benchmarks/results/mesh_memory.json).

Usage: OMP_NUM_THREADS=1 python benchmarks/mesh_memory.py [--out PATH] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from tiny_runs import train_and_compare, write_corpus

LAYOUTS = {
    "ddp 2": {"strategy": "ddp", "nproc_per_node": 2},
    "fsdp 4": {"strategy": "fsdp", "nproc_per_node": 4},
    "tp 2 x fsdp 2 (sp)": {"strategy": "fsdp", "nproc_per_node": 4, "tp": 2, "sequence_parallel": True},
    "hsdp 2 x 2": {"strategy": "fsdp", "nproc_per_node": 4, "dp_replicate": 2},
    "fsdp 2 + cpu offload": {"strategy": "fsdp", "nproc_per_node": 2, "offload": "params"},
    "pipeline 1f1b, 2 stages": {"strategy": "pipeline", "nproc_per_node": 2},
    "pp 2 x fsdp 2 (1f1b)": {"strategy": "pipeline", "nproc_per_node": 4, "pp": 2},
    "pp 2 x tp 2 (1f1b)": {"strategy": "pipeline", "nproc_per_node": 4, "tp": 2},
    "pipeline gpipe, 2 stages": {"strategy": "pipeline", "nproc_per_node": 2, "pipeline_schedule": "gpipe"},
    "pipeline interleaved-1f1b, 2 x 2 stages": {"strategy": "pipeline", "nproc_per_node": 2,
                                               "pipeline_schedule": "interleaved-1f1b", "pipeline_virtual_stages": 2},
    "pipeline looped-bfs, 2 x 2 stages": {"strategy": "pipeline", "nproc_per_node": 2,
                                         "pipeline_schedule": "looped-bfs", "pipeline_virtual_stages": 2},
    "pipeline interleaved-zero-bubble, 2 x 2 stages": {"strategy": "pipeline", "nproc_per_node": 2,
                                                      "pipeline_schedule": "interleaved-zero-bubble",
                                                      "pipeline_virtual_stages": 2},
    # held out: the schedules' activation counts were worked out on 4 micro-batches; 8 checks them
    "pipeline gpipe, 2 stages, 8 micro-batches": {"strategy": "pipeline", "nproc_per_node": 2,
                                                 "pipeline_schedule": "gpipe", "pipeline_microbatches": 8},
    "pipeline looped-bfs, 2 x 2 stages, 8 micro-batches": {"strategy": "pipeline", "nproc_per_node": 2,
                                                          "pipeline_schedule": "looped-bfs",
                                                          "pipeline_virtual_stages": 2, "pipeline_microbatches": 8},
    "pipeline interleaved-zero-bubble, 2 x 2 stages, 8 micro-batches": {
        "strategy": "pipeline", "nproc_per_node": 2, "pipeline_schedule": "interleaved-zero-bubble",
        "pipeline_virtual_stages": 2, "pipeline_microbatches": 8},
}


def config(root: Path, name: str, parallel: dict) -> dict:
    dp = parallel["nproc_per_node"] // parallel.get("tp", 1) // parallel.get("pp", 1)
    passes = parallel.get("pipeline_microbatches", 4)
    micro = 8 // dp if parallel["strategy"] != "pipeline" else 8 // passes // (dp if "pp" in parallel else 1)
    return {
        "model": {"n_layers": 4, "hidden": 32, "n_heads": 2, "max_seq_len": 64},
        "data": {"paths": [str(root / "text")], "cache_dir": str(root / "cache"), "vocab_size": 320,
                 "seq_len": 32, "prefetch": 2, "tokenizer_train_bytes": 200000},
        "parallel": {"pipeline_microbatches": 4, **parallel},
        "training": {"max_steps": 3, "micro_batch_size": micro, "warmup_steps": 1, "eval_every": 3, "eval_batches": 1},
        "checkpoint": {"at_end": False},
        "logging": {"run_dir": str(root / name.replace(" ", "_").replace(",", "")), "progress": False},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "mesh_memory.json")
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args()
    results = {}
    if args.only and args.out.exists():  # refresh some layouts, keep the others' figures
        results = json.loads(args.out.read_text())["layouts"]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_corpus(root)
        for name, parallel in LAYOUTS.items():
            if args.only and name not in args.only:
                continue
            cfg = config(root, name, parallel)
            comparison = train_and_compare(root, cfg)
            if "error" in comparison:
                results[name] = comparison
                continue
            results[name] = {
                "parallel": parallel,
                "predicted_bytes": comparison["predicted"]["memory_bytes"],
                "measured_bytes": comparison["measured"]["memory_bytes"],
                "predicted_comm_bytes_per_step": comparison["predicted"].get("comm_bytes_per_step"),
                "measured_comm_bytes_per_step": comparison["measured"].get("comm_bytes_per_step"),
                "measured_comm_bytes_by_kind": comparison["measured"].get("comm_bytes_by_kind"),
                "measured_over_predicted": {k: None if v is None else round(v, 3) for k, v in comparison["measured_over_predicted"].items()
                                            if k.startswith(("memory", "comm"))},
            }
            print(name, results[name]["measured_over_predicted"], flush=True)
    results = {name: results[name] for name in LAYOUTS if name in results}  # the table's order
    args.out.write_text(json.dumps({"model": "llama 4 x 32, seq 32, vocab 320, AdamW fp32, 8 sequences per step",
                                    "device": "CPU (gloo), exact tensor bytes", "layouts": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
