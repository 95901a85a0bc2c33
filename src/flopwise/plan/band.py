"""The error band of a forecast: how far off the planner was, out of sample, on runs like this one.

`benchmarks/validate_planner.py` plans every published run with constants fitted on all the
other sources (leave-one-source-out) and writes the residuals' spread per regime to
`plan/data/bands.json`. A regime is the stack family (Megatron / DeepSpeed / PyTorch-native),
the precision (16-bit / fp8) and the scale (GPUs). A plan's band is its regime's, or a
coarser regime's when this one had too few validated rows (a precision no row had takes its
stack family's band at the same scale, so an fp8 forecast is never narrower than the 16-bit one
beside it); it says it extrapolates when the device family, stack, precision or scale was never
validated, a stack counting as validated only with runs of its own.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

BANDS_PATH = Path(__file__).parent / "data" / "bands.json"
COVERAGE = 0.85
"""Share of a regime's validation rows its band must hold (the band is that quantile of |error|)."""
MIN_ROWS = 3
"""A regime with fewer validated rows borrows the next coarser regime's band."""
MIN_BAND = 0.02
"""No band is narrower than 2 %: published figures themselves are rounded and approximate."""
EXTRAPOLATION_COVERAGE = 0.95
"""A forecast outside what was validated (a device family, stack, precision, scale, model size or
parallelism no validation row had) gets at least this quantile of every validation row's |error|:
no row of its own regime says how far off it is, so it takes the planner's near-worst out-of-sample
miss over every regime rather than the (often narrow) band of the regime it borrows."""

STACK_FAMILY = {
    "megatron-core": "megatron", "megatron-lm": "megatron", "megatron-deepspeed": "megatron",
    "nemo": "megatron", "deepspeed": "deepspeed", "flopwise": "pytorch", "composer": "pytorch",
    "torchtitan": "pytorch", "flash-attn": "pytorch", "torchtune": "pytorch", "litgpt": "pytorch",
}
"""Which family each stack's residuals are pooled in."""


def stack_family(stack: str, zero_stage: int = 0) -> str:
    """The band family of a stack; ZeRO-3 under DeepSpeed's conventions is DeepSpeed's own."""
    family = STACK_FAMILY.get(stack, "other")
    if stack == "megatron-deepspeed" and zero_stage >= 3:
        return "deepspeed"
    return family


def scale_class(devices: int) -> str:
    """Scale bucket: one node's worth, up to a thousand devices, beyond."""
    if devices <= 64:
        return "<=64"
    if devices <= 1024:
        return "65-1024"
    return ">1024"


def precision_class(precision: str) -> str:
    return "fp8" if "fp8" in precision or "mxfp8" in precision else "16-bit"


def regime_key(family: str, precision: str, scale: str) -> str:
    return f"{family}|{precision}|{scale}"


@dataclass(frozen=True)
class Band:
    """± expected relative error of a throughput forecast, where it comes from, and whether it extrapolates."""

    expected_error: float  # relative, e.g. 0.08 for ± 8 %
    regime: str
    rows: int  # validation rows behind it
    extrapolates: bool
    reasons: tuple[str, ...] = ()
    widened_from: float | None = None  # the regime's own band, when extrapolating widened it


    def to_dict(self) -> dict:
        return {"expected_error": self.expected_error, "regime": self.regime, "rows": self.rows,
                "extrapolates": self.extrapolates, "reasons": list(self.reasons), "widened_from": self.widened_from}

    def describe(self) -> str:
        """'± 8 % (megatron|16-bit|>1024, 21 validated runs)' and what it extrapolates."""
        text = f"± {100 * self.expected_error:.0f} % ({self.regime}, {self.rows} validated runs"
        if self.widened_from is not None:
            text += (f": ± {100 * self.widened_from:.0f} % there, widened to the "
                     f"{EXTRAPOLATION_COVERAGE:.0%} quantile of every validated run's error")
        text += ")"
        if self.extrapolates:
            text += "; extrapolates: " + ", ".join(self.reasons)
        return text


def band_quantile(errors: list[float], coverage: float = COVERAGE) -> float:
    """The smallest |error| that holds `coverage` of the rows (at least MIN_BAND)."""
    ordered = sorted(abs(e) for e in errors)
    index = max(0, math.ceil(coverage * len(ordered)) - 1)
    return max(MIN_BAND, ordered[index])


def build_bands(rows: list[dict]) -> dict:
    """bands.json's content from validation rows ({family, precision, scale, error, device_family, devices})."""
    regimes: dict[str, list[float]] = {}
    for row in rows:
        for key in (regime_key(row["family"], row["precision"], row["scale"]),
                    regime_key(row["family"], row["precision"], "*"), regime_key(row["family"], "*", row["scale"]),
                    regime_key(row["family"], "*", "*"), regime_key("*", "*", "*")):
            regimes.setdefault(key, []).append(row["error"])
    return {
        "_about": "Written by benchmarks/validate_planner.py: per regime (stack family | precision | scale), the "
                  f"{COVERAGE:.0%} quantile of the leave-one-source-out |error| of throughput forecasts.",
        "regimes": {key: {"expected_error": band_quantile(errors), "rows": len(errors)}
                    for key, errors in sorted(regimes.items())},
        EXTRAPOLATED_KEY: {"expected_error": band_quantile([row["error"] for row in rows], EXTRAPOLATION_COVERAGE),
                           "rows": len(rows), "coverage": EXTRAPOLATION_COVERAGE},
        "validated": {  # what has at least MIN_ROWS validation runs behind it
            "device_families": _at_least(rows, "device_family"),
            "families": _at_least(rows, "family"),
            # stacks with runs of their own: a stack only its family validated (NeMo's recipes beside
            # Megatron-Core, flash-attention's trainer beside Composer) extrapolates its kernels and conventions
            **({"stacks": _at_least(rows, "stack")} if all("stack" in row for row in rows) else {}),
            "precisions": _at_least(rows, "precision"),
            "max_devices": max(row["devices"] for row in rows),
            # the smallest model any validation run trained (active parameters): below it, per-step
            # and per-kernel overheads the planner does not time weigh more than anything validated
            "min_active_params": min((row["params"] for row in rows if row.get("params")), default=0),
        },
    }


def _at_least(rows: list[dict], field: str) -> list[str]:
    """Values of `field` that at least MIN_ROWS rows share (one published run validates nothing)."""
    counts: dict[str, int] = {}
    for row in rows:
        counts[row[field]] = counts.get(row[field], 0) + 1
    return sorted(value for value, n in counts.items() if n >= MIN_ROWS)


@lru_cache(maxsize=1)
def load_bands() -> dict:
    """plan/data/bands.json (empty when the harness has not written it)."""
    try:
        return json.loads(BANDS_PATH.read_text())
    except (OSError, ValueError):
        return {"regimes": {}, "validated": {}}


EXTRAPOLATED_KEY = "extrapolated"
"""bands.json's entry for forecasts that extrapolate: `EXTRAPOLATION_COVERAGE` of every row's |error|."""


FEW_ROWS = "few validated runs in"
"""The reason a band gives when it borrows a coarser regime's: within what was validated, not beyond it."""


def widened(band: Band, bands: dict | None = None) -> Band:
    """`band` itself when it stays within what was validated (a borrowed coarser regime included);
    else at least the extrapolation band (`EXTRAPOLATION_COVERAGE`), the regime it borrowed still named."""
    if not any(not reason.startswith(FEW_ROWS) for reason in band.reasons):
        return band
    entry = (bands if bands is not None else load_bands()).get(EXTRAPOLATED_KEY) or {}
    floor = entry.get("expected_error")
    if not isinstance(floor, (int, float)) or not math.isfinite(floor) or not floor > band.expected_error:
        return band
    return dataclasses.replace(band, expected_error=float(floor), widened_from=band.expected_error)


MEMORY_KEY = "memory"
"""bands.json's entry for the memory forecast: the same quantile of the published peaks' |error|."""


MIN_MEMORY_BAND = 0.10
"""No memory band is narrower than 10 %: the published peaks are few (two), rounded ("60 GB") and
of an unstated allocator view (allocated or reserved), so they cannot show a tighter forecast."""


def build_memory_band(errors: list[float]) -> dict:
    """bands.json's memory entry from the published peak-memory rows' errors (predicted/published − 1),
    never below `MIN_MEMORY_BAND`.

    The memory formulas have no fitted constant, so these errors are out of sample as they stand."""
    if not errors:
        return {"expected_error": 0.0, "rows": 0}
    return {"expected_error": max(MIN_MEMORY_BAND, band_quantile(errors)), "rows": len(errors),
            "validated_error": band_quantile(errors)}


def model_size_reason(active_params: float, bands: dict | None = None) -> str | None:
    """Why a forecast for a model this small extrapolates (None within what was validated): the
    smallest validated model bounds where the time model's neglect of per-step and per-kernel
    overheads (launches, the optimizer's fixed cost, the framework's loop) was measured harmless."""
    smallest = (bands if bands is not None else load_bands()).get("validated", {}).get("min_active_params", 0)
    if smallest and active_params < smallest:
        return (f"a {active_params / 1e9:.2g}B-parameter model, smaller than any validated run "
                f"({smallest / 1e9:.2g}B): fixed per-step overheads are not timed (a 124M model on one H200 "
                "under flopwise's trainer ran 1.7-2.8x slower than planned, BENCHMARKS.md)")
    return None


@lru_cache(maxsize=1)
def memory_band() -> float:
    """Relative error of a peak-memory forecast, validated (0 when nothing validates it): a layout
    whose planned memory is over the usable capacity by less than this may still fit."""
    entry = load_bands().get(MEMORY_KEY) or {}
    value = entry.get("expected_error", 0.0)
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) and value >= 0 else 0.0


def band_for(stack: str, zero_stage: int, precision: str, devices: int, device_family: str,
             bands: dict | None = None) -> Band:
    """The band of a forecast in this regime (the finest regime with MIN_ROWS validated rows)."""
    if bands is None:
        return _shipped_band(stack, zero_stage, precision, devices, device_family)
    return _band(stack, zero_stage, precision, devices, device_family, bands)


@lru_cache(maxsize=4096)
def _shipped_band(stack: str, zero_stage: int, precision: str, devices: int, device_family: str) -> Band:
    """`band_for` on bands.json, cached: a search asks it for thousands of layouts of one job."""
    return _band(stack, zero_stage, precision, devices, device_family, load_bands())


def _band(stack: str, zero_stage: int, precision: str, devices: int, device_family: str, bands: dict) -> Band:
    family, prec, scale = stack_family(stack, zero_stage), precision_class(precision), scale_class(devices)
    validated = bands.get("validated", {})
    reasons = []
    if device_family not in validated.get("device_families", ()):
        reasons.append(f"device family {device_family} never validated")
    if family not in validated.get("families", ()):
        reasons.append(f"stack {stack} never validated")
    elif "stacks" in validated and stack not in validated["stacks"]:
        reasons.append(f"stack {stack} never validated (other {family}-family stacks were)")
    if prec not in validated.get("precisions", ()):
        reasons.append(f"{prec} never validated")
    if devices > validated.get("max_devices", 0):
        reasons.append(f"{devices:,} devices, beyond the {validated.get('max_devices', 0):,} validated")
    regimes = bands.get("regimes", {})
    for key in (regime_key(family, prec, scale), regime_key(family, prec, "*"), regime_key(family, "*", scale),
                regime_key(family, "*", "*"), regime_key("*", "*", "*")):
        entry = regimes.get(key)
        if entry and entry["rows"] >= MIN_ROWS:
            if key != regime_key(family, prec, scale) and not reasons:
                reasons.append(f"{FEW_ROWS} {regime_key(family, prec, scale)}")
            return widened(Band(entry["expected_error"], key, entry["rows"], bool(reasons), tuple(reasons)), bands)
    return Band(math.nan, "none", 0, True, tuple(reasons) or ("no validation bands",))
