"""This device and its peak FLOP/s: the catalog entry of a known GPU, or a measured CPU peak.

The peak in the dtype the matmuls run in decides MFU. On CUDA it is the catalog's dense peak
for the detected device; a device the catalog does not know gives no MFU and says why (never
another chip's peak). On CPU there is no catalog entry, so the best GEMM of this device's
measured profile (`flopwise calibrate`), in that dtype, stands in for the peak and is
labelled "measured CPU peak". Used by the trainer's forecast (`train/prediction.py`).
"""

from __future__ import annotations

import math
import os
import platform
import re
import time
from typing import Callable

import torch

from flopwise.catalog.hardware import HardwareSpec, load_hardware

CPU_KEY = "cpu-measured"
# Square matmul sizes for the CPU peak: cache behaviour makes either one faster on a given
# machine, so the peak is the best of both.
CALIBRATION_SIZES = (512, 1024)
# Device memory as reported by CUDA vs the catalog's figure (GB vs GiB, reserved memory).
MEMORY_TOLERANCE = 0.15


def device_profile(device, dtype: str, notes: list[str]):
    """(profile, record of which one) for this device; (None, None) and a note if it cannot be had."""
    from flopwise.measure.calibrate import profile_for_device
    from flopwise.plan.profile import file_sha256

    try:
        profile, path, source = profile_for_device(device, dtype)
        sha256 = file_sha256(path)
    except Exception as err:  # a forecast that fails must not stop the training run
        notes.append(f"prediction: no device profile ({err.__class__.__name__}: {err}); table efficiency used")
        return None, None
    record = {"path": str(path), "sha256": sha256, "source": source, "device": profile.device,
              "host": profile.host, "torch_version": profile.torch_version, "created": profile.created,
              "threads": profile.threads, "processes": profile.processes, "dtypes": list(profile.dtypes()),
              "load_before": profile.load_before, "load_after": profile.load_after,
              "busy_load_per_core": profile.busy_load_per_core(), "cpu_count": profile.cpu_count}
    notes.append(f"prediction: device profile {path} (sha256 {sha256[:12]}, {source}, measured {profile.created})")
    return profile, record


def detect_hardware(device, compute_dtype: str, processes: int, mean_over_ranks: Callable[[list[float]], list[float]],
                    profile=None) -> tuple[HardwareSpec | None, str, str | None]:
    """(hardware, where its peak comes from, why there is no MFU or None).

    `mean_over_ranks` averages a CPU measurement over the job's ranks (the trainer's all-reduce).
    """
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return cuda_hardware(name, torch.cuda.get_device_properties(device).total_memory)
    dtypes = {"fp32", compute_dtype}
    if profile is not None and all(profile.peak_flops(d) for d in dtypes):
        peaks = {d: profile.peak_flops(d) for d in sorted(dtypes)}
        label = (f"measured CPU peak: best GEMM per dtype in the device profile ({profile.threads} thread(s), "
                 f"{profile.processes} process(es) measuring at once)")
        return cpu_hardware(peaks, processes, label), label, None
    peaks = {}
    for dtype in sorted(dtypes):
        local = max(measure_matmul_flops(_torch_dtype(dtype), n) for n in CALIBRATION_SIZES)
        peaks[dtype] = mean_over_ranks([local])[0]
    threads = torch.get_num_threads()
    sizes = "/".join(str(n) for n in CALIBRATION_SIZES)
    label = (f"measured CPU peak: fastest timed square matmul (n={sizes}) per process, "
             f"{threads} thread(s), mean over {processes} rank(s)")
    return cpu_hardware(peaks, processes, label), label, None


def cuda_hardware(device_name: str, total_memory_bytes: int | None) -> tuple[HardwareSpec | None, str, str | None]:
    """(catalog entry, peak source, None) for a known GPU; (None, "none", why) for an unknown one."""
    spec = catalog_entry_for_cuda(device_name, total_memory_bytes)
    if spec is None:
        return None, "none", f"'{device_name}' is not in the hardware catalog (see `flopwise hardware`)"
    return spec, f"catalog entry '{spec.key}' (dense peak, datasheet)", None


def measure_matmul_flops(dtype: torch.dtype = torch.float32, n: int = 1024, seconds: float = 0.4) -> float:
    """FLOP/s of the fastest of repeated n x n matmuls (2·n³ FLOPs each) with this process's threads."""
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    torch.mm(a, b)  # warm-up: first call pays for allocation and kernel selection
    best = math.inf
    deadline = time.perf_counter() + seconds
    reps = 0
    while reps < 3 or time.perf_counter() < deadline:
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
        reps += 1
    return 2.0 * n**3 / best


def cpu_hardware(peaks_flops: dict[str, float], processes: int, label: str) -> HardwareSpec:
    """A HardwareSpec for this CPU, one 'device' per process, peaks from `measure_matmul_flops`."""
    memory_gib = None
    try:
        memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30 / processes
    except (ValueError, OSError, AttributeError):
        pass
    return HardwareSpec(
        key=CPU_KEY,
        name=f"CPU ({platform.processor() or platform.machine()}), measured",
        vendor="cpu",
        peak_tflops={dtype: value / 1e12 for dtype, value in peaks_flops.items()},
        sparse_factor=None,
        memory_gb=memory_gib,
        memory_unit="GiB",
        memory_bandwidth_gbs=None,
        scale_up_gbs=None,
        devices_per_node=processes,
        scale_out_gbs=None,
        tdp_w=None,
        sources={"peak_tflops": label, "memory_gb": "physical memory / processes"},
        confidence={"peak_tflops": "measured", "memory_gb": "measured"},
        notes="stands in for a catalog entry on CPU runs",
    )


def catalog_entry_for_cuda(device_name: str, total_memory_bytes: int | None = None) -> HardwareSpec | None:
    """The catalog entry for a CUDA device name such as 'NVIDIA H100 80GB HBM3', or None.

    Candidates share the chip's model token (h100, a100, l40s, ...); the form factor in
    the name (pcie or not) filters them; the one whose key parts (`40gb`, `80gb`) appear
    in the name wins. When the device reports its memory, the entry's memory must agree
    within MEMORY_TOLERANCE (an H100 NVL is not an H100 SXM). No match, no entry.
    """
    name = device_name.lower()
    tokens = set(re.findall(r"[a-z]*\d+[a-z]*", name))
    candidates = []
    for key, spec in load_hardware().items():
        if key.split("-")[0] in tokens or any(alias.lower() in tokens for alias in spec.aliases):
            candidates.append(spec)
    pcie = "pcie" in name
    candidates = [s for s in candidates if ("pcie" in s.key) == pcie]
    if total_memory_bytes:
        candidates = [s for s in candidates if s.memory_bytes is None
                      or abs(s.memory_bytes - total_memory_bytes) <= MEMORY_TOLERANCE * s.memory_bytes]
    if not candidates:
        return None

    def score(spec: HardwareSpec) -> tuple:
        named = sum(part in tokens for part in spec.key.split("-"))
        memory_gap = abs((spec.memory_bytes or 0) - (total_memory_bytes or 0)) if total_memory_bytes else 0
        return (-named, memory_gap)

    return min(candidates, key=score)


def _torch_dtype(name: str) -> torch.dtype:
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


def device_name(device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
