"""Flat efficiencies: the table CNN plans use, and a measured run's MFU for `--calibrate`.

Transformer plans are timed by the operator model (`ops.py`, `gemm.py`); this table is
used only for models without one (CNNs), and a user's `--efficiency` / `--calibrate`
override both.

`efficiency` everywhere in the planner is hardware-FLOPs utilisation (HFU): hardware
FLOPs (recompute included) per second divided by the dense peak of the training dtype.
Compute time = hardware FLOPs / (peak × efficiency). With no recompute HFU = MFU.

The table holds what published runs reached, with where it came from
(`/work/shared/validation/published.md` lists the source rows):

- MosaicML llm-foundry benchmarks (scripts/train/benchmarking/README.md; FSDP FULL_SHARD,
  BF16, seq 2048): A100-80GB HFU 59.6–73.7 % (1B–70B), A100-40GB 65.2–69.4 %,
  H100-80GB 38.1–58.6 % (median 46.4 %), H100 FP8 27.7 % of the FP8 peak (3B).
- LLaMA-1 (Touvron et al. 2023, Tables 2 and 15): 6·N·D over reported A100 GPU-hours gives
  43–51 % of 312 TFLOP/s, end to end (restarts and evaluation included).

The A100 figure sits between the benchmark HFU and LLaMA-1's end-to-end rate, because a
plan is for a whole job. Devices without a published run get DEFAULT_EFFICIENCY, low
confidence.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from flopwise.errors import UserError


@dataclass(frozen=True)
class Efficiency:
    """An achieved fraction of peak, where it came from and how sure we are."""

    value: float
    source: str
    confidence: str


DEFAULT_EFFICIENCY = Efficiency(
    0.40, "default for devices without a published run (no source; set --efficiency)", "low"
)

_A100 = Efficiency(
    0.55,
    "MosaicML llm-foundry A100-80GB HFU 59.6-73.7% and LLaMA-1 end-to-end 43-51% (Touvron et al. 2023)",
    "medium",
)
_A100_40 = Efficiency(0.55, "MosaicML llm-foundry A100-40GB HFU 65.2-69.4%, MFU 48.9-52.0%; LLaMA-1 43-51%", "medium")
_H100 = Efficiency(0.45, "MosaicML llm-foundry H100-80GB BF16 HFU 38.1-58.6% (median 46.4%)", "medium")
_H100_FP8 = Efficiency(0.28, "MosaicML llm-foundry H100 FP8 3B: 27.7% of the FP8 dense peak", "low")

CALIBRATION: dict[tuple[str, str], Efficiency] = {
    ("a100-80gb", "bf16"): _A100,
    ("a100-80gb", "fp16"): _A100,
    ("a100-40gb", "bf16"): _A100_40,
    ("a100-40gb", "fp16"): _A100_40,
    ("a100-80gb-pcie", "bf16"): Efficiency(0.50, "A100 SXM figure less 10% for the PCIe part's lower power and links (assumption)", "low"),
    ("h100-sxm", "bf16"): _H100,
    ("h100-sxm", "fp16"): _H100,
    ("h100-sxm", "fp8"): _H100_FP8,
    ("h200", "bf16"): Efficiency(0.45, "same tensor cores as H100 SXM; H100 MosaicML figure reused", "low"),
    ("h200", "fp8"): Efficiency(0.28, "H100 FP8 MosaicML figure reused", "low"),
}


def efficiency_for(hardware_key: str, precision: str) -> Efficiency:
    """The calibrated efficiency for a device and precision, or the low-confidence default."""
    return CALIBRATION.get((hardware_key, precision), DEFAULT_EFFICIENCY)


@dataclass(frozen=True)
class RunCalibration:
    """The MFU a real run measured, to be used as the planner's efficiency."""

    efficiency: float
    hardware: str
    source: str


def load_run_calibration(run_dir: str | Path) -> RunCalibration:
    """Read `RUN_DIR/predicted_vs_measured.json` (written by `flopwise train`): `measured.mfu`
    becomes the efficiency, `measured.hardware` names the device it was measured on."""
    # the run record's reader loads only for --calibrate-from, not for every plan
    from flopwise.runrecord.records import comparison_path, read_comparison

    path = comparison_path(run_dir)
    try:
        comparison = read_comparison(run_dir)
    except UserError as err:
        raise UserError(f"--calibrate: {err}") from None
    if comparison is None:
        raise UserError(f"--calibrate: {path} not found (run `flopwise train` first; it writes this file)")
    mfu = comparison.measured_mfu
    if mfu is None or not 0 < mfu <= 1:
        raise UserError(f"--calibrate: {path}: measured.mfu must be a number in (0, 1], got "
                        f"{comparison.measured.get('mfu')!r}")
    hardware = comparison.measured.get("hardware")
    if isinstance(hardware, dict):
        hardware = hardware.get("key") or hardware.get("name")
    return RunCalibration(float(mfu), str(hardware or "unknown"), f"measured MFU of run {path.parent}")
