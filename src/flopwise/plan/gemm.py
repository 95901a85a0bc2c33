"""How long one GEMM, one attention core or one memory-bound kernel takes on a device.

A GEMM C[M,N] = A[M,K]·B[K,N] runs at a fraction of the dense peak that depends on its
shape. The curve is physical, one per device family, with its ceiling set by a measured
micro-benchmark (never by training throughput):

    fraction(M, N, K) = ceiling × tile(M, N) × wave(M, N) × k_loop(K)

- tile quantisation: the kernel computes whole tiles (t_m × t_n); the padded part of the
  last row/column of tiles is wasted work. The best of a few tile shapes is taken, as the
  library's heuristic does (NVIDIA "Matrix Multiplication Background" user guide, "Tile
  quantization").
- wave quantisation: tiles are spread over the device's SMs/CUs in waves; a last partial
  wave leaves units idle (same guide, "Wave quantization").
- K loop: each tile pays a fixed prologue/epilogue (load, store the C tile) against a
  main loop proportional to K: k_loop = K / (K + k₀).
- ceiling: chosen so that the curve at the micro-benchmark's best shape equals the
  measured Maximum Achievable Matmul FLOPS (MAMF, Bekman, ml-engineering
  compute/accelerator README, "Maximum Achievable Matmul FLOPS comparison table").
- roofline: the GEMM takes at least its bytes (A + B + C) over the achievable memory
  bandwidth, and every kernel pays a fixed launch/latency cost.

A measured device profile (see `GemmProfile`) replaces the curve when given: its
achieved FLOP/s for the shape and its memory bandwidth are used as they are.
"""

from __future__ import annotations

import dataclasses

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from flopwise.catalog.hardware import HardwareSpec


@runtime_checkable
class GemmProfile(Protocol):
    """A measured device profile (duck-typed: `flopwise.plan.profile.DeviceProfile` fits)."""

    memory_bandwidth_bytes_per_s: float

    def gemm_flops_per_s(self, m: int, n: int, k: int, dtype: str) -> float | None:
        """Achieved FLOP/s for that shape and dtype (interpolated), None if not measured."""

    def peak_flops(self, dtype: str) -> float | None:
        """The profile's peak for a dtype, None if not measured."""


@dataclass(frozen=True)
class DeviceCurve:
    """The shape-efficiency curve and memory-bound constants of one device family."""

    family: str
    mamf_fraction: float  # measured best-shape GEMM FLOP/s / dense peak
    mamf_shape: tuple[int, int, int]  # (M, N, K) where it was measured
    tiles: tuple[tuple[int, int, float], ...]  # (t_m, t_n, relative speed of that tile)
    units: int  # SMs / CUs / cores the tiles are spread over
    k0: float  # K at which the per-tile fixed cost equals the main loop
    memory_fraction: float  # achievable / datasheet memory bandwidth (large streaming kernels)
    kernel_seconds: float  # fixed cost of one kernel (launch, tail, sync)
    attention_fraction: tuple[float, float]  # fused attention fwd, bwd fraction of peak at long sequences
    fp8_factor: float  # fp8 GEMM fraction relative to the 16-bit one
    default_memory_gbs: float  # when the catalog has no memory bandwidth
    source: str
    sustained: float = 1.0  # sustained-training / micro-benchmark ratio of compute-bound kernels
    sustained_source: str = ""
    k_loop_speed: float = 1.0  # main-loop speed per K step over the 16-bit kernel's (fp8: 2, FP8_K_LOOP)

    @property
    def ceiling(self) -> float:
        """Asymptotic fraction of peak, so that the curve equals the MAMF (a 16-bit GEMM) at its
        measured shape."""
        m, n, k = self.mamf_shape
        return self.mamf_fraction / _shape_factor(self, m, n, k, self.k0)


FP8_KERNEL_FACTOR_HOPPER = 0.946
"""fp8 GEMM fraction of the doubled fp8 peak relative to the bf16 GEMM's of its own peak, beyond
the K term (`FP8_K_LOOP`), from kernel micro-benchmarks, not training runs
(`benchmarks/fp8_kernel_factor.py`): on an H200 (torch 2.11, `benchmarks/hopper_kernels.py`, 7
transformer shapes) per-tensor-scaled fp8 over bf16 with fast accumulation gives a median 0.976,
FBGEMM PR #2546's three H100 shapes give 0.976 as well, and split accumulation 0.932. Training
runs its forward GEMM with fast accumulation and both backward GEMMs with split accumulation
(Transformer Engine `use_split_accumulator` for dgrad and wgrad; torchao Float8Linear's
`use_fast_accum` for the output only): one third at 0.976 and two thirds at 0.932 take the time
of a uniform 0.946. Casts are timed apart (plan/ops.py); the LM head stays in 16 bits (ops.py).
Every stack runs the same cuBLAS / CUTLASS fp8 GEMMs, so every stack takes it (its recipe then
scales it, `FP8_RECIPE_FACTOR`)."""

FP8_K_LOOP = 2.0
"""An fp8 GEMM's main loop runs twice as fast per K step as the 16-bit one (twice the tensor-core
rate on the same tile) while a tile's prologue and epilogue take the same time, so the shape
curve's K term k / (k + k0) becomes k / (k + 2·k0): short-K fp8 GEMMs (a row-parallel layer's
K = h/tp) gain less than long ones. On the H200 this alone turns the fast-accumulation fp8/bf16
ratios at K 2,048 / 4,096 / 8,192 (0.92 / 0.88-0.99 / 1.01 of 2x) into one factor (0.98 / 0.91-1.02
/ 1.03), `benchmarks/fp8_kernel_factor.py`."""

FP8_RECIPE_FACTOR = {"delayed": 1.0, "tensorwise": 1.0, "rowwise": 0.90, "blockwise": 0.89, "mxfp8": 1.0}
"""fp8 GEMM rate of a scaling recipe relative to per-tensor scaling (delayed and tensorwise run the
same cuBLAS per-tensor-scaled GEMM). rowwise: torch `_scaled_mm` with row-wise scales runs a CUTLASS
kernel that reaches 90-100 % of the tensor-wise cuBLAS one on most shapes with a tail down to 50 %
(pytorch/pytorch issue #147971, H100): the lower end of the common range. On an H200 with torch
2.11 the row-wise GEMM alone ran at 0.89-1.12x (median 1.02x) of the per-tensor one at seven
transformer shapes (benchmarks/hopper_kernels.py, BENCHMARKS.md), so 0.90 stands for the recipe end to
end (row-wise scaling of the backward's transposed operands) rather than for the GEMM. mxfp8
(Blackwell block scales) is native to the tensor cores: 1.0. blockwise (TE `Float8BlockScaling`,
1x128 / 128x128 scales applied inside the GEMM as row-wise scales are) takes the row-wise factor,
times 0.932 / 0.946: the recipe fixes split accumulation for the forward GEMM too
(transformer_engine/common/recipe/__init__.py), where the others run it with fast accumulation
(`FP8_KERNEL_FACTOR_HOPPER`)."""

ATTENTION_KERNEL_FRACTION_HOPPER = {
    "fa2": (0.339, 0.295),
    "fa3": (0.339 * 648 / 370, 0.295 * 1.5),
    "cudnn": (0.339 * 595 / 370, 0.295 * 1.5),
}
"""Fused attention fwd/bwd fractions of the H100 bf16 peak by kernel generation (head dim 128,
causal): FlashAttention-2 as the Hopper curve states; FlashAttention-3 and cuDNN 9 scaled from it by
their non-causal forward at 16k over FlashAttention-2's (648 and 595 vs 370 TFLOP/s, Shah et al.
2024, "FlashAttention-3", forward head dim 128 figure); backward 1.5x FlashAttention-2, the low end
of the paper's stated 1.5-2.0x speed-up."""

# Tile shapes: Ampere cuBLAS/CUTLASS CTA tiles 256x128 / 128x256 / 128x128; Hopper WGMMA
# kernels 128x256 / 256x128 / 128x128 (CUTLASS profiler defaults); MI300X 256x256.
_AMPERE = DeviceCurve(
    "ampere", 0.859, (6912, 16384, 2048), ((256, 128, 1.0), (128, 256, 1.0), (128, 128, 0.93), (64, 128, 0.80)),
    108, 64.0, 0.88, 4e-6, (0.62, 0.52), 1.0, 2039.0,
    "A100 SXM MAMF 267.9 of 312 TFLOP/s (85.9 %) at 6912x16384x2048 (ml-engineering MAMF table); "
    "108 SMs (A100 whitepaper); attention: FlashAttention-2 A100 causal head-dim 128 ~190 TFLOP/s forward, "
    "~165 backward (Dao 2023, Fig. 5-6)",
    sustained=0.80,
    sustained_source="flopwise.plan.fit sustained_ampere, fitted on every published source; was MosaicML llm-foundry A100 rows and LLaMA-1 GPU-hours: sustained training "
                     "kernels run at ~0.81 of the micro-benchmark (clocks under sustained power, framework "
                     "overhead between kernels; SMs lost to overlapped NCCL kernels are charged apart)",
)
_AMPERE_PCIE = DeviceCurve(
    "ampere-pcie", 0.822, (2304, 5120, 1536), _AMPERE.tiles, 108, 64.0, 0.88, 4e-6, (0.58, 0.48), 1.0, 1935.0,
    "A100 PCIe MAMF 256.4 of 312 TFLOP/s (82.2 %) at 2304x5120x1536 (ml-engineering MAMF table)",
    sustained=0.80,
    sustained_source="flopwise.plan.fit sustained_ampere, fitted on every published source; was MosaicML llm-foundry A100 rows and LLaMA-1 GPU-hours: sustained training "
                     "kernels run at ~0.81 of the micro-benchmark (clocks under sustained power, framework "
                     "overhead between kernels; SMs lost to overlapped NCCL kernels are charged apart)",
)
_HOPPER = DeviceCurve(
    "hopper", 0.801, (6144, 17920, 2816), ((128, 256, 1.0), (256, 128, 1.0), (128, 128, 0.92), (64, 128, 0.78)),
    132, 128.0, 0.90, 4e-6, (0.339, 0.295), FP8_KERNEL_FACTOR_HOPPER, 3350.0,
    "H100 SXM MAMF 792.1 of 989 TFLOP/s (80.1 %) at 6144x17920x2816 (ml-engineering MAMF table); 132 SMs; "
    "attention: FlashAttention-2 on H100, causal, head dim 128, plateau 335 TFLOP/s forward (Shah et al. "
    "2024, Fig. 5) and 322 backward without mask (Fig. 6) x 335/370 for the mask (forward causal over "
    "non-causal at 16k) = 292, the kernels of the same software generation as the sustained factor below "
    "(FlashAttention-3 / cuDNN reach 500-650: newer stacks are faster); fp8 GEMMs: see FP8_KERNEL_FACTOR_HOPPER",
    sustained=0.67,
    sustained_source="flopwise.plan.fit sustained_hopper, fitted on every published source; was MosaicML "
                     "llm-foundry H100 BF16 rows: sustained training kernels run at "
                     "~0.67 of the H100 micro-benchmark (700 W clock throttling, 2023 software; SMs lost to "
                     "overlapped NCCL kernels are charged apart); H200 shares the chip and power limit",
)
_CDNA3 = DeviceCurve(
    "cdna3", 0.601, (4096, 10240, 4864), ((256, 256, 1.0), (256, 128, 0.95), (128, 128, 0.88)),
    304, 128.0, 0.80, 6e-6, (0.40, 0.30), 0.80, 5300.0,
    "MI300X MAMF 781.9 of 1,300 TFLOP/s (60.1 %, ROCm 6.2; ml-engineering MAMF table); 304 CUs",
    sustained=0.81, sustained_source="no published training row: the A100 ratio (assumption)",
)
_GENERIC = DeviceCurve(
    "generic", 0.70, (8192, 8192, 8192), ((128, 128, 1.0), (64, 128, 0.85)), 100, 128.0, 0.80, 6e-6,
    (0.45, 0.35), 0.80, 1000.0,
    "no micro-benchmark for this device: 70 % of peak for large GEMMs (assumption, low confidence; "
    "pass --profile with a measured profile)",
    sustained=0.81, sustained_source="no published training row: the A100 ratio (assumption)",
)
_BLACKWELL = DeviceCurve(
    "blackwell", 0.776, (1792, 16128, 3072), _HOPPER.tiles, 148, 128.0, 0.90, 4e-6, _HOPPER.attention_fraction,
    0.763 / 0.776, 8000.0,
    "B200 SXM MAMF 1,745 of 2,250 TFLOP/s (77.6 %) at 1792x16128x3072 bf16, fp8 3,432.5 of 4,500 (76.3 %) "
    "(ml-engineering MAMF table, torch 2.7.1+cu128); 148 SMs (recalled); Hopper's tile set, memory fraction "
    "and attention fractions of peak (assumptions: no Blackwell attention kernel benchmark in the sources)",
    sustained=0.67,
    sustained_source="no published Blackwell training row: the Hopper value sustained_hopper ships with "
                     "(assumption; the B200's 1,000 W limit is not the H100's 700 W)",
)
_BLACKWELL_GB200 = dataclasses.replace(
    _BLACKWELL, mamf_fraction=0.729, mamf_shape=(4096, 9728, 2048), fp8_factor=0.723 / 0.729,
    source="GB200 MAMF 1,822 of 2,500 TFLOP/s (72.9 %) at 4096x9728x2048 bf16, fp8 3,615.6 of 5,000 (72.3 %) "
           "(ml-engineering MAMF table, torch 2.10 nightly +cu130); otherwise the B200 curve's assumptions",
)
"""Blackwell: the GEMM ceiling is a micro-benchmark (MAMF) like the A100's and H100's; what turns it into
training speed (`sustained`) and the attention kernels' share of peak are Hopper's, assumed: a plan on
Blackwell says so and takes the extrapolation band (plan/band.py)."""
ASSUMED_FAMILIES = ("generic",)
"""Families whose curve is an assumption, not a micro-benchmark: their plans are low-confidence and no
software stack's fitted speed applies to them."""
ASSUMED_SUSTAINED = {"tpu": "GEMM ceiling from another chip of the family, sustained factor assumed",
                     "blackwell": "GEMM ceiling measured (MAMF), sustained factor and attention kernels assumed "
                                  "from Hopper; no Blackwell training run validated"}
"""Families whose GEMM ceiling is measured but whose sustained factor is not validated: low confidence, why."""
_TPU = DeviceCurve(
    "tpu", 0.923, (8192, 8192, 8192), ((128, 128, 1.0),), 8, 128.0, 0.80, 6e-6, (0.45, 0.35), 0.80, 1200.0,
    "TPU (128x128 MXU systolic arrays): XLA's bf16 jnp.matmul on a TPU v5e at 8192^3 ran at 92.3 % of the "
    "197 TFLOP/s peak (84.3 % at 4096^3), timed with Python dispatch included (JAX documentation, Pallas "
    "TPU 'Matrix Multiplication' guide, docs/pallas/tpu/matmul.ipynb, XLA matmul cell); no TPU v4 "
    "micro-benchmark is published in the sources, so v4 and v5p take the same MXU family's figure "
    "(low confidence)",
    sustained=0.81, sustained_source="no TPU training row besides the one validated: the A100 ratio "
                                     "(assumption, as for the generic curve)",
)
_CPU = DeviceCurve(
    "cpu", 1.0, (1024, 1024, 1024), ((64, 64, 1.0), (32, 64, 0.9)), 1, 32.0, 0.70, 8e-6, (0.5, 0.4), 1.0, 10.0,
    "CPU: the catalog peak of a measured CPU is its best square matmul (n = 512/1024), so the curve's "
    "ceiling is that matmul; memory bandwidth 10 GB/s per process and 8 us per operator when no profile "
    "is given (assumptions; `flopwise calibrate` measures both)",
)


def curve_for(hw: HardwareSpec) -> DeviceCurve:
    """The device family of a catalog entry (by key and vendor)."""
    key = hw.key.lower()
    if hw.vendor.lower() == "cpu" or key.startswith("cpu"):
        return _CPU
    if key.startswith(("a100", "a800")):  # the A800 is an A100 with NVLink cut
        return _AMPERE_PCIE if "pcie" in key else _AMPERE
    if key.startswith(("h100", "h200", "gh200", "h800", "h20")):  # H800, H20: GH100 with links or rate cut
        return _HOPPER
    if key.startswith("gb200"):
        return _BLACKWELL_GB200
    if key.startswith("b200"):
        return _BLACKWELL
    if key.startswith("mi300"):
        return _CDNA3
    if key.startswith("tpu"):
        return _TPU
    return _GENERIC


def _shape_factor(curve: DeviceCurve, m: int, n: int, k: int, k0: float) -> float:
    """tile × wave × k-loop factor of the best tile shape (1.0 for an ideal, huge GEMM); `k0` the
    K at which a tile's fixed cost equals its main loop."""
    best = 0.0
    for tm, tn, speed in curve.tiles:
        rows, cols = -(-m // tm), -(-n // tn)
        tiles = rows * cols
        tile_eff = (m * n) / (rows * tm * cols * tn)
        waves = -(-tiles // curve.units)
        wave_eff = tiles / (waves * curve.units)
        best = max(best, speed * tile_eff * wave_eff)
    return best * k / (k + k0)


ATTENTION_HALF_SEQ = 256.0
"""Sequence length at which a fused attention kernel reaches half its long-sequence rate
(too few query blocks per head to fill the SMs, and the causal diagonal blocks' masking
cost weighs more; fitted to the FlashAttention-2 H100 curve quoted in `attention_seconds`)."""

_FRACTIONS: dict[tuple, float] = {}
_CEILINGS: dict[tuple, float] = {}


def gemm_fraction(curve: DeviceCurve, m: int, n: int, k: int) -> float:
    """Achievable fraction of the dense peak for an (M, N, K) GEMM on this curve (cached; two parts
    of one family, B200 and GB200, have their own MAMF)."""
    key = (curve.family, curve.mamf_fraction, curve.sustained, curve.k_loop_speed, m, n, k)
    value = _FRACTIONS.get(key)
    if value is None:
        if len(_FRACTIONS) > 200_000:
            _FRACTIONS.clear()
        measured = (curve.family, curve.mamf_fraction, curve.mamf_shape)
        ceiling = _CEILINGS.get(measured)
        if ceiling is None:
            ceiling = _CEILINGS[measured] = curve.ceiling
        value = _FRACTIONS[key] = ceiling * curve.sustained * _shape_factor(curve, m, n, k,
                                                                           curve.k0 * curve.k_loop_speed)
    return value


@dataclass(frozen=True, eq=False)
class DeviceRates:
    """What the op model needs to time kernels on one device: peak, bandwidth, curve, profile.

    Compared and hashed by identity: `device_rates` returns one object per distinct input,
    so the op model's caches key on it cheaply."""

    peak: float  # FLOP/s of the GEMM dtype
    memory_bytes_per_s: float  # achievable
    curve: DeviceCurve
    dtype: str
    attention_peak: float  # FLOP/s of attention (bf16 when GEMMs run in fp8)
    profile: GemmProfile | None = None
    efficiency: float | None = None  # a user's flat override: every FLOP at peak × efficiency

    def gemm_seconds(self, m: int, n: int, k: int, count: float = 1.0, dtype_bytes: float = 2.0) -> float:
        """Seconds for `count` GEMMs of shape (M, N, K): shape-aware roofline plus the kernel cost."""
        if m <= 0 or n <= 0 or k <= 0 or count <= 0:
            return 0.0
        flops = 2.0 * m * n * k
        if self.efficiency is not None:
            return count * flops / (self.peak * self.efficiency)
        rate = None
        if self.profile is not None:
            rate = self.profile.gemm_flops_per_s(int(m), int(n), int(k), self.dtype)
        if rate:
            compute = flops / (rate * self.curve.sustained)
        else:
            compute = flops / (self.peak * gemm_fraction(self.curve, int(m), int(n), int(k)))
        traffic = (m * k + k * n + m * n) * dtype_bytes / self.memory_bytes_per_s
        return count * (max(compute, traffic) + self.curve.kernel_seconds)

    def sixteen_bit(self) -> DeviceRates:
        """These rates for 16-bit GEMMs: an fp8 run's LM head, which the stacks keep out of fp8
        (Megatron-Core's output layer is its own ColumnParallelLinear outside Transformer Engine,
        torchtitan's float8 recipes set `filter_fqns = ["output"]`, MPT's head is the tied
        embedding through F.linear). Itself for any other precision, a profile or a flat efficiency."""
        if self.dtype != "fp8" or self.efficiency is not None or self.profile is not None:
            return self
        found = _SIXTEEN_BIT.get(self)
        if found is None:
            if len(_SIXTEEN_BIT) > 4096:
                _SIXTEEN_BIT.clear()
            found = _SIXTEEN_BIT[self] = dataclasses.replace(
                self, peak=self.attention_peak, dtype="bf16", curve=dataclasses.replace(self.curve, k_loop_speed=1.0))
        return found

    def memory_seconds(self, nbytes: float, kernels: float = 1.0) -> float:
        """Seconds for memory-bound kernels moving `nbytes` in all (reads + writes)."""
        if self.efficiency is not None:
            return 0.0  # a flat efficiency already covers everything that is not a GEMM
        return nbytes / self.memory_bytes_per_s + kernels * self.curve.kernel_seconds

    def attention_seconds(self, flops: float, seq_len: int, backward: bool) -> float:
        """Seconds for a fused (flash) attention kernel doing `flops` of real work.

        The family's fractions are the long-sequence plateau; a sequence of s tokens reaches
        s / (s + 256) of it (FlashAttention-2, causal, head dim 128 on H100: 191 / 260 / 298 /
        319 / 333 / 335 TFLOP/s at 0.5k / 1k / 2k / 4k / 8k / 16k, Shah et al. 2024 Fig. 5;
        the curve gives 0.67 / 0.80 / 0.89 / 0.94 / 0.97 / 0.98 of the plateau: within 3 %
        from 1k up, 17 % high at 512)."""
        if flops <= 0:
            return 0.0
        if self.efficiency is not None:
            return flops / (self.attention_peak * self.efficiency)
        fwd, bwd = self.curve.attention_fraction
        fraction = (bwd if backward else fwd) * (seq_len / (seq_len + ATTENTION_HALF_SEQ))
        fraction = min(fraction, self.curve.ceiling) * self.curve.sustained
        if self.profile is not None:
            rate = self.profile.gemm_flops_per_s(seq_len, seq_len, 128, self.dtype)
            peak = self.profile.peak_flops(self.dtype) or self.attention_peak
            if rate:
                fraction = min(fraction, rate / peak) if self.curve.family != "cpu" else rate / peak
        return flops / (self.attention_peak * fraction) + self.curve.kernel_seconds


_RATES: dict[tuple, tuple[object, DeviceRates]] = {}
_SIXTEEN_BIT: dict[DeviceRates, DeviceRates] = {}


def device_rates(hw: HardwareSpec, precision: str, peak: float, profile: GemmProfile | None = None,
                 efficiency: float | None = None, stack_speed: float = 1.0, attention_kernel: str | None = None,
                 fp8_recipe: str | None = None) -> DeviceRates:
    """DeviceRates for a catalog entry: the family curve, achievable bandwidth, an optional profile (cached).
    `stack_speed` scales the sustained share of compute-bound kernels for the software stack
    (`flopwise.plan.fit.stack_speed`; 1 for PyTorch-native stacks).

    A stack's `attention_kernel` (fa2 | fa3 | cudnn) sets the Hopper attention fractions; an
    `fp8_recipe` scales the fp8 GEMM factor (`FP8_RECIPE_FACTOR`)."""
    key = (hw.key, hw.memory_bandwidth_gbs, precision, peak, id(profile), efficiency, stack_speed, attention_kernel,
           fp8_recipe)
    hit = _RATES.get(key)
    if hit is not None and hit[0] is profile:
        return hit[1]
    rates = _device_rates(hw, precision, peak, profile, efficiency, attention_kernel, fp8_recipe)
    if stack_speed != 1.0 and rates.curve.family not in ("cpu", "tpu", *ASSUMED_FAMILIES):
        rates = dataclasses.replace(rates, curve=dataclasses.replace(
            rates.curve, sustained=rates.curve.sustained * stack_speed))
    if len(_RATES) > 4096:
        _RATES.clear()
    _RATES[key] = (profile, rates)
    return rates


def _device_rates(hw: HardwareSpec, precision: str, peak: float, profile: GemmProfile | None,
                  efficiency: float | None, attention_kernel: str | None = None,
                  fp8_recipe: str | None = None) -> DeviceRates:
    curve = stack_curve(curve_for(hw), attention_kernel, fp8_recipe)
    if profile is not None and getattr(profile, "memory_bandwidth_bytes_per_s", None):
        bandwidth = float(profile.memory_bandwidth_bytes_per_s)
    else:
        gbs = hw.memory_bandwidth_gbs or curve.default_memory_gbs
        bandwidth = gbs * 1e9 * curve.memory_fraction
    if precision != "fp8":
        return DeviceRates(peak, bandwidth, curve, precision, peak, profile, efficiency)
    # attention and everything else stay in bf16; fp8 GEMMs reach a lower fraction of their
    # (doubled) peak, folded into the peak the curve multiplies
    attention_peak = hw.peak_flops("bf16") or peak / 2.0
    if efficiency is not None or profile is not None:
        return DeviceRates(peak, bandwidth, curve, precision, attention_peak, profile, efficiency)
    curve = dataclasses.replace(curve, k_loop_speed=FP8_K_LOOP)
    return DeviceRates(peak * curve.fp8_factor, bandwidth, curve, precision, attention_peak, profile, efficiency)


def stack_curve(curve: DeviceCurve, attention_kernel: str | None, fp8_recipe: str | None) -> DeviceCurve:
    """The family curve with a stack's attention kernel and fp8 recipe applied (Hopper only for
    the attention kernel: FlashAttention-3 and cuDNN's Hopper kernels have no Ampere form here)."""
    import dataclasses

    changes = {}
    if curve.family in ("hopper", "blackwell") and attention_kernel in ATTENTION_KERNEL_FRACTION_HOPPER:
        changes["attention_fraction"] = ATTENTION_KERNEL_FRACTION_HOPPER[attention_kernel]
    factor = curve.fp8_factor * FP8_RECIPE_FACTOR.get(fp8_recipe or "tensorwise", 1.0)
    if factor != curve.fp8_factor:
        changes["fp8_factor"] = factor
    return dataclasses.replace(curve, **changes) if changes else curve
