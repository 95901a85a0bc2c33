"""Physical and practical ranges of the planner's numeric flags, checked before any planning.

An out-of-range value is one line naming the flag and its range. The ceilings bound the
layout search too: `--gpus` above a million devices (several times the largest published
clusters) would only make the search slow, never the plan better.
"""

from __future__ import annotations

import math

from flopwise.errors import UserError

MAX_DEVICES = 1_000_000

# parameter name -> (lowest, highest, what the range means); both ends allowed
BOUNDS: dict[str, tuple[float, float, str]] = {
    "gpus": (1, MAX_DEVICES, "devices"),
    "dp": (1, MAX_DEVICES, "data-parallel ranks"),
    "tp": (1, 4096, "tensor-parallel ranks"),
    "pp": (1, 4096, "pipeline stages"),
    "cp": (1, 4096, "context-parallel ranks"),
    "ep": (1, 4096, "expert-parallel ranks"),
    "micro_batch": (1, 2**20, "sequences"),
    "global_batch": (1, 2**32, "sequences"),
    "seq_len": (1, 2**24, "tokens"),
    "zero": (0, 3, "ZeRO stage"),
    "virtual_stages": (1, 1024, "chunks per device"),
    "efficiency": (1e-6, 1.0, "a fraction of peak"),
    "price_per_hour": (0.0, 1e4, "USD per device-hour"),
    "spot_price_per_hour": (0.0, 1e4, "USD per device-hour"),
    "pue": (1.0, 5.0, "power usage effectiveness is total over IT power, so at least 1"),
    "memory_reserve_gib": (0.0, 1024.0, "GiB"),
    "allocator_reserve": (0.0, 1.0, "a fraction of allocated memory"),
    "nodes_per_rack": (1, 1024, "nodes"),
    "top": (1, 10_000, "layouts"),
    "preemptions_per_day": (0.0, 86_400.0, "per day"),
    "checkpoint_seconds": (0.0, 1e7, "seconds"),
    "restart_seconds": (0.0, 1e7, "seconds"),
    "interruptions_per_device_day": (0.0, 10.0, "per device-day"),
    "host_memory_gib": (1e-3, 1e6, "GiB"),
    "storage_gbps": (1e-6, 1e6, "GB/s"),
    "host_copy_gbps": (1e-6, 1e5, "GB/s"),
    "local_host_memory_gib": (1e-3, 1e6, "GiB"),
    "budget_usd": (1e-6, 1e13, "USD"),
    "deadline_days": (1e-6, 1e5, "days"),
    "max_devices": (1, 65_536, "devices; larger searches take minutes"),
    "electricity_usd_per_kwh": (0.0, 100.0, "USD per kWh"),
    "local_hardware_usd": (0.0, 1e8, "USD"),
    "amortize_years": (1e-3, 100.0, "years"),
    "lora_rank": (1, 65_536, "adapter rank"),
    "lora_dropout": (0.0, 0.99, "a dropout probability below 1"),
}


# counts given as text ("4M", "2T"): parameter name -> highest value
COUNT_BOUNDS = {"tokens": 1e17, "batch_tokens": 2.0**40}


def check_flag_values(values: dict) -> None:
    """Raise a one-line UserError for the first empty text flag, or known numeric flag that is non-finite or out of range."""
    from flopwise.plan.planner import parse_count

    for name, value in values.items():  # `--hardware ''` once planned the default device and exited 0
        if isinstance(value, str) and not value.strip():
            raise UserError(f"--{name.replace('_', '-')}: empty; give a value (see --help)")
    for name, high in COUNT_BOUNDS.items():
        text = values.get(name)
        if text is not None:
            flag = "--" + name.replace("_", "-")
            if parse_count(text, flag) > high:
                raise UserError(f"{flag}: {text} is above {high:g}, more than any training run could use")
    for name, value in values.items():
        if name not in BOUNDS or value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        low, high, unit = BOUNDS[name]
        flag = "--" + name.replace("_", "-")
        if isinstance(value, float) and not math.isfinite(value):
            raise UserError(f"{flag}: {value} is not a finite number (allowed: {low:g} to {high:g}, {unit})")
        if not low <= value <= high:
            raise UserError(f"{flag}: {value:g} is outside {low:g} to {high:g} ({unit})")
