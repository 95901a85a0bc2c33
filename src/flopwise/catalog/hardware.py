"""Accelerator catalog: `specs/hardware.yaml` loaded into frozen `HardwareSpec`s.

Every figure in the YAML carries a source and a confidence; this module keeps them
next to the numbers so the CLI can show where a figure came from. The file is
validated strictly on load: a malformed entry is a `UserError` naming the device and
the field, never a silent default. Pure Python (PyYAML only): the planner imports it.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from flopwise.catalog.names import spelled
from flopwise.errors import UserError

CATALOG_PATH = Path(__file__).resolve().parent.parent / "specs" / "hardware.yaml"

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8")

# datasheet: the vendor's own text; secondary: a source quoting the vendor (or measuring);
# recalled: from a paper/page not re-read for the catalog; derived: arithmetic on sourced
# figures (the note says how); unknown: not known (value must then be null).
CONFIDENCES = ("datasheet", "secondary", "recalled", "derived", "unknown")

# What the vendor's bandwidth figure meant: summed over both directions, per direction, or not said.
SCALE_UP_BASES = ("bidirectional", "per-direction", "unstated")

SEED_STATUSES = ("correct", "correct-as-sparse", "roughly-right", "not-supported", "wrong", "unverifiable")

MEMORY_UNITS = ("GB", "GiB")

# Names of the figures every device must carry; keys of `HardwareSpec.sources`/`confidence`.
FIGURES = (
    *(f"peak_tflops.{d}" for d in DTYPES),
    "sparse_factor",
    "memory",
    "memory_bandwidth",
    "scale_up",
    "devices_per_node",
    "scale_out",
    "tdp",
)


@dataclass(frozen=True)
class Price:
    """A dated cloud price for one device-hour (instance price divided by devices).

    `reserved_usd_per_hour` is committed capacity (e.g. AWS Capacity Blocks), kept apart
    from on-demand and spot so a cost estimate never mistakes it for pay-as-you-go.
    """

    provider: str
    sku: str
    on_demand_usd_per_hour: float | None
    spot_usd_per_hour: float | None
    date: str
    source: str
    region: str = ""
    reserved_usd_per_hour: float | None = None
    confidence: str = "secondary"
    note: str = ""


@dataclass(frozen=True)
class SeedClaim:
    """A number from a seed article, kept beside the datasheet value it was checked against."""

    claim: str
    verdict: str
    status: str = ""
    seed: str = ""


@dataclass(frozen=True)
class HardwareSpec:
    """One accelerator. Bandwidths are GB/s (1e9 B/s) per device, per direction.

    `peak_tflops` holds dense peaks per dtype (None where unsupported or unknown);
    multiply by `sparse_factor` for 2:4-sparse peaks. `memory_gb` is the vendor's
    figure in decimal GB unless `memory_unit` says GiB; `memory_visible_mib`, where catalogued, is
    the device memory the driver exposes (nvidia-smi `memory.total`), which fit checks use: NVIDIA's
    "80GB" parts expose ~80 GiB, not 80e9 bytes. `scale_up_basis` says what
    the vendor's scale-up figure (`scale_up_published`) meant; where it is
    "unstated", `scale_up_gbs` is the published number as is.
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
    memory_type: str = ""
    scale_up_published: str = ""
    scale_up_basis: str = ""
    scale_up_domain: int | None = None
    figure_notes: Mapping[str, str] = field(default_factory=dict)
    source_ids: Mapping[str, str] = field(default_factory=dict)
    # GB/s per direction between a device and its host's memory (PCIe, or NVLink-C2C on Grace
    # systems): what offloaded activations and states cross; None where no figure is catalogued
    host_link_gbs: float | None = None
    # MiB the driver reports as the device's memory (nvidia-smi memory.total); None: the datasheet figure
    memory_visible_mib: float | None = None

    def peak_flops(self, dtype: str) -> float | None:
        """Dense peak in FLOP/s for a dtype, or None if unsupported/unknown."""
        tflops = self.peak_tflops.get(dtype)
        return None if tflops is None else tflops * 1e12

    def sparse_peak_flops(self, dtype: str) -> float | None:
        """2:4-sparse peak in FLOP/s (dense x sparse_factor), or None where either is missing."""
        dense = self.peak_flops(dtype)
        if dense is None or self.sparse_factor is None or dtype == "fp32":
            return None
        return dense * self.sparse_factor

    @property
    def memory_bytes(self) -> float | None:
        """Device memory in bytes: what the driver exposes where catalogued, else the datasheet figure."""
        if self.memory_visible_mib is not None:
            return self.memory_visible_mib * 2**20
        if self.memory_gb is None:
            return None
        return self.memory_gb * (2**30 if self.memory_unit == "GiB" else 1e9)

    def cheapest_on_demand(self) -> Price | None:
        """The lowest pay-as-you-go on-demand price listed (reserved capacity excluded)."""
        listed = [p for p in self.prices if p.on_demand_usd_per_hour is not None]
        return min(listed, key=lambda p: p.on_demand_usd_per_hour, default=None)


def _fail(where: str, what: str) -> UserError:
    return UserError(f"hardware catalog: {where}: {what}")


def _expect_mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _fail(where, f"expected a mapping, got {type(value).__name__}")
    return value


def _check_keys(entry: Mapping[str, Any], where: str, required: set[str], optional: set[str] = frozenset()) -> None:
    missing = sorted(required - entry.keys())
    if missing:
        raise _fail(where, f"missing field(s) {', '.join(missing)}")
    unknown = sorted(entry.keys() - required - optional)
    if unknown:
        raise _fail(where, f"unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(required | optional))}")


def _number(value: Any, where: str, *, integer: bool = False) -> float | int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise _fail(where, f"value must be a positive number or null, got {value!r}")
    if integer and int(value) != value:
        raise _fail(where, f"value must be a whole number, got {value!r}")
    return int(value) if integer else float(value)


def _text(value: Any, where: str, *, allow_empty: bool = True) -> str:
    if value is None and allow_empty:
        return ""
    if not isinstance(value, str) or (not allow_empty and not value.strip()):
        raise _fail(where, f"expected {'a' if allow_empty else 'a non-empty'} string, got {value!r}")
    return value


def _choice(value: Any, where: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise _fail(where, f"{value!r} is not one of {', '.join(allowed)}")
    return value


_FIGURE_KEYS = {"value", "source", "confidence"}


def _figure(raw: Any, where: str, sources: Mapping[str, str], extra: set[str] = frozenset(), *, integer: bool = False):
    """Check one {value, source, confidence[, note]} figure; return (value, source id, citation, confidence, note)."""
    entry = _expect_mapping(raw, where)
    _check_keys(entry, where, _FIGURE_KEYS, {"note"} | set(extra))
    value = _number(entry["value"], f"{where}.value", integer=integer)
    confidence = _choice(entry["confidence"], f"{where}.confidence", CONFIDENCES)
    source_id = entry["source"]
    if confidence == "unknown":
        if value is not None:
            raise _fail(where, "confidence 'unknown' requires value: null (say where a figure came from)")
        citation = sources.get(source_id, "") if source_id else ""
    else:
        if source_id not in sources:
            raise _fail(f"{where}.source", f"{source_id!r} is not an id under `sources:`")
        citation = sources[source_id]
    return value, source_id or "", citation, confidence, _text(entry.get("note"), f"{where}.note")


def _price(raw: Any, where: str, sources: Mapping[str, str]) -> Price:
    entry = _expect_mapping(raw, where)
    required = {"provider", "sku", "region", "on_demand", "spot", "date", "source", "confidence"}
    _check_keys(entry, where, required, {"reserved", "note"})
    on_demand = _number(entry["on_demand"], f"{where}.on_demand")
    spot = _number(entry["spot"], f"{where}.spot")
    reserved = _number(entry.get("reserved"), f"{where}.reserved")
    if on_demand is None and spot is None and reserved is None:
        raise _fail(where, "a price needs on_demand, spot or reserved")
    date = str(entry["date"])
    if date != "unknown" and not (len(date) in (4, 7, 10) and date[:4].isdigit()):
        raise _fail(f"{where}.date", f"{date!r} is not YYYY, YYYY-MM, YYYY-MM-DD or 'unknown'")
    if entry["source"] not in sources:
        raise _fail(f"{where}.source", f"{entry['source']!r} is not an id under `sources:`")
    return Price(
        provider=_text(entry["provider"], f"{where}.provider", allow_empty=False),
        sku=_text(entry["sku"], f"{where}.sku", allow_empty=False),
        on_demand_usd_per_hour=on_demand,
        spot_usd_per_hour=spot,
        date=date,
        source=sources[entry["source"]],
        region=_text(entry["region"], f"{where}.region"),
        reserved_usd_per_hour=reserved,
        confidence=_choice(entry["confidence"], f"{where}.confidence", CONFIDENCES[:-1]),
        note=_text(entry.get("note"), f"{where}.note"),
    )


def _seed_claim(raw: Any, where: str, sources: Mapping[str, str]) -> SeedClaim:
    entry = _expect_mapping(raw, where)
    _check_keys(entry, where, {"claim", "seed", "status", "verdict"})
    if entry["seed"] not in sources:
        raise _fail(f"{where}.seed", f"{entry['seed']!r} is not an id under `sources:`")
    return SeedClaim(
        claim=_text(entry["claim"], f"{where}.claim", allow_empty=False),
        verdict=_text(entry["verdict"], f"{where}.verdict", allow_empty=False),
        status=_choice(entry["status"], f"{where}.status", SEED_STATUSES),
        seed=entry["seed"],
    )


_DEVICE_FIELDS = {
    "name", "vendor", "aliases", "peak_tflops", "sparse_factor", "memory", "memory_bandwidth_gbs",
    "scale_up", "devices_per_node", "scale_out_gbs", "tdp_w", "prices", "seed_claims", "notes",
}


def _device(key: str, raw: Any, sources: Mapping[str, str]) -> HardwareSpec:
    where = f"device '{key}'"
    entry = _expect_mapping(raw, where)
    _check_keys(entry, where, _DEVICE_FIELDS, {"host_link_gbs", "memory_visible_mib"})
    cited: dict[str, str] = {}
    cited_ids: dict[str, str] = {}
    sure: dict[str, str] = {}
    notes: dict[str, str] = {}

    def take(name: str, raw_figure: Any, extra: set[str] = frozenset(), *, integer: bool = False):
        value, source_id, citation, confidence, note = _figure(
            raw_figure, f"{where}: {name}", sources, extra, integer=integer
        )
        cited[name], cited_ids[name], sure[name] = citation, source_id, confidence
        if note:
            notes[name] = note
        return value

    peaks_raw = _expect_mapping(entry["peak_tflops"], f"{where}: peak_tflops")
    _check_keys(peaks_raw, f"{where}: peak_tflops", set(DTYPES))
    peaks = {dtype: take(f"peak_tflops.{dtype}", peaks_raw[dtype]) for dtype in DTYPES}

    memory_raw = _expect_mapping(entry["memory"], f"{where}: memory")
    memory = take("memory", memory_raw, {"unit", "type"})
    unit = _choice(memory_raw.get("unit"), f"{where}: memory.unit", MEMORY_UNITS)

    scale_up_raw = _expect_mapping(entry["scale_up"], f"{where}: scale_up")
    scale_up = take("scale_up", scale_up_raw, {"published", "basis", "link", "domain"})
    for needed in ("published", "basis", "link", "domain"):
        if needed not in scale_up_raw:
            raise _fail(f"{where}: scale_up", f"missing field {needed}")
    domain = _number(scale_up_raw["domain"], f"{where}: scale_up.domain", integer=True)

    devices_per_node = take("devices_per_node", entry["devices_per_node"], integer=True)
    if devices_per_node is None:
        raise _fail(f"{where}: devices_per_node", "value is required (a typical server or host size)")

    aliases = entry["aliases"]
    if not isinstance(aliases, list) or not all(isinstance(a, str) and a for a in aliases):
        raise _fail(f"{where}: aliases", "expected a list of names")
    for list_field in ("prices", "seed_claims"):
        if not isinstance(entry[list_field], list):
            raise _fail(f"{where}: {list_field}", "expected a list (use [] for none)")

    return HardwareSpec(
        key=key,
        name=_text(entry["name"], f"{where}: name", allow_empty=False),
        vendor=_text(entry["vendor"], f"{where}: vendor", allow_empty=False),
        peak_tflops=peaks,
        sparse_factor=take("sparse_factor", entry["sparse_factor"]),
        memory_gb=memory,
        memory_bandwidth_gbs=take("memory_bandwidth", entry["memory_bandwidth_gbs"]),
        scale_up_gbs=scale_up,
        devices_per_node=devices_per_node,
        scale_out_gbs=take("scale_out", entry["scale_out_gbs"]),
        tdp_w=take("tdp", entry["tdp_w"]),
        memory_unit=unit,
        scale_up_link=_text(scale_up_raw["link"], f"{where}: scale_up.link"),
        prices=tuple(_price(p, f"{where}: prices[{i}]", sources) for i, p in enumerate(entry["prices"])),
        sources=cited,
        confidence=sure,
        seed_claims=tuple(
            _seed_claim(c, f"{where}: seed_claims[{i}]", sources) for i, c in enumerate(entry["seed_claims"])
        ),
        aliases=tuple(a.lower() for a in aliases),
        notes=_text(entry["notes"], f"{where}: notes"),
        memory_type=_text(memory_raw.get("type"), f"{where}: memory.type"),
        scale_up_published=_text(scale_up_raw["published"], f"{where}: scale_up.published"),
        scale_up_basis=_choice(scale_up_raw["basis"], f"{where}: scale_up.basis", SCALE_UP_BASES),
        scale_up_domain=domain,
        figure_notes=notes,
        source_ids=cited_ids,
        host_link_gbs=take("host_link", entry["host_link_gbs"]) if "host_link_gbs" in entry else None,
        memory_visible_mib=(take("memory_visible", entry["memory_visible_mib"])
                            if "memory_visible_mib" in entry else None),
    )


@dataclass(frozen=True)
class HardwareCatalog:
    """The parsed catalog: devices by key, alias index and claims not tied to one device."""

    devices: Mapping[str, HardwareSpec]
    aliases: Mapping[str, str]
    general_seed_claims: tuple[SeedClaim, ...]


def parse_hardware(document: Any) -> HardwareCatalog:
    """Validate a parsed hardware.yaml document; any malformed entry raises UserError naming it."""
    doc = _expect_mapping(document, "top level")
    _check_keys(doc, "top level", {"schema_version", "sources", "devices"}, {"general_seed_claims"})
    if doc["schema_version"] != 1:
        raise _fail("schema_version", f"{doc['schema_version']!r} is not supported; expected 1")
    sources = _expect_mapping(doc["sources"], "sources")
    for source_id, text in sources.items():
        _text(text, f"sources.{source_id}", allow_empty=False)
    devices_raw = _expect_mapping(doc["devices"], "devices")
    devices: dict[str, HardwareSpec] = {}
    aliases: dict[str, str] = {}
    for key, raw in devices_raw.items():
        if not isinstance(key, str) or key != key.lower() or not key:
            raise _fail(f"device {key!r}", "keys must be non-empty lowercase strings")
        devices[key] = _device(key, raw, sources)
    for key, spec in devices.items():
        for alias in spec.aliases:
            if alias in devices or aliases.get(alias, key) != key:
                raise _fail(f"device '{key}': aliases", f"{alias!r} is already a key or another device's alias")
            aliases[alias] = key
    claims_raw = doc.get("general_seed_claims", [])
    if not isinstance(claims_raw, list):
        raise _fail("general_seed_claims", "expected a list")
    general = tuple(_seed_claim(c, f"general_seed_claims[{i}]", sources) for i, c in enumerate(claims_raw))
    return HardwareCatalog(devices=devices, aliases=aliases, general_seed_claims=general)


@functools.lru_cache(maxsize=1)
def load_catalog() -> HardwareCatalog:
    """Read and validate the packaged `flopwise/specs/hardware.yaml` once per process."""
    text = CATALOG_PATH.read_text(encoding="utf-8")
    # The C loader is the same safe subset as yaml.safe_load, several times faster.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return parse_hardware(yaml.load(text, Loader=loader))


def load_hardware() -> dict[str, HardwareSpec]:
    """All devices by canonical key (a fresh dict over the cached catalog)."""
    return dict(load_catalog().devices)


VENDOR_WORDS = frozenset({"nvidia", "amd", "intel", "google", "huawei", "cambricon", "hygon"})
"""A maker's name in front of a part's ("NVIDIA H100"): the part is named by what follows."""


def get_hardware(name: str) -> HardwareSpec:
    """A device by key, alias or unique prefix, case-insensitive.

    A name shared by parts of different memory ('a100' is a 40 GB and two 80 GB parts) is
    refused with one line listing them: picking one silently could tell a user with 40 GB cards
    that a model fits. A name whose parts share their memory ('h100': the SXM5 and PCIe cards,
    both 80 GB) is the part its alias names, the SXM module that training clusters (DGX / HGX)
    run and that papers and NeMo's tables mean by "H100"; the plan prints the part's full name.
    An unknown name suggests close matches.
    """
    catalog = load_catalog()
    wanted = spelled(name)  # "A100 80GB" -> "a100-80gb"
    if wanted in catalog.devices:
        return catalog.devices[wanted]
    matching = matching_devices(wanted) or devices_with_tokens(wanted)
    if len(matching) == 1:
        return catalog.devices[matching[0]]
    bare = "-".join(word for word in wanted.split("-") if word not in VENDOR_WORDS and word not in _NOISE_WORDS)
    owner = catalog.aliases.get(bare) or (bare if bare in catalog.devices else None)
    if owner is not None and len({catalog.devices[key].memory_gb for key in matching}) == 1:
        return catalog.devices[owner]
    if matching:
        raise UserError(
            f"hardware '{name}' matches {len(matching)} catalog entries: {', '.join(matching)}; "
            "name one of them (see `flopwise hardware`)"
        )
    import difflib  # only on the error path: keeps the planner's start-up lean

    names = [*catalog.devices, *catalog.aliases]
    close = difflib.get_close_matches(wanted, names, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(catalog.devices)}"
    raise UserError(f"unknown hardware '{name}'; {hint} (see `flopwise hardware`)")


_FORM_FACTOR = {"sxm2": "sxm", "sxm4": "sxm", "sxm5": "sxm"}
_VENDOR_WORDS = {"nvidia", "amd", "google", "intel", "huawei", "hygon", "cambricon", "tesla", "gpu"}
_NOISE_WORDS = {"geforce", "dgx", "hgx", "hbm2", "hbm2e", "hbm3", "hbm3e", "gddr6", "gddr6x"}
"""Words that name a system or memory type around a part ("DGX H100", "NVIDIA H100 80GB HBM3" as nvidia-smi
prints it, "GeForce RTX 4090"): the part is named by the others."""


def _tokens(name: str) -> set[str]:
    return {_FORM_FACTOR.get(t, t) for t in name.split("-") if t and t not in _VENDOR_WORDS and t not in _NOISE_WORDS}


def _memory_token(spec: HardwareSpec) -> set[str]:
    """The part's memory as a name carries it ("141gb" for the H200): a word it may be named by."""
    return {f"{round(spec.memory_gb)}gb"} if spec.memory_gb else set()


def devices_with_tokens(wanted: str) -> list[str]:
    """Keys of every device whose key and aliases together carry each word of `wanted`, the
    form factor's generation aside ("h100-sxm5-80gb", "nvidia-a100-sxm4-80gb"): the full names
    vendors and papers print. Every word must match, so "a100-sxm4-80gb" never reads as a 40 GB part."""
    words = _tokens(wanted)
    if not words:
        return []
    catalog = load_catalog()
    found = []
    for key, spec in catalog.devices.items():
        known = _tokens(key).union(*(_tokens(alias) for alias in spec.aliases), _memory_token(spec))
        if words <= known:
            found.append(key)
    return found


def _prefix_of(wanted: str, name: str) -> bool:
    """`wanted` starts `name` and does not cut a model number short: "h20" is NVIDIA's H20, not
    a prefix of "h200", as "a10" is the A10 and "l4" the L4 (different parts, a few times apart)."""
    if not name.startswith(wanted):
        return False
    rest = name[len(wanted):]
    return not (rest and wanted and rest[0].isdigit() and wanted[-1].isdigit())


def matching_devices(wanted: str) -> list[str]:
    """Keys of every device whose key or an alias starts with `wanted` (lower case), in catalog order."""
    catalog = load_catalog()
    return [
        key for key, spec in catalog.devices.items()
        if _prefix_of(wanted, key) or any(_prefix_of(wanted, alias) for alias in spec.aliases)
    ]


def names_of(key: str) -> list[str]:
    """The aliases that name this device alone (`get_hardware` answers them with it); an alias that
    parts of different memory share ("a100": the 40 GB and 80 GB cards) stays for matching a
    device's reported name."""
    names = []
    for alias in load_catalog().devices[key].aliases:
        try:
            if get_hardware(alias).key == key:
                names.append(alias)
        except UserError:
            pass
    return names
