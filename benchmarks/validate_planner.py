"""The planner against every training-compute, throughput and memory figure of published.md.

Writes docs/validation.md (the table: predicted, published, error) and
benchmarks/results/validate_planner.json. Layouts are the published ones; where a source
does not state one, the choice is written next to the row.

    python benchmarks/validate_planner.py [--out docs/validation.md]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = "/work/shared/validation/published.md"  # the reference list these rows come from


@dataclasses.dataclass
class Row:
    """One published figure and the planner's prediction of it."""

    group: str
    figure: str
    predicted: float
    published: float
    unit: str
    note: str = ""

    @property
    def error(self) -> float:
        return (self.predicted - self.published) / self.published


def mpt(size: str, seq: int = 2048):
    """MosaicML MPT shapes (llm-foundry yamls): GELU 4h MLP, no biases, ALiBi, tied embeddings, vocab 50368."""
    from flopwise.catalog.models import ModelSpec

    layers, hidden, heads = {"1b": (24, 2048, 16), "3b": (32, 2560, 20), "7b": (32, 4096, 32),
                             "13b": (40, 5120, 40), "30b": (48, 7168, 64), "70b": (80, 8192, 64)}[size]
    position = "learned" if seq > 2048 else "alibi"
    return ModelSpec(key=f"mpt-{size}", name=f"MPT {size}", n_layers=layers, hidden=hidden, n_heads=heads,
                     ffn_hidden=4 * hidden, vocab_size=50368, seq_len=seq, max_positions=seq, mlp="gelu",
                     norm="layernorm", position=position, tied_embeddings=True)


# (model, device, GPUs, seq, micro-batch, grad-accum, checkpointing, precision, MFU %, tokens/s/GPU)
MOSAIC = [
    ("70b", "h100-sxm", 64, 2048, 8, 4, True, "bf16", 42.57, 1039),
    ("30b", "h100-sxm", 32, 2048, 14, 3, True, "bf16", 43.92, 2308),
    ("13b", "h100-sxm", 8, 2048, 2, 1, False, "bf16", 39.79, 4792),
    ("7b", "h100-sxm", 8, 2048, 6, 1, False, "bf16", 46.44, 10643),
    ("7b", "h100-sxm", 8, 65536, 1, 2, True, "bf16", 28.59, 1956),
    ("3b", "h100-sxm", 8, 2048, 10, 6, False, "fp8", None, 30586),
    ("70b", "a100-80gb", 64, 2048, 8, 4, True, "bf16", 53.33, 410),
    ("30b", "a100-80gb", 8, 2048, 3, 21, True, "bf16", 55.3, 916),
    ("13b", "a100-80gb", 8, 2048, 2, 3, False, "bf16", 59.57, 2262),
    ("7b", "a100-80gb", 8, 2048, 6, 2, False, "bf16", 64.23, 4641),
    ("1b", "a100-80gb", 8, 2048, 14, 4, False, "bf16", 59.86, 20513),
    ("70b", "a100-40gb", 128, 2048, 4, 1, True, "bf16", 48.91, 376),
    ("13b", "a100-40gb", 64, 2048, 16, 1, True, "bf16", 52.04, 1976),
    ("7b", "a100-40gb", 128, 2048, 18, 1, True, "bf16", 50.14, 3623),
]

# LLaMA-1 (Touvron et al. 2023): tokens, published A100-80GB GPU-hours, tensor-parallel size.
# TP = the model-parallel size of the released checkpoints (1/2/4/8 shards); 2,048 GPUs,
# 4M-token batches of 2,048-token sequences (paper §2.4).
LLAMA = [("llama-7b", 1.0e12, 82_432, 1), ("llama-13b", 1.0e12, 135_168, 2),
         ("llama-33b", 1.4e12, 530_432, 4), ("llama-65b", 1.4e12, 1_022_362, 8)]


def mosaic_rows() -> list[Row]:
    """MosaicML llm-foundry throughput table: FSDP FULL_SHARD, flash attention, published layouts."""
    from flopwise.catalog.hardware import load_hardware
    from flopwise.plan.planner import plan
    from flopwise.plan.spec import Cluster, Layout, RunSpec, Workload

    hardware = load_hardware()
    rows = []
    for size, device, gpus, seq, mbs, accum, ckpt, precision, mfu, tokens in MOSAIC:
        spec = RunSpec(
            mpt(size, seq),
            Layout(dp=gpus, micro_batch_size=mbs, grad_accum=accum, zero_stage=3,
                   recompute="full" if ckpt else "none", flash_attention=True),
            Workload(precision=precision, optimizer="adamw", seq_len=seq, total_tokens=1e9),
            Cluster(hardware=hardware[device], extra={"framework": "fsdp"}),
        )
        p = plan(spec)
        label = f"MPT-{size} {gpus}x{device} seq {seq} {mbs}x{accum}{' ckpt' if ckpt else ''} {precision}"
        rows.append(Row("MosaicML llm-foundry", f"{label}: tokens/s/GPU", p.time.tokens_per_second_per_device,
                        tokens, "tok/s", ""))
        if mfu is not None:
            rows.append(Row("MosaicML llm-foundry", f"{label}: MFU", 100 * p.time.mfu, mfu, "%", ""))
    return rows


def llama_layout(name: str, tp: int):
    """LLaMA-1 on 2,048 A100-80GB: the given TP with sequence parallelism, ZeRO-1, the largest
    micro-batch that fits (the paper states neither)."""
    from flopwise.plan.planner import build_runspec, plan_memory

    dp = 2048 // tp
    per_rank = 2048 // dp
    for mbs in sorted((d for d in range(1, per_rank + 1) if per_rank % d == 0), reverse=True):
        spec = build_runspec(model=name, hardware="a100-80gb", gpus=2048, tp=tp, pp=1, micro_batch=mbs,
                             global_batch=2048, seq_len=2048, zero=1, sequence_parallel=tp > 1, tokens=1e12)
        if plan_memory(spec).fits:
            return spec
    return spec


def llama_rows() -> list[Row]:
    """LLaMA-1 GPU-hours (Table 15), 65B tokens/s/GPU (§2.4) and the implied 6ND rate."""
    from flopwise.plan.params import count_params
    from flopwise.plan.planner import plan

    rows = []
    for name, tokens, hours, tp in LLAMA:
        spec = llama_layout(name, tp)
        p = plan(spec)
        per_gpu = p.time.tokens_per_second_per_device
        lay = spec.layout
        note = f"tp {tp}{'+SP' if tp > 1 else ''}, dp {lay.dp}, micro-batch {lay.micro_batch_size} x {lay.grad_accum}, ZeRO-1"
        rows.append(Row("LLaMA-1 (Touvron et al. 2023)", f"{name} A100-80GB GPU-hours",
                        tokens / per_gpu / 3600.0, hours, "GPU-h", note))
        n = count_params(spec.model).total
        implied = 6 * n * tokens / (hours * 3600) / 1e12
        rows.append(Row("LLaMA-1 implied rate (D)", f"{name} 6ND TFLOP/s per GPU", 6 * n * per_gpu / 1e12,
                        implied, "TFLOP/s", "6·N·D / GPU-hours"))
        if name == "llama-65b":
            rows.append(Row("LLaMA-1 (Touvron et al. 2023)", "llama-65b tokens/s/GPU on 2,048 A100", per_gpu, 380,
                            "tok/s", note))
    return rows


def compute_rows() -> list[Row]:
    """GPT-3 175B training compute (Brown et al. 2020, Table D.1)."""
    from flopwise.plan.flops import pf_days
    from flopwise.plan.planner import build_runspec, plan

    p = plan(build_runspec(model="gpt3-175b", hardware="a100-80gb", gpus=1024, tp=8, pp=16, global_batch=1536,
                           seq_len=2048, zero=1, tokens=300e9))
    six_nd = p.flops.kaplan_6nd_total
    return [Row("Training compute", "GPT-3 175B, 300B tokens: 6ND FLOPs", six_nd, 3.14e23, "FLOP",
                "6 × non-embedding params × tokens"),
            Row("Training compute", "GPT-3 175B: PF-days", pf_days(six_nd), 3.64e3, "PF-day", "")]


def memory_rows() -> list[Row]:
    """ZeRO Figure 1 / Table 1, DeepSpeed's estimators, Megatron bytes per parameter."""
    from flopwise.plan import memory as mem

    rows = []
    gb = 1e9
    for psi, label, published in ((7.5e9, "7.5B, N_d 64", (120, 31.4, 16.6, 1.9)),):
        for stage, pub in zip(("baseline", "os", "os+g", "os+g+p"), published):
            rows.append(Row("ZeRO Figure 1", f"{label} {stage}", mem.zero_model_state_bytes(psi, 64, stage) / gb,
                            pub, "GB"))
    table = {
        7.5e9: {"os": (120, 52.5, 35.6, 31.4, 30.4, 30.1), "os+g": (120, 41.3, 21.6, 16.6, 15.4, 15.1),
                "os+g+p": (120, 30, 7.5, 1.88, 0.47, 0.12)},
        128e9: {"os": (2048, 896, 608, 536, 518, 513), "os+g": (2048, 704, 368, 284, 263, 257),
                "os+g+p": (2048, 512, 128, 32, 8, 2)},
        1e12: {"os": (16000, 7000, 4750, 4187, 4046, 4011), "os+g": (16000, 5500, 2875, 2218, 2054, 2013),
               "os+g+p": (16000, 4000, 1000, 250, 62.5, 15.6)},
    }
    for psi, stages in table.items():
        rows.append(Row("ZeRO Table 1", f"Ψ {psi:.3g} baseline", mem.zero_model_state_bytes(psi, 1, "baseline") / gb,
                        16 * psi / gb, "GB"))
        for stage, values in stages.items():
            for n_d, pub in zip((1, 4, 16, 64, 256, 1024), values):
                rows.append(Row("ZeRO Table 1", f"Ψ {psi:.3g} N_d {n_d} {stage}",
                                mem.zero_model_state_bytes(psi, n_d, stage) / gb, pub, "GB"))
    gib = 2**30
    t5 = 2_851e6
    cpu, gpu = mem.deepspeed_estimate_zero2(t5, 8, 1, cpu_offload=True)
    rows += [Row("DeepSpeed estimator (0.19.8)", "t5-3b ZeRO-2 offload: CPU", cpu / gib, 127.45, "GiB"),
             Row("DeepSpeed estimator (0.19.8)", "t5-3b ZeRO-2 offload: GPU", gpu / gib, 5.31, "GiB")]
    cpu, gpu = mem.deepspeed_estimate_zero2(t5, 8, 1, cpu_offload=False)
    rows += [Row("DeepSpeed estimator (0.19.8)", "t5-3b ZeRO-2 none: CPU", cpu / gib, 127.45, "GiB"),
             Row("DeepSpeed estimator (0.19.8)", "t5-3b ZeRO-2 none: GPU", gpu / gib, 11.28, "GiB")]
    cases = [((True, True, True), 71.69, 0.12), ((True, True, False), 127.45, 0.12),
             ((True, False, True), 63.72, 0.78), ((True, False, False), 127.45, 0.78),
             ((False, False, True), 1.43, 6.09), ((False, False, False), 127.45, 6.09)]
    for (opt, params, init), pub_cpu, pub_gpu in cases:
        cpu, gpu, _ = mem.deepspeed_estimate_zero3(t5, 32e6, 8, 1, cpu_offload=opt, cpu_offload_params=params,
                                                   zero_init=init)
        label = f"t5-3b ZeRO-3 (param {'cpu' if params else 'none'}, optim {'cpu' if opt else 'none'}, init {int(init)})"
        rows += [Row("DeepSpeed estimator (0.19.8)", f"{label}: CPU", cpu / gib, pub_cpu, "GiB"),
                 Row("DeepSpeed estimator (0.19.8)", f"{label}: GPU", gpu / gib, pub_gpu, "GiB")]
    for (param, grad), plain, kept, sharded in ((("fp16", "fp16"), 20, 4, 16), (("bf16", "fp32"), 18, 6, 12),
                                                (("fp32", "fp32"), 16, 8, 8)):
        rows.append(Row("Megatron distributed optimizer", f"{param} params + {grad} grads, plain",
                        mem.megatron_bytes_per_param(param, grad, 64, False), plain, "B/param"))
        rows.append(Row("Megatron distributed optimizer", f"{param} params + {grad} grads, d = 64",
                        mem.megatron_bytes_per_param(param, grad, 64, True), kept + sharded / 64, "B/param"))
    return rows


def activation_rows() -> list[Row]:
    """Korthikanti et al. 2022 Table 2 per-layer activation bytes, GPT-3 175B, s 2048, b 1, t 8."""
    from flopwise.catalog.models import load_models
    from flopwise.plan import memory as mem

    model = load_models()["gpt3-175b"]
    s, b, h, a, t = 2048, 1, model.hidden, model.n_heads, 8
    terms = mem.activation_terms(model, s, b, 2.0, dropout=True, flash_attention=False)
    sbh = s * b * h
    cases = [
        ("no parallelism", 1, False, "none", sbh * (34 + 5 * a * s / h)),
        ("tensor parallel", t, False, "none", sbh * (10 + 24 / t + 5 * a * s / (h * t))),
        ("tensor + sequence parallel", t, True, "none", sbh / t * (34 + 5 * a * s / h)),
        ("tensor parallel + selective recompute", t, False, "selective", sbh * (10 + 24 / t)),
        ("tensor + sequence parallel + selective", t, True, "selective", sbh * 34 / t),
        ("full recompute", t, False, "full", 2 * sbh),
    ]
    return [Row("Korthikanti et al. Table 2", f"GPT-3 175B layer, {label}",
                mem.activation_bytes_per_layer(terms, tp, sp, rc) / 2**20, published / 2**20, "MiB")
            for label, tp, sp, rc, published in cases]


def render(rows: list[Row]) -> str:
    """Markdown: a summary, then one table per group."""
    errors = [abs(r.error) for r in rows]
    timing = [abs(r.error) for r in rows if r.unit in ("tok/s", "%", "GPU-h", "TFLOP/s")]
    lines = [
        "# Planner validation against published figures",
        "",
        "Generated by `benchmarks/validate_planner.py` (do not edit by hand). Every training-compute,",
        "throughput/MFU, GPU-hours and memory figure of the project's list of published figures",
        "(`validation/published.md`), with the planner's prediction. Error = (predicted − published) / published.",
        "",
        f"- rows: {len(rows)}, refused: 0",
        f"- all rows: median |error| {100 * statistics.median(errors):.1f} %, worst {100 * max(errors):.1f} %",
        f"- throughput, MFU and GPU-hours rows ({len(timing)}): median |error| "
        f"{100 * statistics.median(timing):.1f} %, worst {100 * max(timing):.1f} %",
        "",
        "These rows are not independent of the model: three numbers were calibrated on the MosaicML and",
        "LLaMA-1 rows below (the only training runs the planner may be calibrated on): the per-family",
        "`sustained` factor of the GEMM curve and the fp8 factor (`src/flopwise/plan/gemm.py`), and the",
        "compute slowdown under overlapped communication (`src/flopwise/plan/timing.py`, chosen within",
        "its measured range). Everything else in the time model comes from micro-benchmarks and",
        "datasheets (`docs/planner.md`, \"Sources used for calibration\").",
        "Memory rows check the formulas of `plan/memory.py` against the figures they reproduce.",
        "",
    ]
    return "\n".join(lines + tables(rows)) + "\n"


def tables(rows: list[Row]) -> list[str]:
    """Markdown lines: one table per group, groups in order of first appearance."""
    order = {g: i for i, g in reversed(list(enumerate(r.group for r in rows)))}
    lines, group = [], None
    for r in sorted(rows, key=lambda r: order[r.group]):
        if r.group != group:
            group = r.group
            lines += ["", f"## {group}", "", "| figure | predicted | published | unit | error | layout / note |",
                      "|---|---:|---:|---|---:|---|"]
        lines.append(f"| {r.figure} | {r.predicted:,.4g} | {r.published:,.4g} | {r.unit} | {100 * r.error:+.1f} % "
                     f"| {r.note} |")
    return lines


def write_json(path: Path, summary: dict, rows: list[Row]) -> None:
    """The summary and every row with its error, as JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"summary": summary, "rows": [dict(dataclasses.asdict(r), error=r.error)
                                                             for r in rows]}, indent=2) + "\n")


def main() -> None:
    """Build every row, write the markdown and the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "validation.md")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "validate_planner.json")
    args = parser.parse_args()
    rows = compute_rows() + llama_rows() + mosaic_rows() + memory_rows() + activation_rows()
    args.out.write_text(render(rows))
    errors = [abs(r.error) for r in rows]
    timing = [abs(r.error) for r in rows if r.unit in ("tok/s", "%", "GPU-h", "TFLOP/s")]
    summary = {"rows": len(rows), "median_abs_error": statistics.median(errors), "worst_abs_error": max(errors),
               "timing_rows": len(timing), "timing_median_abs_error": statistics.median(timing),
               "timing_worst_abs_error": max(timing)}
    write_json(args.json, summary, rows)
    print(json.dumps(summary))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
