"""Kernel micro-benchmarks on one Hopper GPU: the rates the planner's Hopper constants assume.

The planner's Hopper figures come from datasheets and other people's kernel benchmarks
(`plan/gemm.py`: the MAMF fraction, `FP8_KERNEL_FACTOR_HOPPER` from FBGEMM PR #2546,
`FP8_RECIPE_FACTOR["rowwise"]` from pytorch issue #147971, the FlashAttention-3 paper's
attention rates). This script measures the same kernels on the GPU at hand, with torch alone:

- bf16 GEMMs at transformer shapes (the MAMF-style fraction of the dense peak);
- fp8 e4m3 `torch._scaled_mm` with per-tensor scales (fast accumulation on and off) and with
  row-wise scales, over the bf16 GEMM of the same shape;
- causal SDPA attention forward and backward (head dim 128) with the flash and cuDNN backends;
- 2:4 semi-structured sparse `F.linear` (`to_sparse_semi_structured`) over the dense one;
- a large device-to-device copy (achievable HBM bandwidth).

Timing: CUDA events around `iters` calls after warm-up, median of `repeats`; the clocks are
brought up first with a few seconds of large matmuls. The result is JSON (stdout and --out).
Nothing is fitted here: the figures go to BENCHMARKS.md next to the constants they test.

    python benchmarks/hopper_kernels.py --out results.json [--peak-bf16 989.4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

GEMM_SHAPES = [  # (M, N, K): tokens x out x in
    (8192, 8192, 8192),
    (6912, 16384, 2048),  # the A100 MAMF shape of the ml-engineering table
    (16384, 4096, 4096),  # Llama 7B attention projection, 16k tokens
    (16384, 11008, 4096),  # Llama 7B MLP up
    (16384, 4096, 11008),  # Llama 7B MLP down
    (16384, 14336, 4096),  # Llama 3 8B MLP up
    (4096, 4096, 4096),
    (4096, 768, 768),  # a 124M model's projection at micro-batch 4 x 1024
]
ATTENTION = [  # (batch, heads, sequence, head dim)
    (4, 32, 2048, 128),
    (2, 32, 4096, 128),
    (1, 32, 8192, 128),
    (1, 16, 16384, 128),
]


def timed(fn, iters: int, repeats: int = 5) -> float:
    """Median seconds per call over `repeats` blocks of `iters` calls (CUDA events)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / iters)
    return statistics.median(samples)


def warm_clocks(seconds: float) -> None:
    """Large bf16 matmuls until the clocks settle (a cold GPU reads 20-40 % slow)."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    deadline = time.time() + seconds
    while time.time() < deadline:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()


def gemm_rates(shapes, peak_bf16: float) -> list[dict]:
    """bf16 and fp8 (tensor-wise, row-wise) GEMM TFLOP/s per shape."""
    rows = []
    e4m3 = torch.float8_e4m3fn
    for m, n, k in shapes:
        row: dict = {"m": m, "n": n, "k": k}
        flops = 2.0 * m * n * k
        iters = max(3, int(2e13 / flops))
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        row["bf16_tflops"] = flops / timed(lambda: a @ w.t(), iters) / 1e12
        row["bf16_fraction_of_peak"] = row["bf16_tflops"] / peak_bf16
        try:
            a8, w8 = a.to(e4m3), w.to(e4m3)
            one = torch.ones((), device="cuda", dtype=torch.float32)
            for fast in (True, False):
                key = "fp8_tensorwise_fast_accum_tflops" if fast else "fp8_tensorwise_tflops"
                row[key] = flops / timed(lambda: torch._scaled_mm(a8, w8.t(), one, one, out_dtype=torch.bfloat16,
                                                                  use_fast_accum=fast), iters) / 1e12
            sa = torch.ones(m, 1, device="cuda", dtype=torch.float32)
            sb = torch.ones(1, n, device="cuda", dtype=torch.float32)
            row["fp8_rowwise_fast_accum_tflops"] = flops / timed(
                lambda: torch._scaled_mm(a8, w8.t(), sa, sb, out_dtype=torch.bfloat16, use_fast_accum=True), iters) / 1e12
            row["fp8_tensorwise_over_bf16"] = row["fp8_tensorwise_fast_accum_tflops"] / row["bf16_tflops"]
            row["rowwise_over_tensorwise"] = row["fp8_rowwise_fast_accum_tflops"] / row["fp8_tensorwise_fast_accum_tflops"]
        except Exception as exc:  # an older torch or a chip without fp8
            row["fp8_error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
        print(json.dumps(row), flush=True)
        del a, w
    return rows


def attention_rates(shapes, peak_bf16: float) -> list[dict]:
    """Causal SDPA forward and backward TFLOP/s, flash and cuDNN backends (FLOPs as FlashAttention counts:
    forward 4·b·h·s²·d / 2 for causal, backward 2.5x the forward)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = []
    for b, h, s, d in shapes:
        fwd_flops = 4.0 * b * h * s * s * d / 2
        for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            row: dict = {"batch": b, "heads": h, "seq": s, "head_dim": d, "backend": name}
            try:
                q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                           for _ in range(3))
                with sdpa_kernel(backend):
                    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    grad = torch.randn_like(out)
                    fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), 10)

                    def fwd_bwd():
                        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                        torch.autograd.grad(o, (q, k, v), grad)

                    both = timed(fwd_bwd, 10)
                row["fwd_tflops"] = fwd_flops / fwd / 1e12
                row["bwd_tflops"] = 2.5 * fwd_flops / max(both - fwd, 1e-9) / 1e12
                row["fwd_fraction_of_peak"] = row["fwd_tflops"] / peak_bf16
                row["bwd_fraction_of_peak"] = row["bwd_tflops"] / peak_bf16
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def sparse24_rates() -> list[dict]:
    """2:4 semi-structured sparse F.linear over dense, bf16 (cuSPARSELt or CUTLASS, torch's choice)."""
    from torch.sparse import to_sparse_semi_structured

    rows = []
    for m, n, k in ((16384, 4096, 4096), (16384, 11008, 4096), (4096, 4096, 4096), (256, 4096, 4096)):
        row: dict = {"m": m, "n": n, "k": k}
        try:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            mask = torch.tensor([1, 1, 0, 0], device="cuda", dtype=torch.bfloat16).repeat(n, k // 4)
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * mask
            ws = to_sparse_semi_structured(w)
            dense = timed(lambda: F.linear(x, w), 20)
            sparse = timed(lambda: F.linear(x, ws), 20)
            row.update(dense_ms=dense * 1e3, sparse_ms=sparse * 1e3, speedup=dense / sparse,
                       max_abs_diff=float((F.linear(x, w) - F.linear(x, ws)).abs().max()))
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def copy_bandwidth() -> dict:
    """Device-to-device copy of 4 GiB: bytes read + written per second."""
    src = torch.empty(2**31, device="cuda", dtype=torch.uint16)
    dst = torch.empty_like(src)
    seconds = timed(lambda: dst.copy_(src), 10)
    return {"bytes": 2 * src.numel() * 2, "gbs": 2 * src.numel() * 2 / seconds / 1e9}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="hopper_kernels.json")
    ap.add_argument("--peak-bf16", type=float, default=989.4, help="dense bf16 TFLOP/s of the datasheet (H100/H200 SXM: 989.4)")
    ap.add_argument("--warm-seconds", type=float, default=8.0)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("hopper_kernels.py needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    result: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "cuda": torch.version.cuda, "peak_bf16_tflops": args.peak_bf16,
                    "capability": list(torch.cuda.get_device_capability())}
    warm_clocks(args.warm_seconds)
    for name, fn in (("gemm", lambda: gemm_rates(GEMM_SHAPES, args.peak_bf16)),
                     ("attention", lambda: attention_rates(ATTENTION, args.peak_bf16)),
                     ("sparse24", sparse24_rates), ("copy", copy_bandwidth)):
        try:
            result[name] = fn()
        except Exception as exc:
            result[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        torch.cuda.empty_cache()
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k in ("device", "torch", "copy")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
