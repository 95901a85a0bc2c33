"""`flopwise hardware`: list and show the hardware catalog."""

from __future__ import annotations

import json
from dataclasses import asdict

import typer

from flopwise.catalog.hardware import DTYPES, HardwareSpec, get_hardware, load_catalog


def register_hardware(app: typer.Typer) -> None:
    """Add the `hardware` command."""

    @app.command("hardware")
    def hardware(
        name: str = typer.Argument(None, metavar="[NAME]", help="A device key, alias or unique prefix, e.g. h100-sxm, a100-40gb, 910b3."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    ) -> None:
        """List the accelerator catalog, or show one device's figures with sources and verdicts on published claims."""
        catalog = load_catalog()
        if name is None:
            specs = list(catalog.devices.values())
            if as_json:
                print(json.dumps([hardware_record(spec) for spec in specs], indent=2, ensure_ascii=False))
            else:
                _print_catalog(specs)
            return
        spec = get_hardware(name)
        if as_json:
            print(json.dumps(hardware_record(spec), indent=2, ensure_ascii=False))
        else:
            _print_device(spec)


def hardware_record(spec: HardwareSpec) -> dict:
    """A device as plain JSON-ready data, with its 2:4-sparse peaks spelled out."""
    record = asdict(spec)
    record["memory_bytes"] = spec.memory_bytes
    record["sparse_peak_tflops"] = {
        dtype: (None if (flops := spec.sparse_peak_flops(dtype)) is None else flops / 1e12) for dtype in DTYPES
    }
    return record


def _num(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    text = f"{value:,.1f}" if value % 1 else f"{value:,.0f}"
    return f"{text}{unit}"


def _cheapest(spec: HardwareSpec) -> str:
    price = spec.cheapest_on_demand()
    if price is None:
        return "-"
    return f"${price.on_demand_usd_per_hour:.2f} {price.provider} ({price.date})"


def _print_catalog(specs: list[HardwareSpec]) -> None:
    """The catalog as one table; in a narrow terminal without the long name and the price's provider."""
    from flopwise.table_layout import print_first_that_fits, terminal

    console = terminal()
    print_first_that_fits(console, _catalog_table(specs, narrow=False), _catalog_table(specs, narrow=True))
    console.print("'-' = unsupported or unknown; `flopwise hardware NAME` shows the full name, sources and confidence.")


def _catalog_table(specs: list[HardwareSpec], narrow: bool):
    from rich import box
    from rich.table import Table

    if narrow:
        columns = ("key", "bf16", "fp8", "memory", "mem BW", "link", "TDP", "$/h")
        table = Table(title="flopwise hardware: dense TFLOPS (bf16, fp8); memory bandwidth (mem BW) and scale-up "
                            "link in GB/s per direction; TDP in W; cheapest on-demand $ per device-hour ($/h)",
                      box=box.SIMPLE_HEAD, pad_edge=False)
    else:
        columns = ("key", "name", "bf16 TFLOPS", "fp8 TFLOPS", "memory", "mem GB/s", "scale-up GB/s", "TDP W",
                   "cheapest on-demand $/device-h")
        table = Table(title="flopwise hardware (dense peaks; bandwidth GB/s per direction)")
    for column in columns:
        # keys are what users type: never wrapped, never cut
        table.add_column(column, justify="left" if column in ("key", "name", columns[-1]) else "right",
                         no_wrap=column == "key" or narrow, min_width=max(len(s.key) for s in specs) if column == "key" else None)
    for spec in specs:
        price = spec.cheapest_on_demand()
        cells = [
            _num(spec.peak_tflops.get("bf16")),
            _num(spec.peak_tflops.get("fp8")),
            _num(spec.memory_gb, f" {spec.memory_unit}"),
            _num(spec.memory_bandwidth_gbs),
            _num(spec.scale_up_gbs),
            _num(spec.tdp_w),
        ]
        if narrow:
            table.add_row(spec.key, *cells, "-" if price is None else f"{price.on_demand_usd_per_hour:.2f}")
        else:
            table.add_row(spec.key, spec.name, *cells, _cheapest(spec))
    return table


def _figure_rows(spec: HardwareSpec) -> list[tuple[str, str, str]]:
    rows = [(f"{dtype} dense TFLOPS", f"peak_tflops.{dtype}", _num(spec.peak_tflops.get(dtype))) for dtype in DTYPES]
    sparse = "-" if spec.sparse_factor is None else f"x{spec.sparse_factor:g}"
    rows += [
        ("2:4 sparse factor", "sparse_factor", sparse),
        ("memory", "memory", _num(spec.memory_gb, f" {spec.memory_unit} {spec.memory_type}".rstrip())),
        *([("memory the driver exposes", "memory_visible",
            f"{spec.memory_visible_mib:,.0f} MiB ({spec.memory_visible_mib / 1024:.2f} GiB)")]
          if spec.memory_visible_mib is not None else []),
        ("memory bandwidth", "memory_bandwidth", _num(spec.memory_bandwidth_gbs, " GB/s")),
        ("scale-up per direction", "scale_up", _num(spec.scale_up_gbs, " GB/s")),
        ("devices per node", "devices_per_node", str(spec.devices_per_node)),
        ("scale-out per device", "scale_out", _num(spec.scale_out_gbs, " GB/s")),
        ("TDP", "tdp", _num(spec.tdp_w, " W")),
    ]
    return rows


def _print_device(spec: HardwareSpec) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    from flopwise.catalog.hardware import names_of

    names = names_of(spec.key)
    aliases = f"  (aliases: {', '.join(names)})" if names else ""
    console.print(f"[bold]{spec.name}[/bold]  key: {spec.key}{aliases}")
    figures = Table(title="figures", show_lines=False)
    for column in ("figure", "value", "confidence", "source", "note"):
        figures.add_column(column, justify="right" if column == "value" else "left", overflow="fold")
    cited: dict[str, str] = {}
    for label, figure, value in _figure_rows(spec):
        confidence = spec.confidence.get(figure, "")
        if value == "-" and confidence != "unknown":
            value = "unsupported"
        source_id = spec.source_ids.get(figure, "")
        if source_id:
            cited[source_id] = spec.sources[figure]
        figures.add_row(label, value, confidence, source_id or "-", spec.figure_notes.get(figure, ""))
    console.print(figures)
    for source_id, citation in cited.items():
        console.print(f"  [bold]{source_id}[/bold]: {citation}")
    basis = {"bidirectional": "bidirectional aggregate, halved here", "per-direction": "per direction",
             "unstated": "direction not stated, stored as published"}[spec.scale_up_basis]
    domain = f", scale-up domain {spec.scale_up_domain} devices" if spec.scale_up_domain else ""
    console.print(f"scale-up link: {spec.scale_up_link}; vendor said '{spec.scale_up_published}' ({basis}){domain}")
    if spec.prices:
        prices = Table(title="prices (USD per device-hour)")
        for column in ("provider", "sku", "region", "on-demand", "spot", "reserved", "date", "confidence", "source"):
            prices.add_column(column, overflow="fold")
        for p in spec.prices:
            money = [_num(x) if x is None else f"{x:.3f}" for x in
                     (p.on_demand_usd_per_hour, p.spot_usd_per_hour, p.reserved_usd_per_hour)]
            source = f"{p.source}\n[dim]{p.note}[/dim]" if p.note else p.source
            prices.add_row(p.provider, p.sku, p.region or "-", *money, p.date, p.confidence, source)
        console.print(prices)
    else:
        console.print("prices: none published in the catalog (pass --price-per-hour to `flopwise plan`)")
    if spec.seed_claims:
        claims = Table(title="published claims (articles in docs/hardware.md) checked against the figures above")
        for column in ("claim", "status", "verdict"):
            claims.add_column(column, overflow="fold")
        for claim in spec.seed_claims:
            claims.add_row(claim.claim, claim.status, claim.verdict)
        console.print(claims)
    if spec.notes:
        console.print(f"notes: {spec.notes}")
