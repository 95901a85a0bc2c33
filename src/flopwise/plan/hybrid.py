"""Small-team hybrid plan: what fits on the team's own cards, and when renting a cloud node wins.

The seed's recipe (article 004, §3.1): 2-4 RTX 4090 (24 GB) locally for fine-tuning, an
8 x V100 32GB cloud instance on demand for training. For one job this module plans both
sides with the layout search (so recompute, ZeRO-3 and offload are all tried locally) and
prices them:

- local: electricity = device-hours × TDP × PUE / 1000 × $/kWh (the planner's energy
  figure) + optionally the cards' price amortised over their service life, device-hours ×
  price / (years × 8,760 h) — i.e. assuming the cards would be busy all that time;
- cloud: device-hours × the catalog's cheapest on-demand price (or `--price-per-hour`).

Offloaded states must fit each machine's RAM (`Site.host_memory_gib`, shared by its cards);
the planner itself does not check host memory. The default cloud node is the seed's
Tencent Cloud GN10X (8 x V100 32GB); its 320 GB (298 GiB) of RAM is read from the
instance name GN10X.18XLARGE320, priced at the catalog's cheapest V100-32GB rate.

Both grow linearly with tokens, so "cheaper" and "faster" do not change with the job's
length; they change with model size. The module therefore sweeps model sizes (the asked
model's family and the GPT-3 ladder) and reports the first size at which the cloud node
is cheaper, faster, or the only one that fits. Against buying the cards outright, the
break-even is a token count: cards' price / (cloud $ per token − local electricity $ per token).
"""

from __future__ import annotations

from dataclasses import dataclass

from flopwise.catalog.models import get_model, load_models
from flopwise.errors import UserError
from flopwise.plan.compare import DeviceOption, best_at, option_from, precision_for
from flopwise.plan.planner import build_runspec

HOURS_PER_YEAR = 8_760.0
GPT3_LADDER = ("gpt3-125m", "gpt3-350m", "gpt3-760m", "gpt3-1.3b", "gpt3-2.7b", "gpt3-6.7b", "gpt3-13b", "gpt3-175b")


@dataclass(frozen=True)
class Site:
    """Where a job could run: a device type and how many of them."""

    hardware: str
    devices: int
    host_memory_gib: float | None = None  # the machine's RAM for offloaded states; None: unchecked


@dataclass(frozen=True)
class SideBySide:
    """One model on the local cards and on the cloud node."""

    model: str
    params: float
    local: DeviceOption | None
    local_usd: float | None
    cloud: DeviceOption | None
    cloud_usd: float | None

    @property
    def cloud_cheaper(self) -> bool | None:
        """Whether the cloud job costs less (None unless both sides fit and are priced)."""
        if self.cloud_usd is None or self.local_usd is None:
            return None
        return self.cloud_usd < self.local_usd

    @property
    def cloud_faster(self) -> bool | None:
        """Whether the cloud job finishes sooner (True when nothing fits locally)."""
        if self.cloud is None:
            return None if self.local is None else False
        return True if self.local is None else self.cloud.days < self.local.days

    def to_dict(self) -> dict:
        """JSON-able row."""
        def side(o):
            return None if o is None else {"devices": o.devices, "layout": o.layout, "days": o.days,
                                           "device_hours": o.device_hours, "kwh": o.kwh}
        return {"model": self.model, "params": self.params, "local": side(self.local), "local_usd": self.local_usd,
                "cloud": side(self.cloud), "cloud_usd": self.cloud_usd, "cloud_cheaper": self.cloud_cheaper,
                "cloud_faster": self.cloud_faster}


@dataclass(frozen=True)
class HybridPlan:
    """The asked job on both sites, a model-size sweep, and the crossovers found in it."""

    local: Site
    cloud: Site
    tokens: float
    electricity_usd_per_kwh: float
    local_hardware_usd: float | None
    amortize_years: float
    job: SideBySide
    sweep: tuple[SideBySide, ...]
    findings: tuple[str, ...]
    buy_break_even_tokens: float | None

    def to_dict(self) -> dict:
        """JSON-able plan."""
        return {
            "local": vars(self.local), "cloud": vars(self.cloud), "tokens": self.tokens,
            "electricity_usd_per_kwh": self.electricity_usd_per_kwh, "local_hardware_usd": self.local_hardware_usd,
            "amortize_years": self.amortize_years, "job": self.job.to_dict(),
            "sweep": [row.to_dict() for row in self.sweep], "findings": list(self.findings),
            "buy_break_even_tokens": self.buy_break_even_tokens,
        }


def local_cost_usd(option: DeviceOption, electricity_usd_per_kwh: float, hardware_usd_per_device: float | None,
                   amortize_years: float) -> float | None:
    """Electricity (planner kWh × $/kWh) plus, when given, the cards' price amortised per device-hour."""
    if option.kwh is None:
        return None
    cost = option.kwh * electricity_usd_per_kwh
    if hardware_usd_per_device:
        cost += option.device_hours * hardware_usd_per_device / (amortize_years * HOURS_PER_YEAR)
    return cost


def parse_site(text: str, option: str) -> Site:
    """'v100-32gb:8' -> Site('v100-32gb', 8); 'v100-32gb:8:768' also sets the host's RAM in GiB."""
    parts = text.split(":")
    try:
        devices = int(parts[1]) if len(parts) > 1 and parts[1] else 8
        host = float(parts[2]) if len(parts) > 2 else None
    except ValueError:
        raise UserError(f"{option} '{text}' is not DEVICE:COUNT[:HOST_GIB], e.g. v100-32gb:8") from None
    if len(parts) > 3 or devices < 1 or (host is not None and host <= 0):
        raise UserError(f"{option} '{text}' is not DEVICE:COUNT[:HOST_GIB] with a count >= 1, e.g. v100-32gb:8")
    return Site(parts[0], devices, host)


def model_ladder(model: str) -> list[str]:
    """The asked model's family (same key prefix) and the GPT-3 sizes, smallest first."""
    asked = get_model(model)
    catalog = load_models()
    family = asked.key.rsplit("-", 1)[0]
    keys = {k for k, spec in catalog.items() if k.rsplit("-", 1)[0] == family and spec.arch == asked.arch}
    keys |= set(GPT3_LADDER) if asked.arch != "cnn" else set()
    keys.add(asked.key)
    from flopwise.plan.params import count_params

    def size(key: str) -> int:
        """Total parameters of a catalog model (the asked one may be a config.json path)."""
        return count_params(asked if key == asked.key else catalog[key]).total

    return sorted(keys, key=size)


def side_by_side(model: str, tokens: str | float, local: Site, cloud: Site, electricity_usd_per_kwh: float,
                 local_hardware_usd: float | None, amortize_years: float, seq_len: int | None,
                 batch_tokens: str | float | None, cloud_price_per_hour: float | None,
                 finetune_options: dict | None = None) -> SideBySide:
    """Best layout and cost of one model on both sites; `finetune_options` (finetune, lora_rank,
    lora_targets) plan a LoRA/QLoRA fine-tune instead of full training."""
    options = []
    for site, price in ((local, None), (cloud, cloud_price_per_hour)):
        from flopwise.catalog.hardware import get_hardware

        hw = get_hardware(site.hardware)
        precision = precision_for(hw, None)
        if precision is None:
            raise UserError(f"{hw.key} has no published bf16/fp16/fp32 peak; choose another device")
        spec = build_runspec(model=model, hardware=hw.key, gpus=1, tokens=tokens, seq_len=seq_len,
                             batch_tokens=batch_tokens, precision=precision, price_per_hour=price,
                             **(finetune_options or {}))
        host = None if site.host_memory_gib is None else site.host_memory_gib / site.devices
        options.append(best_at(spec, site.devices, host_memory_per_device_gib=host))
    local_option, cloud_option = options
    local_usd = None if local_option is None else local_cost_usd(
        local_option, electricity_usd_per_kwh, local_hardware_usd, amortize_years)
    cloud_usd = None if cloud_option is None else cloud_option.on_demand_usd
    spec_model = get_model(model)
    from flopwise.plan.params import count_params

    return SideBySide(spec_model.key, float(count_params(spec_model).total), local_option, local_usd,
                      cloud_option, cloud_usd)


def plan_hybrid(
    model: str,
    tokens: str | float,
    local: Site,
    cloud: Site = Site("v100-32gb", 8, 298.0),
    electricity_usd_per_kwh: float = 0.15,
    local_hardware_usd: float | None = None,
    amortize_years: float = 3.0,
    seq_len: int | None = None,
    batch_tokens: str | float | None = None,
    cloud_price_per_hour: float | None = None,
    sweep: bool = True,
    finetune_options: dict | None = None,
) -> HybridPlan:
    """Plan the job locally and on the cloud node, sweep model sizes, and say where the cloud wins."""
    if electricity_usd_per_kwh < 0:
        raise UserError(f"--electricity-usd-per-kwh must be >= 0, got {electricity_usd_per_kwh}")
    if local_hardware_usd is not None and local_hardware_usd < 0:
        raise UserError(f"--local-hardware-usd must be >= 0, got {local_hardware_usd}")
    if amortize_years <= 0:
        raise UserError(f"--amortize-years must be > 0, got {amortize_years}")
    args = (tokens, local, cloud, electricity_usd_per_kwh, local_hardware_usd, amortize_years, seq_len, batch_tokens,
            cloud_price_per_hour, finetune_options)
    job = side_by_side(model, *args)
    rows = [side_by_side(key, *args) if key != job.model else job for key in model_ladder(model)] if sweep else [job]
    findings = _findings(job, rows, local, cloud)
    break_even = _buy_break_even(job, local, electricity_usd_per_kwh, local_hardware_usd)
    total_tokens = (job.local or job.cloud).plan.spec.workload.total_tokens if (job.local or job.cloud) else 0.0
    return HybridPlan(local, cloud, total_tokens, electricity_usd_per_kwh, local_hardware_usd, amortize_years, job,
                      tuple(rows), tuple(findings), break_even)


def _findings(job: SideBySide, rows: list[SideBySide], local: Site, cloud: Site) -> list[str]:
    here = f"{local.devices} x {local.hardware}"
    there = f"{cloud.devices} x {cloud.hardware}"
    lines = []
    if job.local is None:
        lines.append(f"{job.model} does not fit on {here}, even with ZeRO-3, parameter offload and full recompute")
    else:
        lay = job.local.plan.spec.layout
        lines.append(f"{job.model} fits on {here} with {job.local.layout} ({job.local.plan.memory.total_bytes / 2**30:.1f} "
                     f"GiB per card{'; ' + format(job.local.plan.memory.cpu_offload_bytes / 2**30, ',.0f') + ' GiB per card offloaded to CPU' if lay.offload != 'none' else ''})")
    if job.cloud is None:
        lines.append(f"{job.model} does not fit on {there}")
    for label, never, test in (
            ("it no longer fits locally", "everything fits locally", lambda r: r.local is None and r.cloud is not None),
            ("the cloud node is faster", "the cloud node is never faster", lambda r: r.cloud_faster is True),
            ("the cloud node is cheaper", "the cloud node is never cheaper where both fit",
             lambda r: r.cloud_cheaper is True)):
        first = next((r for r in rows if test(r)), None)
        if first is None:
            lines.append(f"up to {rows[-1].model} ({rows[-1].params / 1e9:,.1f}B parameters) {never}")
        else:
            lines.append(f"from {first.model} ({first.params / 1e9:,.2f}B parameters) {label}")
    return lines


def _buy_break_even(job: SideBySide, local: Site, electricity_usd_per_kwh: float,
                    local_hardware_usd: float | None) -> float | None:
    """Tokens after which buying the local cards costs less than renting the cloud node."""
    if not local_hardware_usd or job.local is None or job.cloud is None or job.cloud_usd is None or job.local.kwh is None:
        return None
    tokens = job.local.plan.spec.workload.total_tokens
    if not tokens:
        return None
    cloud_per_token = job.cloud_usd / tokens
    power_per_token = job.local.kwh * electricity_usd_per_kwh / tokens
    if cloud_per_token <= power_per_token:
        return None
    return local_hardware_usd * local.devices / (cloud_per_token - power_per_token)
