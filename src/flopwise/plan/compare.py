"""Which chip, how many, and at what price: one job compared across catalog devices.

For each device the layout search (`search.py`, i.e. the planner's own model) finds the
fewest devices that fit — or, with a deadline or a budget, the count that meets it — and
the best layout there; time, device-hours, energy and on-demand / spot cost follow from
that plan. Device counts tried: powers of two up to a node, then whole nodes doubling
(1, 2, 4, 8, 16, ... for 8 per node) up to `max_devices`. Devices without a published
price are compared on time and energy only and marked so. The Pareto front is the set of
(device, count) options that no other option beats on both time and cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flopwise.catalog.hardware import HardwareSpec, get_hardware, load_hardware
from flopwise.catalog.models import get_model
from flopwise.errors import UserError
from flopwise.plan.memory import compute_dtype
from flopwise.plan.planner import Plan, build_runspec, spelled_precision
from flopwise.plan.spec import PRECISIONS
from flopwise.plan.search import describe_layout, fits_anywhere, search_layouts, with_expert_parallel

SECONDS_PER_DAY = 86_400.0
DEFAULT_HOST_MEMORY_GIB = 1024.0
"""RAM per node for offloaded states (assumption: about what 8-GPU cloud nodes carry, e.g.
AWS p4d.24xlarge 1,152 GiB); without a limit the search would offload a 70B model onto one card."""
CNN_GLOBAL_BATCH = 256  # ResNet-50's reference ImageNet batch (Goyal et al. 2017, §5)
PRECISION_PREFERENCE = ("bf16", "fp16", "fp32")
RULES_OF_THUMB = {
    "cv": ("tpu-v4", "CV tasks -> TPU"),
    "nlp": ("h100-sxm", "NLP tasks -> H100"),
    "domestic": ("ascend", "domestic (China) deployments -> Ascend"),
}
RULES_SOURCE = 'the blog post "AI算力发展趋势：从硬件加速到算法优化的技术演进"'
"""The chip advice of the article RULES_SOURCE names ("CV 任务优先 TPU，NLP 任务选择 H100，国产化场景考虑昇腾"),
shown beside what the numbers say; never used to choose."""


@dataclass(frozen=True)
class DeviceOption:
    """One device type at one count: the best layout there and what it costs."""

    hardware: str
    name: str
    devices: int
    plan: Plan
    layout: str
    days: float
    device_hours: float
    kwh: float | None
    on_demand_usd: float | None
    spot_usd: float | None
    efficiency_confidence: str
    layouts_evaluated: int

    @property
    def priced(self) -> bool:
        """Whether the catalog (or --price-per-hour) gives an on-demand price."""
        return self.on_demand_usd is not None

    def to_dict(self) -> dict:
        """JSON-able row (the full plan under "plan")."""
        row = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "plan"}
        row["priced"] = self.priced
        row["tokens_per_second_per_device"] = self.plan.time.tokens_per_second_per_device
        row["mfu"] = self.plan.time.mfu
        row["precision"] = self.plan.spec.workload.precision
        row["expected_error"] = self.plan.band.expected_error if self.plan.band is not None else None
        row["plan"] = self.plan.to_dict()
        return row


@dataclass(frozen=True)
class DeviceVerdict:
    """What one device offers for the job: its chosen option, or why there is none."""

    hardware: str
    name: str
    chosen: DeviceOption | None
    note: str = ""
    options: tuple[DeviceOption, ...] = ()


@dataclass(frozen=True)
class Comparison:
    """All devices for one job, the Pareto front, and advice taken from the numbers."""

    model: str
    tokens: float
    mode: str
    target: float | None
    verdicts: tuple[DeviceVerdict, ...]
    pareto: tuple[DeviceOption, ...]
    advice: tuple[str, ...]
    rules_of_thumb: tuple[str, ...]
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict:
        """JSON-able comparison."""
        return {
            "model": self.model, "tokens": self.tokens, "mode": self.mode, "target": self.target,
            "devices": [{"hardware": v.hardware, "name": v.name, "note": v.note,
                         "chosen": None if v.chosen is None else v.chosen.to_dict(),
                         "options": [{k: val for k, val in o.to_dict().items() if k != "plan"} for o in v.options]}
                        for v in self.verdicts],
            "pareto_front": [{"hardware": o.hardware, "devices": o.devices, "days": o.days,
                              "on_demand_usd": o.on_demand_usd} for o in self.pareto],
            "advice": list(self.advice), "rules_of_thumb": list(self.rules_of_thumb), "notes": list(self.notes),
        }


def device_counts(hw: HardwareSpec, max_devices: int, minimum: int = 1) -> list[int]:
    """Counts to try: powers of two up to a node, then whole nodes doubling, up to max_devices."""
    per_node = hw.devices_per_node or 8
    counts, n = [], 1
    while n < per_node:
        counts.append(n)
        n *= 2
    n = per_node
    while n <= max_devices:
        counts.append(n)
        n *= 2
    return [c for c in counts if minimum <= c <= max_devices]


def precision_for(hw: HardwareSpec, wanted: str | None) -> str | None:
    """The asked precision if the device has a peak for it, else the first of bf16, fp16, fp32 it has."""
    if wanted is not None:  # bf16-true computes in bf16: the device's bf16 peak
        return wanted if hw.peak_flops(compute_dtype(wanted)) is not None else None
    return next((p for p in PRECISION_PREFERENCE if hw.peak_flops(p) is not None), None)


def option_from(result: Plan, evaluated: int) -> DeviceOption:
    """A DeviceOption from the best plan at one count."""
    hw = result.spec.cluster.hardware
    return DeviceOption(
        hw.key, hw.name or hw.key, result.spec.layout.devices, result, describe_layout(result.spec.layout),
        result.time.total_seconds / SECONDS_PER_DAY, result.time.device_hours, result.energy.kwh,
        result.cost.on_demand_usd, result.cost.spot_usd, result.time.efficiency_confidence, evaluated,
    )


def best_at(spec, devices: int, objective: str = "time",
            host_memory_per_device_gib: float | None = None, sequence_parallel: bool = True) -> DeviceOption | None:
    """The best layout on `devices` (None when nothing fits); `sequence_parallel=False` plans
    every tp > 1 layout without it (`--no-sequence-parallel`)."""
    result = search_layouts(spec, devices, objective=objective, top=1,
                            host_memory_per_device_gib=host_memory_per_device_gib,
                            sequence_parallel=sequence_parallel)
    return None if result.best is None else option_from(result.best, result.evaluated)


def pareto_front(options: list[DeviceOption]) -> list[DeviceOption]:
    """Priced options that no other is at least as good as on both time and cost (strictly better on one)."""
    priced = sorted((o for o in options if o.priced), key=lambda o: (o.days, o.on_demand_usd))
    front: list[DeviceOption] = []
    for option in priced:
        if not front or option.on_demand_usd < front[-1].on_demand_usd:
            front.append(option)
    return front


def compare_devices(
    model: str,
    tokens: str | float,
    hardware: list[str] | None = None,
    gpus: int | None = None,
    budget_usd: float | None = None,
    deadline_days: float | None = None,
    max_devices: int = 4096,
    seq_len: int | None = None,
    batch_tokens: str | float | None = None,
    precision: str | None = None,
    optimizer: str | None = None,
    price_per_hour: float | None = None,
    pareto_multiples: int = 4,
    global_batch: int | None = None,
    host_memory_gib: float | None = DEFAULT_HOST_MEMORY_GIB,
    stack: str = "flopwise",
    finetune_options: dict | None = None,
    ep: int = 1,
    sequence_parallel: bool = True,
) -> Comparison:
    """Compare devices for one job (see the module docstring); at most one of gpus/budget/deadline.

    `host_memory_gib` is RAM per node; each device may offload its node's share of it
    (None: unchecked). `ep` (an MoE model's expert parallelism, `--ep`) holds on every layout
    tried, so only device counts whose data-parallel ranks it divides can run the job.
    `sequence_parallel=False` plans every tensor-parallel layout without sequence parallelism."""
    given = [name for name, v in (("--gpus", gpus), ("--budget-usd", budget_usd), ("--deadline-days", deadline_days))
             if v is not None]
    if len(given) > 1:
        raise UserError(f"give at most one of --gpus, --budget-usd, --deadline-days (got {', '.join(given)})")
    if gpus is not None and gpus < 1:
        raise UserError(f"--gpus must be >= 1, got {gpus}")
    if budget_usd is not None and budget_usd <= 0:
        raise UserError(f"--budget-usd must be > 0, got {budget_usd}")
    if deadline_days is not None and deadline_days <= 0:
        raise UserError(f"--deadline-days must be > 0, got {deadline_days}")
    if precision is not None:
        precision = spelled_precision(precision)
        if precision not in PRECISIONS:  # else every device would read "no published peak"
            raise UserError(f"--precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    mode = "gpus" if gpus else "budget" if budget_usd else "deadline" if deadline_days else "fewest"
    target = gpus or budget_usd or deadline_days
    devices = [get_hardware(h) for h in hardware] if hardware else list(load_hardware().values())
    if host_memory_gib is not None and host_memory_gib <= 0:
        raise UserError(f"--host-memory-gib must be > 0, got {host_memory_gib}")
    if global_batch is None and batch_tokens is None and get_model(model).arch == "cnn":
        global_batch = CNN_GLOBAL_BATCH

    verdicts = []
    for hw in devices:
        host = None if host_memory_gib is None else host_memory_gib / (hw.devices_per_node or 8)
        verdicts.append(_compare_one(hw, mode, target, model, tokens, seq_len, batch_tokens, precision, optimizer,
                                     price_per_hour, max_devices, pareto_multiples, global_batch, host,
                                     finetune_options or {}, stack, ep, sequence_parallel))
    options = [o for v in verdicts for o in v.options]
    chosen = [v.chosen for v in verdicts if v.chosen is not None]
    if not chosen:
        if mode == "budget":
            cheapest = min((o for o in options if o.priced), key=lambda o: o.on_demand_usd, default=None)
            if cheapest is None:
                raise UserError(f"--budget-usd {budget_usd:,.0f}: no priced device can run {model}; "
                                "pass --price-per-hour or compare without a budget")
            raise UserError(f"--budget-usd {budget_usd:,.0f} is too small for {model}: the cheapest option is "
                            f"{cheapest.devices} x {cheapest.hardware} at ${cheapest.on_demand_usd:,.0f} on demand")
        if mode == "deadline":
            fastest = min(options, key=lambda o: o.days, default=None)
            if fastest is not None:
                raise UserError(f"--deadline-days {deadline_days:g} cannot be met for {model} with up to "
                                f"{max_devices} devices: the fastest is {fastest.devices} x {fastest.hardware} "
                                f"at {fastest.days:,.1f} days")
        raise UserError(f"{model} fits on none of the compared devices "
                        f"({', '.join(v.hardware for v in verdicts)}) with up to {max_devices} of them")
    spec_model = chosen[0].plan.spec.model
    front = pareto_front(options)
    return Comparison(
        spec_model.key, chosen[0].plan.spec.workload.total_tokens or chosen[0].plan.spec.workload.total_samples,
        mode, target, tuple(verdicts), tuple(front), tuple(_advice(chosen)), tuple(_rules_of_thumb(spec_model, chosen)),
        tuple(_notes(verdicts)),
    )


def _compare_one(hw, mode, target, model, tokens, seq_len, batch_tokens, precision, optimizer, price_per_hour,
                 max_devices, pareto_multiples, global_batch, host, finetune_options=None,
                 stack="flopwise", ep: int = 1, sequence_parallel: bool = True) -> DeviceVerdict:
    name = hw.name or hw.key
    sp = sequence_parallel
    prec = precision_for(hw, precision)
    if prec is None:
        wanted = precision or "bf16/fp16/fp32"
        return DeviceVerdict(hw.key, name, None, f"no published {wanted} peak")
    if not hw.memory_bytes:
        return DeviceVerdict(hw.key, name, None, "memory size unknown")
    spec = build_runspec(model=model, hardware=hw.key, gpus=1, seq_len=seq_len, batch_tokens=batch_tokens,
                         global_batch=global_batch, tokens=tokens, precision=prec, optimizer=optimizer,
                         price_per_hour=price_per_hour, stack=stack, **(finetune_options or {}))
    spec = with_expert_parallel(spec, ep)
    if mode == "gpus":
        option = best_at(spec, int(target), host_memory_per_device_gib=host, sequence_parallel=sp)
        if option is None:
            return DeviceVerdict(hw.key, name, None, f"does not fit on {int(target)} devices")
        return DeviceVerdict(hw.key, name, option, "", (option,))
    counts = device_counts(hw, max_devices)
    fewest = next((n for n in counts
                   if fits_anywhere(spec, n, host_memory_per_device_gib=host, sequence_parallel=sp) is not None), None)
    if fewest is None:
        return DeviceVerdict(hw.key, name, None, f"does not fit on up to {max_devices} devices")
    ladder = [n for n in counts if n >= fewest]
    if mode == "fewest":
        options = _options(spec, ladder[:max(1, pareto_multiples)], host, sp)
        return DeviceVerdict(hw.key, name, options[0] if options else None, "" if options else "no layout fits",
                             tuple(options))
    if mode == "deadline":
        # time falls roughly as 1/devices: start near the count the fewest-devices time suggests
        first = _options(spec, ladder[:1], host, sp)
        if not first:
            return DeviceVerdict(hw.key, name, None, "no layout fits")
        needed = fewest * first[0].days / target
        start = max([n for n in ladder if n <= needed], default=fewest)
        options = list(first)
        for n in (n for n in ladder if n >= start and n != fewest):
            options.extend(_options(spec, [n], host, sp))
            if options[-1].days <= target:
                break
        meeting = [o for o in options if o.days <= target]
        if not meeting:
            fastest = min(options, key=lambda o: o.days)
            return DeviceVerdict(hw.key, name, None, f"misses the deadline: fastest is {fastest.days:,.1f} days "
                                 f"on {fastest.devices} devices", tuple(options))
        return DeviceVerdict(hw.key, name, min(meeting, key=lambda o: o.devices), "", tuple(options))
    # budget: the fastest count whose on-demand cost fits, trying more devices until one goes over
    options = []
    for n in ladder:
        options.extend(_options(spec, [n], host, sp))
        if not options[-1].priced or options[-1].on_demand_usd > target:
            break
    if not options[0].priced:
        return DeviceVerdict(hw.key, name, None, "no price: cannot be held to a budget", tuple(options))
    within = [o for o in options if o.on_demand_usd <= target]
    if not within:
        return DeviceVerdict(hw.key, name, None, f"cheapest is ${options[0].on_demand_usd:,.0f}", tuple(options))
    return DeviceVerdict(hw.key, name, min(within, key=lambda o: o.days), "", tuple(options))


def _options(spec, counts: list[int], host: float | None, sequence_parallel: bool = True) -> list[DeviceOption]:
    """The best layout at each count (counts where nothing fits are left out)."""
    found = (best_at(spec, n, host_memory_per_device_gib=host, sequence_parallel=sequence_parallel) for n in counts)
    return [o for o in found if o is not None]


def _advice(chosen: list[DeviceOption]) -> list[str]:
    lines = []
    fastest = min(chosen, key=lambda o: o.days)
    lines.append(f"fastest: {fastest.devices} x {fastest.hardware} in {fastest.days:,.1f} days")
    priced = [o for o in chosen if o.priced]
    if priced:
        cheapest = min(priced, key=lambda o: o.on_demand_usd)
        lines.append(f"cheapest on demand: {cheapest.devices} x {cheapest.hardware} at ${cheapest.on_demand_usd:,.0f} "
                     f"({cheapest.days:,.1f} days)")
        spot = [o for o in priced if o.spot_usd is not None]
        if spot:
            best_spot = min(spot, key=lambda o: o.spot_usd)
            lines.append(f"cheapest on spot (before preemptions; see `plan --spot`): {best_spot.devices} x "
                         f"{best_spot.hardware} at ${best_spot.spot_usd:,.0f}")
    energy = [o for o in chosen if o.kwh is not None]
    if energy:
        leanest = min(energy, key=lambda o: o.kwh)
        lines.append(f"least energy: {leanest.devices} x {leanest.hardware} at {leanest.kwh / 1000:,.2f} MWh")
    unpriced = [o.hardware for o in chosen if not o.priced]
    if unpriced:
        lines.append(f"no published price (time and energy only): {', '.join(unpriced)}")
    return lines


def _rules_of_thumb(model, chosen: list[DeviceOption]) -> list[str]:
    """A published rule of thumb for this kind of workload next to what the numbers say."""
    kind = "cv" if model.arch == "cnn" else "nlp"
    key, rule = RULES_OF_THUMB[kind]
    fastest = min(chosen, key=lambda o: o.days)
    priced = [o for o in chosen if o.priced]
    cheapest = min(priced, key=lambda o: o.on_demand_usd) if priced else None
    ruled = next((o for o in chosen if o.hardware == key), None)
    numbers = f"fastest {fastest.hardware}" + (f", cheapest {cheapest.hardware}" if cheapest else "")
    if ruled is None:
        lines = [f"rule of thumb from {RULES_SOURCE}: {rule} | {key} was not compared; the numbers say: {numbers}"]
    else:
        lines = [f"rule of thumb from {RULES_SOURCE}: {rule} | {ruled.devices} x {key}: {ruled.days:,.1f} days"
                 + (f", ${ruled.on_demand_usd:,.0f}" if ruled.priced else ", no price")
                 + f"; the numbers say: {numbers}"]
    domestic = [o for o in chosen if o.hardware.startswith("ascend")]
    _, rule = RULES_OF_THUMB["domestic"]
    if domestic:
        best = min(domestic, key=lambda o: o.days)
        lines.append(f"rule of thumb from {RULES_SOURCE}: {rule} | best Ascend here: {best.devices} x {best.hardware}, "
                     f"{best.days:,.1f} days ({best.days / fastest.days:,.1f}x the fastest; no published price)")
    else:
        lines.append(f"rule of thumb from {RULES_SOURCE}: {rule} | no Ascend device was compared")
    return lines


def _notes(verdicts) -> list[str]:
    notes = [f"{v.hardware}: {v.note}" for v in verdicts if v.chosen is None and v.note]
    low = sorted({v.hardware for v in verdicts if v.chosen is not None and v.chosen.efficiency_confidence == "low"})
    if low:
        notes.append("low-confidence time (no GEMM micro-benchmark of the device itself; a generic curve, or "
                     "for TPUs the v5e one, is assumed): " + ", ".join(low))
    return notes

