"""Energy (kWh, CO2) and money for a planned job.

Energy follows LLaMA-1's method (Touvron et al. 2023, §6 and Table 15, after Wu et al.
2022): MWh = device-hours × device power × PUE, with the device at its TDP for the
whole job (an upper bound: devices rarely draw TDP throughout; CPUs, network and storage
are only in the PUE). LLaMA used 400 W per A100 and PUE 1.1; the 65B model's 1,022,362
GPU-hours give 449.8 MWh. Carbon: tCO2e = MWh × grid intensity (LLaMA used 0.385).

Money: device-hours × a price per device-hour: `--price-per-hour` if given, else the
cheapest dated on-demand (and spot) price in the hardware catalog, named in `price_source`.
"""

from __future__ import annotations

from dataclasses import dataclass

from flopwise.catalog.hardware import HardwareSpec

LLAMA_CARBON_INTENSITY = 0.385  # tCO2e per MWh, US national average used by Touvron et al. 2023


@dataclass(frozen=True)
class EnergyEstimate:
    """Energy of a job at TDP × PUE; None figures when the device's power is unknown."""

    watts_per_device: float | None
    pue: float
    kwh: float | None
    tco2e: float | None

    def to_dict(self) -> dict:
        """JSON-able fields."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True)
class CostEstimate:
    """Money for the job; None where no price is known, with `note` saying why."""

    on_demand_usd: float | None
    spot_usd: float | None
    on_demand_usd_per_device_hour: float | None
    spot_usd_per_device_hour: float | None
    price_source: str
    note: str

    def to_dict(self) -> dict:
        """JSON-able fields."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def energy_kwh(device_hours: float, watts: float, pue: float) -> float:
    """kWh = device-hours × watts × PUE / 1000 (LLaMA-1 Table 15 method)."""
    return device_hours * watts * pue / 1000.0


def estimate_energy(device_hours: float, watts: float | None, pue: float,
                    carbon_intensity: float = LLAMA_CARBON_INTENSITY) -> EnergyEstimate:
    """Energy and carbon of `device_hours` at `watts` (TDP) and `pue`."""
    if watts is None:
        return EnergyEstimate(None, pue, None, None)
    kwh = energy_kwh(device_hours, watts, pue)
    return EnergyEstimate(watts, pue, kwh, kwh / 1000.0 * carbon_intensity)


def estimate_cost(device_hours: float, hardware: HardwareSpec, price_per_device_hour: float | None) -> CostEstimate:
    """Cost at the given price, else the catalog's cheapest dated on-demand and spot prices."""
    if price_per_device_hour is not None:
        return CostEstimate(device_hours * price_per_device_hour, None, price_per_device_hour, None,
                            "--price-per-hour", "")
    on_demand = [p for p in hardware.prices if p.on_demand_usd_per_hour is not None]
    spot = [p for p in hardware.prices if p.spot_usd_per_hour is not None]
    if not on_demand and not spot:
        return CostEstimate(None, None, None, None, "",
                            f"no price for {hardware.key} in the catalog; pass --price-per-hour")
    sources = []
    od_price = sp_price = None
    if on_demand:
        best = min(on_demand, key=lambda p: p.on_demand_usd_per_hour)
        od_price = best.on_demand_usd_per_hour
        sources.append(f"on-demand: {best.provider} {best.sku} {best.region} ({best.date})".replace("  ", " "))
    note = "cheapest dated catalog price"
    if spot:
        best = min(spot, key=lambda p: p.spot_usd_per_hour)
        sp_price = best.spot_usd_per_hour
        sources.append(f"spot: {best.provider} {best.sku} {best.region} ({best.date})".replace("  ", " "))
        # Spot and on-demand rows often come from different providers: a hyperscaler's spot
        # price can exceed a GPU cloud's on-demand price. Say so rather than imply a saving.
        if best.on_demand_usd_per_hour and od_price is not None and sp_price >= od_price:
            saving = 1.0 - sp_price / best.on_demand_usd_per_hour
            note += (f"; the only spot price ({best.provider}) is {saving:.0%} below {best.provider}'s own "
                     f"on-demand but above the cheapest on-demand ({od_price:.2f}/h): spot does not pay here")
    return CostEstimate(
        None if od_price is None else device_hours * od_price,
        None if sp_price is None else device_hours * sp_price,
        od_price, sp_price, "; ".join(sources), note,
    )
