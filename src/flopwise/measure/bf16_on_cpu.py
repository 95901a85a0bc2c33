"""Is bf16 worth it on this CPU? Checked once per run, before training starts.

bf16 autocast on a CPU without native bf16 matrix instructions (x86: AVX512-BF16 or AMX-BF16;
Arm: the BF16 extension) runs emulated kernels, several times slower than fp32: one
user's bf16 run of the README tour took ~10x as long as fp32. The check times one
matmul in each dtype and warns with the measured ratio, so the advice fits the machine.
"""

from __future__ import annotations

import time
from pathlib import Path

NATIVE_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")  # /proc/cpuinfo: x86 flags, Arm "Features"
SLOWER_THAN_FP32 = 1.5  # warn when bf16 takes this many times as long as fp32
MATMUL_N = 256


def cpu_bf16_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> list[str] | None:
    """The native-bf16 flags the CPU reports, or None when /proc/cpuinfo is not there (not Linux)."""
    try:
        words = set(cpuinfo.read_text(encoding="utf-8", errors="replace").split())
    except OSError:
        return None
    return [flag for flag in NATIVE_FLAGS if flag in words]


def cpu_has_native_bf16() -> bool | None:
    """True/False from the CPU flags; None when they cannot be read."""
    flags = cpu_bf16_flags()
    return None if flags is None else bool(flags)


def bf16_over_fp32_matmul_time(n: int = MATMUL_N, repeats: int = 5) -> float:
    """Best-of-`repeats` time of an n x n bf16 matmul over the same in fp32 (on this thread count)."""
    import torch

    def best(dtype) -> float:
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        a @ b  # first call: kernel selection, allocation
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
        return min(times)

    return best(torch.bfloat16) / best(torch.float32)


def bf16_warning(precision_mode: str, on_cpu: bool) -> str | None:
    """One line when bf16 was asked for on a CPU that runs it slower than fp32; None otherwise."""
    if not on_cpu or not precision_mode.startswith("bf16"):
        return None
    ratio = bf16_over_fp32_matmul_time()
    if ratio < SLOWER_THAN_FP32:
        return None
    flags = cpu_bf16_flags()
    why = ("this CPU reports no native bf16 instructions (avx512_bf16 / amx_bf16)" if flags == []
           else "although the CPU reports " + ", ".join(flags) if flags else "the CPU flags could not be read")
    return (f"warning: precision.mode={precision_mode} on this CPU: a {MATMUL_N}x{MATMUL_N} bf16 matmul took "
            f"{ratio:.1f}x as long as fp32 (measured now; {why}); expect a slower run than precision.mode=fp32, "
            "and an MFU measured against the wrong peak")
