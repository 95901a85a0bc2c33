"""The fp8 GEMM factor of the named stacks (`plan/gemm.py` FP8_KERNEL_FACTOR_HOPPER), derived
from kernel micro-benchmarks only: the H200 run of `benchmarks/hopper_kernels.py`
(`benchmarks/results/gpu/hopper_kernels.json`) and FBGEMM PR #2546's H100 figures.

The planner times an fp8 GEMM as the bf16 shape curve with two changes: the dense peak doubles,
and the main loop runs twice as fast per K step while a tile's fixed cost (prologue, epilogue)
does not, so the curve's K term k / (k + k0) becomes k / (k + 2·k0). What the measurements say
beyond that is one factor: measured fp8/bf16 speed over 2, divided by (k + k0) / (k + 2·k0).

Training runs its forward GEMMs with fast accumulation and the two backward GEMMs (data and
weight gradients) with split accumulation (Transformer Engine: `use_split_accumulator` on for
dgrad and wgrad; torchao's Float8Linear: `use_fast_accum` only for the forward), so the factor
is the time-weighted mean of one third fast and two thirds split. Shapes whose bf16 GEMM runs
below half of peak (launch-bound) say nothing about the main loop and are left out.

    python benchmarks/fp8_kernel_factor.py   # prints the figures and writes benchmarks/results/fp8_kernel_factor.json
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
K0_HOPPER = 128.0  # plan/gemm.py, the Hopper curve's k0
FBGEMM_FAST = [  # (M, N, K, fp8 TFLOP/s, bf16 TFLOP/s), FBGEMM PR #2546, H100 500 W, fast accumulation
    (8192, 8192, 8192, 1125.5, 585.2), (65536, 8192, 7168, 1082.8, 575.1), (65536, 3584, 8192, 1141.4, 546.3),
]


def k_term_ratio(k: float, k0: float = K0_HOPPER) -> float:
    """fp8's K term over bf16's: (k / (k + 2·k0)) / (k / (k + k0))."""
    return (k + k0) / (k + 2 * k0)


def per_shape(rows: list[dict], key: str) -> list[float]:
    """The factor each shape measures with the fp8 throughput `key`."""
    return [row[key] / row["bf16_tflops"] / 2.0 / k_term_ratio(row["k"]) for row in rows]


def derive(path: Path = HERE / "results" / "gpu" / "hopper_kernels.json") -> dict:
    data = json.loads(path.read_text())
    rows = [r for r in data["gemm"] if r["bf16_fraction_of_peak"] >= 0.5]
    fast = statistics.median(per_shape(rows, "fp8_tensorwise_fast_accum_tflops"))
    split = statistics.median(per_shape(rows, "fp8_tensorwise_tflops"))
    fbgemm = statistics.median(f / b / 2.0 / k_term_ratio(k) for _, _, k, f, b in FBGEMM_FAST)
    training = 1.0 / ((1.0 / 3.0) / fast + (2.0 / 3.0) / split)
    return {"device": data["device"], "torch": data["torch"], "shapes": len(rows),
            "fast_accumulation_median": fast, "split_accumulation_median": split,
            "fbgemm_h100_fast_accumulation_median": fbgemm, "training_factor": training,
            "k0": K0_HOPPER}


def main() -> int:
    result = derive()
    out = HERE / "results" / "fp8_kernel_factor.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
