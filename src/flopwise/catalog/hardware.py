"""Accelerator catalog: `specs/hardware.yaml` loaded into frozen `HardwareSpec`s.

Every figure in the YAML carries a source and a confidence; this module keeps them
next to the numbers so the CLI can show where a figure came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8")


@dataclass(frozen=True)
class Price:
    """A dated cloud price for one device-hour (instance price divided by devices)."""

    provider: str
    sku: str
    on_demand_usd_per_hour: float | None
    spot_usd_per_hour: float | None
    date: str
    source: str
    region: str = ""


@dataclass(frozen=True)
class SeedClaim:
    """A number from a seed article, kept beside the datasheet value it was checked against."""

    claim: str
    verdict: str


@dataclass(frozen=True)
class HardwareSpec:
    """One accelerator. Bandwidths are GB/s (1e9 B/s) per device, per direction.

    `peak_tflops` holds dense peaks per dtype (None where unsupported or unknown);
    multiply by `sparse_factor` for 2:4-sparse peaks. `memory_gb` is the vendor's
    figure in decimal GB unless `memory_unit` says GiB.
    """

    key: str
    name: str
    vendor: str
    peak_tflops: Mapping[str, float | None]
    sparse_factor: float | None
    memory_gb: float | None
    memory_bandwidth_gbs: float | None
    scale_up_gbs: float | None
    devices_per_node: int
    scale_out_gbs: float | None
    tdp_w: float | None
    memory_unit: str = "GB"
    scale_up_link: str = ""
    prices: tuple[Price, ...] = ()
    sources: Mapping[str, str] = field(default_factory=dict)
    confidence: Mapping[str, str] = field(default_factory=dict)
    seed_claims: tuple[SeedClaim, ...] = ()
    aliases: tuple[str, ...] = ()
    notes: str = ""

    def peak_flops(self, dtype: str) -> float | None:
        """Dense peak in FLOP/s for a dtype, or None if unsupported/unknown."""
        tflops = self.peak_tflops.get(dtype)
        return None if tflops is None else tflops * 1e12

    @property
    def memory_bytes(self) -> float | None:
        """Device memory in bytes."""
        if self.memory_gb is None:
            return None
        return self.memory_gb * (2**30 if self.memory_unit == "GiB" else 1e9)
