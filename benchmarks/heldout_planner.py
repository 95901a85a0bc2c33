"""The planner against published training runs it was never calibrated on (a held-out check).

`benchmarks/validate_planner.py` covers the figures of the project's reference list, on
which three constants of the time model were calibrated. This script plans other published
runs with the layouts their papers state and compares throughput. Nothing here feeds back
into the planner: the rows are only read. What a paper fixes (GPUs, tensor, pipeline and
data parallel sizes, batch, sequence, recompute, precision) is kept; what it leaves open
(micro-batch size, interleaving) is what the planner finds fastest among the choices that
fit in memory, as the paper's authors tuned theirs; the layout used is written next to each
row. Figures are as the papers print them; check them against the source before quoting.

Sources:
- Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
  Using Megatron-LM" (SC21), Table 1: GPT models from 1.7B to 1T parameters on DGX A100
  80GB, teraFLOP/s per GPU counted with full activation recomputation (their eq. 3:
  96·B·s·l·h²·(1 + s/6h + V/16lh), i.e. hardware FLOPs), mixed precision, sequence 2,048,
  vocabulary 51,200.
- Touvron et al. 2023, "Llama 2: Open Foundation and Fine-Tuned Chat Models", Table 2:
  A100-80GB GPU-hours of pretraining on 2T tokens (sequence 4,096, 4M-token batches).
- Llama Team 2024, "The Llama 3 Herd of Models", Table 4: Llama 3 405B on H100, TP 8,
  PP 16, sequence 8,192, 16M-token batches, BF16 MFU.

    python benchmarks/heldout_planner.py [--out docs/heldout.md]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from validate_planner import Row, tables, write_json

ROOT = Path(__file__).resolve().parent.parent

# Megatron-LM Table 1: (billions, heads, hidden, layers, TP, PP, GPUs, batch, TFLOP/s per GPU)
MEGATRON = [
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137),
    (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142),
    (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
    (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
    (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
    (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
]
# Llama 2 Table 2: (catalog key, unused, A100-80GB GPU-hours for 2T tokens)
LLAMA2 = [("llama2-7b", 0, 184_320), ("llama2-13b", 0, 368_640), ("llama2-70b", 0, 1_720_320)]
# Llama 3 Table 4: (GPUs, DP, BF16 MFU %, TFLOP/s per GPU)
LLAMA3 = [(8192, 64, 43, 430), (16384, 128, 41, 400)]


def gpt(billions: float, heads: int, hidden: int, layers: int):
    """Megatron's GPT shapes: 4h GELU MLP, learned positions, tied embeddings, vocabulary 51,200."""
    from flopwise.catalog.models import ModelSpec

    return ModelSpec(key=f"megatron-gpt-{billions:g}b", name=f"Megatron GPT {billions:g}B", n_layers=layers,
                     hidden=hidden, n_heads=heads, ffn_hidden=4 * hidden, vocab_size=51200, seq_len=2048,
                     max_positions=2048, mlp="gelu", norm="layernorm", position="learned", tied_embeddings=True)


def fastest(specs):
    """(plan, spec, note) of the fastest candidate that fits in memory. When the planner finds
    none that fits, the run still ran: the fastest of all is taken, and the note says what
    memory the planner predicts for it (a miss of the memory model, reported as such)."""
    from flopwise.plan.planner import plan, plan_memory

    fitting = [spec for spec in specs if plan_memory(spec, check=False).fits]
    p, spec = max(((plan(spec), spec) for spec in fitting or specs), key=lambda pair: pair[0].time.tokens_per_second)
    if fitting:
        return p, spec, ""
    memory = plan_memory(spec, check=False)
    return p, spec, (f"; the planner predicts {memory.total_bytes / 2**30:,.0f} GiB per device, over the "
                     f"{memory.device_bytes / 2**30:,.0f} GiB device: no candidate fits")


def schedules(layers: int, pp: int) -> list[tuple[str, int]]:
    """1F1B, and interleaved with 2-8 chunks per device where each chunk keeps a layer."""
    if pp == 1:
        return [("1f1b", 1)]
    return [("1f1b", 1)] + [("interleaved", v) for v in range(2, 9) if pp * v <= layers]


def micro_batches(per_rank: int, limit: int = 16) -> list[int]:
    return [d for d in range(1, min(per_rank, limit) + 1) if per_rank % d == 0]


def describe(spec) -> str:
    lay = spec.layout
    schedule = f" interleaved x{lay.virtual_stages}" if lay.pipeline_schedule == "interleaved" else ""
    return (f"tp {lay.tp}{'+SP' if lay.sequence_parallel else ''}, pp {lay.pp}{schedule}, dp {lay.dp}, "
            f"micro-batch {lay.micro_batch_size} x {lay.grad_accum}, ZeRO-{lay.zero_stage}, recompute {lay.recompute}")


def megatron_rows() -> list[Row]:
    """Table 1: the published TP, PP, GPUs and batch, full recompute, fp16, no flash attention
    (2021); micro-batch and interleaving as the planner finds fastest."""
    from flopwise.catalog.hardware import load_hardware
    from flopwise.plan.spec import Cluster, Layout, RunSpec, Workload

    a100 = load_hardware()["a100-80gb"]
    rows = []
    for billions, heads, hidden, layers, tp, pp, gpus, batch, tflops in MEGATRON:
        dp = gpus // (tp * pp)
        model = gpt(billions, heads, hidden, layers)
        workload = Workload(precision="fp16", optimizer="adamw", seq_len=2048, total_tokens=1e9)
        cluster = Cluster(hardware=a100, extra={"framework": "megatron"})
        specs = [RunSpec(model, Layout(dp=dp, tp=tp, pp=pp, micro_batch_size=mbs, grad_accum=batch // dp // mbs,
                                       zero_stage=0, recompute="full", flash_attention=False,
                                       pipeline_schedule=schedule, virtual_stages=v), workload, cluster)
                 for mbs in micro_batches(batch // dp) for schedule, v in schedules(layers, pp)]
        p, spec, memory_note = fastest(specs)
        rows.append(Row("Megatron-LM (Narayanan et al. 2021), Table 1",
                        f"GPT {billions:g}B on {gpus} A100: TFLOP/s per GPU (with recompute)",
                        p.time.hfu * a100.peak_flops("fp16") / 1e12, tflops, "TFLOP/s", describe(spec) + memory_note))
    return rows


def llama2_rows() -> list[Row]:
    """Table 2 GPU-hours. The paper states the batch (4M tokens: 1,024 sequences of 4,096) and
    no layout: 2,048 A100-80GB (the cluster size of the LLaMA-1 rows in docs/validation.md),
    ZeRO-1, and the TP (2-8, with sequence parallelism: 1,024 sequences cannot spread over
    2,048 data-parallel ranks) and micro-batch the planner finds fastest."""
    from flopwise.plan.planner import build_runspec

    rows = []
    for name, _, hours in LLAMA2:
        specs = [build_runspec(model=name, hardware="a100-80gb", gpus=2048, tp=tp, pp=1, micro_batch=mbs,
                               global_batch=1024, seq_len=4096, zero=1, sequence_parallel=True, tokens=2e12)
                 for tp in (2, 4, 8) for mbs in micro_batches(1024 // (2048 // tp))]
        p, spec, memory_note = fastest(specs)
        rows.append(Row("Llama 2 (Touvron et al. 2023), Table 2", f"{name} A100-80GB GPU-hours, 2T tokens",
                        p.time.device_hours, hours, "GPU-h", describe(spec) + memory_note))
    return rows


def llama3_rows() -> list[Row]:
    """Table 4: TP 8 with sequence parallelism, PP 16, the published DP, 2,048 sequences of 8,192
    per batch, bf16, no recompute, ZeRO-1 (the paper shards optimizer states and gradients; the
    planner's ZeRO-1 keeps gradients whole: a memory choice only); micro-batch and interleaving
    as the planner finds fastest."""
    from flopwise.plan.planner import build_runspec

    rows = []
    for gpus, dp, mfu, _ in LLAMA3:
        specs = [build_runspec(model="llama3.1-405b", hardware="h100-sxm", gpus=gpus, tp=8, pp=16, micro_batch=mbs,
                               global_batch=2048, seq_len=8192, zero=zero, sequence_parallel=True, precision="bf16",
                               schedule=schedule, virtual_stages=v if schedule == "interleaved" else None,
                               tokens=1e12, framework="megatron")
                 for zero in (1, 2) for mbs in micro_batches(2048 // dp, 2) for schedule, v in schedules(126, 16)]
        p, spec, memory_note = fastest(specs)
        rows.append(Row("Llama 3 405B (Llama Team 2024), Table 4", f"{gpus:,} H100: BF16 MFU",
                        100 * p.time.mfu, mfu, "%", describe(spec) + memory_note))
    return rows


def render(rows: list[Row]) -> str:
    """Markdown: the summary, then one table per source."""
    errors = [abs(r.error) for r in rows]
    lines = [
        "# Planner check on published runs it was not calibrated on",
        "",
        "Generated by `benchmarks/heldout_planner.py` (do not edit by hand). Published training runs",
        "outside the project's calibration list (`docs/validation.md`), planned with what their papers",
        "state; what a paper leaves open (micro-batch, interleaving, and for Llama 2 the whole layout) is",
        "what the planner finds fastest among the choices that fit; the last column is the layout used.",
        "No constant of the planner was set from these rows. Error = (predicted − published) / published.",
        "",
        f"- rows: {len(rows)}, refused: 0",
        f"- median |error| {100 * statistics.median(errors):.1f} %, worst {100 * max(errors):.1f} %",
        "",
    ]
    return "\n".join(lines + tables(rows)) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "heldout.md")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "heldout_planner.json")
    args = parser.parse_args()
    rows = megatron_rows() + llama2_rows() + llama3_rows()
    args.out.write_text(render(rows))
    errors = [abs(r.error) for r in rows]
    summary = {"rows": len(rows), "median_abs_error": statistics.median(errors), "worst_abs_error": max(errors)}
    write_json(args.json, summary, rows)
    print(json.dumps(summary))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
