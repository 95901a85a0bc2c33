"""The hardware catalog: every figure sourced, datasheet values right, lookups and CLI behave."""

from __future__ import annotations

import copy
import functools
import json
import os
import subprocess
import sys

import pytest
import yaml

from flopwise.catalog.hardware import (
    CATALOG_PATH,
    CONFIDENCES,
    DTYPES,
    FIGURES,
    get_hardware,
    load_catalog,
    load_hardware,
    parse_hardware,
)
from flopwise.errors import UserError

REQUIRED_KEYS = (
    "h100-sxm", "h100-pcie", "h200", "a100-40gb", "a100-80gb", "a100-80gb-pcie", "v100-32gb",
    "v100-32gb-pcie", "rtx4090", "l40s", "tpu-v4", "tpu-v5e", "tpu-v5p", "mi300x", "gaudi2", "gaudi3",
    "ascend-910", "ascend-910b2", "ascend-910b3", "ascend-910b4", "mlu370-x8", "dcu-z100", "dcu-k100-ai",
    "h800", "a800-80gb", "h20", "b200", "gb200",
)


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "flopwise", *args], capture_output=True, text=True, env=env,
                          timeout=120)


@functools.lru_cache(maxsize=1)
def _raw_document() -> dict:
    return yaml.safe_load(CATALOG_PATH.read_text(encoding="utf-8"))


def test_catalog_has_every_required_device():
    assert set(REQUIRED_KEYS) <= set(load_hardware())


@pytest.mark.parametrize("key", REQUIRED_KEYS)
def test_every_figure_has_source_and_confidence(key):
    spec = get_hardware(key)
    # the host link and the memory the driver exposes are optional
    assert set(spec.confidence) - {"host_link", "memory_visible"} == set(FIGURES)
    if spec.host_link_gbs is not None:
        assert spec.sources["host_link"].strip() and spec.confidence["host_link"] in CONFIDENCES
    if spec.memory_visible_mib is not None:
        assert spec.sources["memory_visible"].strip() and spec.confidence["memory_visible"] in CONFIDENCES
    for figure in FIGURES:
        confidence = spec.confidence[figure]
        assert confidence in CONFIDENCES
        if confidence != "unknown":
            assert spec.sources[figure].strip(), f"{key} {figure} has no source"
    # unknown means no number: a figure is never invented and labelled unknown
    values = {f"peak_tflops.{d}": spec.peak_tflops[d] for d in DTYPES}
    values.update(memory=spec.memory_gb, memory_bandwidth=spec.memory_bandwidth_gbs, scale_up=spec.scale_up_gbs,
                  scale_out=spec.scale_out_gbs, tdp=spec.tdp_w, sparse_factor=spec.sparse_factor)
    for figure, value in values.items():
        if spec.confidence[figure] == "unknown":
            assert value is None, f"{key} {figure} is unknown but has value {value}"
    for price in spec.prices:
        assert price.date and price.source and price.provider and price.sku
        assert price.confidence in CONFIDENCES


# Hard expectations from shared/validation/published.md (V/S-tagged rows).
@pytest.mark.parametrize(
    ("key", "dtype", "tflops"),
    [
        ("h100-sxm", "bf16", 989.4), ("h100-sxm", "fp8", 1978.9), ("h100-sxm", "tf32", 494.7),
        ("h100-sxm", "fp32", 66.9), ("h100-pcie", "bf16", 756), ("h200", "bf16", 989.4),
        ("a100-80gb", "bf16", 312), ("a100-40gb", "bf16", 312), ("a100-80gb-pcie", "bf16", 312),
        ("v100-32gb", "fp16", 125), ("v100-32gb-pcie", "fp16", 112), ("rtx4090", "bf16", 165.2),
        ("l40s", "bf16", 362.05), ("tpu-v4", "bf16", 275), ("tpu-v5e", "bf16", 197), ("tpu-v5p", "bf16", 459),
        ("mi300x", "bf16", 1307.4), ("mi300x", "fp8", 2614.9), ("gaudi2", "bf16", 432), ("gaudi3", "bf16", 1835),
        ("ascend-910", "fp16", 256), ("ascend-910b2", "fp16", 353.8), ("ascend-910b3", "fp16", 294.9),
        ("ascend-910b4", "fp16", 245.7), ("mlu370-x8", "fp16", 96), ("dcu-k100-ai", "bf16", 196),
        ("h800", "bf16", 989.4), ("h800", "fp8", 1978.9), ("h800", "tf32", 494.7), ("a800-80gb", "bf16", 312),
        ("h20", "bf16", 148), ("h20", "fp8", 296), ("h20", "tf32", 74), ("h20", "fp32", 44),
        ("b200", "bf16", 2250), ("b200", "fp8", 4500), ("gb200", "bf16", 2500), ("gb200", "fp8", 5000),
    ],
)
def test_dense_peaks_match_published_figures(key, dtype, tflops):
    spec = get_hardware(key)
    assert spec.peak_tflops[dtype] == pytest.approx(tflops)
    assert spec.peak_flops(dtype) == pytest.approx(tflops * 1e12)


@pytest.mark.parametrize(
    ("key", "memory_bytes", "bandwidth_gbs", "tdp_w"),
    [
        ("h100-sxm", 80e9, 3350, 700), ("h200", 141e9, 4800, 700), ("a100-80gb", 80e9, 2039, 400),
        ("a100-40gb", 40e9, 1555, 400), ("a100-80gb-pcie", 80e9, 1935, 300), ("v100-32gb", 32e9, 900, 300),
        ("rtx4090", 24e9, 1008, 450), ("l40s", 48e9, 864, 350), ("tpu-v4", 32 * 2**30, 1200, 192),
        ("mi300x", 192e9, 5300, 750), ("gaudi3", 128e9, 3670, 900), ("mlu370-x8", 48e9, 614.4, 250),
        ("h800", 80e9, 3350, 700), ("a800-80gb", 80e9, 2039, 400), ("h20", 96e9, 4000, 400),
        ("b200", 180e9, 8000, 1000), ("gb200", 186e9, 8000, 1200),
    ],
)
def test_memory_bandwidth_and_power_match_published_figures(key, memory_bytes, bandwidth_gbs, tdp_w):
    spec = get_hardware(key)
    datasheet = spec.memory_gb * (2**30 if spec.memory_unit == "GiB" else 1e9)
    assert datasheet == pytest.approx(memory_bytes)
    assert spec.memory_bandwidth_gbs == pytest.approx(bandwidth_gbs)
    assert spec.tdp_w == pytest.approx(tdp_w)


def test_scale_up_is_stored_per_direction():
    assert get_hardware("h100-sxm").scale_up_gbs == 450  # NVLink 4: 900 GB/s bidirectional
    assert get_hardware("a100-80gb").scale_up_gbs == 300  # NVLink 3: 600 GB/s bidirectional
    assert get_hardware("tpu-v5e").scale_up_gbs == 200  # ICI 400 GBps bidirectional
    assert get_hardware("h100-sxm").scale_up_basis == "bidirectional"
    assert get_hardware("h100-sxm").scale_out_gbs == 50  # DGX H100: 8 x 400 Gb/s for 8 GPUs


@pytest.mark.parametrize(
    ("key", "per_direction", "domain", "per_node", "scale_out"),
    [("h800", 200, 8, 8, 50), ("a800-80gb", 200, 8, 8, 25), ("h20", 450, 8, 8, 50),
     ("b200", 900, 8, 8, 50), ("gb200", 900, 72, 4, 50)],
)
def test_cut_and_blackwell_links_are_stored_per_direction(key, per_direction, domain, per_node, scale_out):
    """H800 and A800: NVLink cut to 400 GB/s both ways; H20 keeps 900; NVLink 5 is 1,800; NVL72's
    NVLink reaches the 72-GPU rack while a compute tray holds 4."""
    spec = get_hardware(key)
    assert spec.scale_up_gbs == per_direction and spec.scale_up_basis == "bidirectional"
    assert spec.scale_up_domain == domain and spec.devices_per_node == per_node
    assert spec.scale_out_gbs == scale_out
    if scale_out is None:  # no server sheet: unknown, never a guess
        assert spec.confidence["scale_out"] == "unknown"


def test_h800_keeps_the_datasheet_nvlink_and_deepseeks_infiniband():
    """DeepSeek-V3 (arXiv 2412.19437, sec. 3.2): NVLink 160 GB/s achieved, InfiniBand 50 GB/s per GPU."""
    h800 = get_hardware("h800")
    assert h800.scale_up_published == "NVLink 4: 400 GB/s"
    assert "160 GB/s" in h800.figure_notes["scale_up"]
    assert h800.source_ids["scale_out"] == "deepseek-v3" and "2412.19437" in h800.sources["scale_out"]
    assert h800.confidence["peak_tflops.bf16"] == "recalled"  # the product page was not re-read


def test_sparse_peaks_are_dense_times_factor():
    h100 = get_hardware("h100-sxm")
    assert h100.sparse_peak_flops("fp8") == pytest.approx(2 * h100.peak_flops("fp8"))
    assert h100.sparse_peak_flops("fp8") == pytest.approx(3957.8e12)
    assert get_hardware("v100-32gb").sparse_peak_flops("fp16") is None  # no structured sparsity on Volta


def test_unsupported_formats_are_null_with_a_source():
    a100 = get_hardware("a100-80gb")
    assert a100.peak_tflops["fp8"] is None and a100.confidence["peak_tflops.fp8"] != "unknown"
    assert a100.sources["peak_tflops.fp8"]
    v100 = get_hardware("v100-32gb")
    assert v100.peak_tflops["bf16"] is None and v100.confidence["peak_tflops.bf16"] != "unknown"
    # ...whereas a figure nobody published is null *and* unknown
    assert get_hardware("dcu-z100").confidence["peak_tflops.fp16"] == "unknown"


def test_rtx4090_records_fp32_accumulate_rate_and_notes_the_other():
    spec = get_hardware("rtx4090")
    assert spec.peak_tflops["fp16"] == pytest.approx(165.2)
    assert "330.3" in spec.figure_notes["peak_tflops.fp16"]


def _all_claims():
    catalog = load_catalog()
    claims = [c for spec in catalog.devices.values() for c in spec.seed_claims]
    return claims + list(catalog.general_seed_claims)


@pytest.mark.parametrize(
    ("needle", "status"),
    [
        ("4PetaFLOPS FP8", "correct-as-sparse"),
        ("3TB/s", "roughly-right"),
        ("192GB HBM2e", "wrong"),
        ("256PFLOPS", "wrong"),
        ("BERT-Large", "unverifiable"),
        ("ConvNet", "not-supported"),
        ("Llama2-70B", "unverifiable"),
        ("30%", "unverifiable"),
        ("0.1 TFLOPS/W", "roughly-right"),
    ],
)
def test_seed_claims_are_kept_with_verdicts(needle, status):
    matches = [c for c in _all_claims() if needle in c.claim]
    assert len(matches) == 1, needle
    assert matches[0].status == status
    assert len(matches[0].verdict) > 40


def test_ascend_cluster_claim_verdict_carries_the_arithmetic():
    claim = next(c for c in get_hardware("ascend-910b2").seed_claims if "256PFLOPS" in c.claim)
    assert 32 * get_hardware("ascend-910b2").peak_tflops["fp16"] / 1000 == pytest.approx(11.3, abs=0.05)
    assert "11.3 PFLOPS" in claim.verdict


@pytest.mark.parametrize(
    ("alias", "key"),
    [("h100-80gb", "h100-sxm"), ("H100-SXM5", "h100-sxm"), (" A100-80GB-SXM ", "a100-80gb"), ("a100-80gb", "a100-80gb"),
     ("910b3", "ascend-910b3"), ("4090", "rtx4090"), ("v5p", "tpu-v5p"), ("MI300X", "mi300x"), ("mi300", "mi300x"),
     ("ascend910", "ascend-910"), ("h200-s", "h200"), ("gaudi", None),
     # full names as papers and vendors print them: every word must match, the SXM generation aside
     ("A100 80GB", "a100-80gb"), ("a100-sxm4-80gb", "a100-80gb"), ("A100-SXM4-40GB", "a100-40gb"),
     ("NVIDIA H100 SXM5 80GB", "h100-sxm"), ("h100_pcie", "h100-pcie"), ("TPU v4", "tpu-v4"),
     # the China-market and Blackwell parts, as published runs and vendors name them
     ("H800", "h800"), ("NVIDIA H800 SXM5 80GB", "h800"), ("A800 80GB", "a800-80gb"),
     ("A800-SXM4-80GB", "a800-80gb"), ("a800", "a800-80gb"), ("NVIDIA A800-SXM4-80GB", "a800-80gb"),
     ("H20", "h20"), ("NVIDIA H20", "h20"), ("h200", "h200"), ("H200 SXM", "h200"),
     ("B200", "b200"), ("DGX B200", "b200"), ("NVIDIA B200", "b200"), ("GB200", "gb200"),
     ("GB200 NVL72", "gb200"), ("NVIDIA GB200 NVL72", "gb200")],
)
def test_keys_aliases_and_unique_prefixes_resolve(alias, key):
    if key is None:  # gaudi2 and gaudi3
        with pytest.raises(UserError, match=r"matches 2 catalog entries: gaudi2, gaudi3"):
            get_hardware(alias)
    else:
        assert get_hardware(alias).key == key


@pytest.mark.parametrize(
    ("name", "listed"),
    [("a100", "a100-40gb, a100-80gb, a100-80gb-pcie"), ("A100-SXM", "a100-40gb, a100-80gb"),
     ("NVIDIA A100 SXM4", "a100-40gb, a100-80gb"),
     ("NVIDIA A100", "a100-40gb, a100-80gb, a100-80gb-pcie"),
     ("910b", "ascend-910b2, ascend-910b3, ascend-910b4")],
)
def test_a_name_shared_by_several_parts_lists_them(name, listed):
    with pytest.raises(UserError, match=rf"hardware '{name}' matches \d catalog entries: {listed}; name one of them") as err:
        get_hardware(name)
    assert "\n" not in str(err.value)


def test_an_ambiguous_name_on_the_command_line_is_one_line_and_exit_2():
    done = subprocess.run([sys.executable, "-m", "flopwise", "plan", "--hardware", "a100"], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: hardware 'a100' matches 3 catalog entries: a100-40gb, a100-80gb, a100-80gb-pcie; "
        "name one of them (see `flopwise hardware`)"
    ]


def test_unknown_name_suggests_close_matches():
    with pytest.raises(UserError, match=r"unknown hardware 'h1000'; did you mean .*h100.*\(see `flopwise hardware`\)"):
        get_hardware("h1000")


def test_cheapest_on_demand_ignores_reserved_capacity():
    a100 = get_hardware("a100-40gb")
    assert any(p.reserved_usd_per_hour == pytest.approx(1.844) for p in a100.prices)
    assert a100.cheapest_on_demand().on_demand_usd_per_hour == pytest.approx(2.7447)
    assert get_hardware("gaudi3").cheapest_on_demand() is None


def test_load_is_cached_and_returns_fresh_dicts():
    first, second = load_hardware(), load_hardware()
    assert first is not second and first["h100-sxm"] is second["h100-sxm"]


def _mutated(edit) -> dict:
    doc = copy.deepcopy(_raw_document())
    edit(doc)
    return doc


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["devices"]["h100-sxm"].pop("tdp_w"), r"device 'h100-sxm': missing field\(s\) tdp_w"),
        (lambda d: d["devices"]["l40s"]["peak_tflops"]["bf16"].update(confidence="guess"),
         r"device 'l40s': peak_tflops.bf16.confidence: 'guess' is not one of"),
        (lambda d: d["devices"]["a100-80gb"]["memory"].update(source="no-such-source"),
         r"device 'a100-80gb': memory.source: 'no-such-source' is not an id"),
        (lambda d: d["devices"]["gaudi2"]["peak_tflops"]["int8"].update(value=100),
         r"device 'gaudi2': peak_tflops.int8: confidence 'unknown' requires value: null"),
        (lambda d: d["devices"]["mi300x"]["memory_bandwidth_gbs"].update(value="fast"),
         r"device 'mi300x': memory_bandwidth.value: value must be a positive number"),
        (lambda d: d["devices"]["h200"]["aliases"].append("h100"),
         r"device 'h200': aliases: 'h100' is already a key or another device's alias"),
        (lambda d: d["devices"]["tpu-v4"]["memory"].update(unit="TB"), r"device 'tpu-v4': memory.unit"),
        (lambda d: d["devices"]["h100-sxm"]["prices"][0].update(date="last week"),
         r"device 'h100-sxm': prices\[0\].date"),
        (lambda d: d["devices"]["v100-32gb"].update(colour="green"), r"device 'v100-32gb': unknown field\(s\) colour"),
    ],
)
def test_malformed_entries_raise_user_error_naming_device_and_field(edit, message):
    with pytest.raises(UserError, match=message):
        parse_hardware(_mutated(edit))


def test_cli_unknown_name_exits_2_with_one_line():
    result = _run_cli("hardware", "nope")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: unknown hardware 'nope'")
    assert "Traceback" not in result.stderr


def test_cli_json_parses_for_list_and_device():
    listing = _run_cli("hardware", "--json")
    assert listing.returncode == 0, listing.stderr
    records = json.loads(listing.stdout)
    assert {r["key"] for r in records} >= set(REQUIRED_KEYS)
    one = _run_cli("hardware", "h100-sxm", "--json")
    record = json.loads(one.stdout)
    assert record["key"] == "h100-sxm"
    assert record["sparse_peak_tflops"]["fp8"] == pytest.approx(3957.8)
    assert record["confidence"]["peak_tflops.bf16"] == "datasheet"
    assert any("4PetaFLOPS" in c["claim"] for c in record["seed_claims"])


def test_cli_table_and_detail_render():
    table = _run_cli("hardware")
    assert table.returncode == 0 and "h100-sxm" in table.stdout and "989.4" in table.stdout
    detail = _run_cli("hardware", "mlu370-x8")
    assert detail.returncode == 0
    assert "cambricon-mlu370" in detail.stdout and "wrong" in detail.stdout


def test_importing_the_catalog_does_not_import_torch():
    code = (
        "import sys; import flopwise.catalog.hardware as h; h.load_hardware(); "
        "print('torch' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


@pytest.mark.parametrize("name", ["a10", "l4"])
def test_a_prefix_never_cuts_a_model_number_short(name):
    """NVIDIA's A10 and L4 are other parts than the A100 and L40S: no prefix match."""
    with pytest.raises(UserError, match=rf"unknown hardware '{name}'"):
        get_hardware(name)


def test_h20_and_h200_and_a800_and_a100_never_read_as_each_other():
    """The H20 (148 TFLOPS bf16) is its own part, not a prefix of the H200 (989); the A800 is not an A100."""
    from flopwise.catalog.hardware import devices_with_tokens, matching_devices

    assert get_hardware("h20").key == "h20" and get_hardware("h200").key == "h200"
    assert matching_devices("h20") == ["h20"] and "h20" not in matching_devices("h200")
    assert devices_with_tokens("nvidia-h20") == ["h20"] and devices_with_tokens("nvidia-h200") == ["h200"]
    assert get_hardware("a800").key == "a800-80gb"
    assert not any(key.startswith("a800") for key in matching_devices("a100"))
    assert "a800-80gb" not in devices_with_tokens("a100-sxm4-80gb")


def test_the_device_page_lists_only_aliases_that_name_it():
    from flopwise.catalog.hardware import names_of

    assert names_of("a100-80gb") == ["a100-80gb-sxm"]  # "a100" and "a100-sxm" name the 40 GB card too
    done = subprocess.run([sys.executable, "-m", "flopwise", "hardware", "a100-80gb"], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0 and "(aliases: a100-80gb-sxm)" in done.stdout


@pytest.mark.parametrize(("name", "key"), [("h100", "h100-sxm"), ("H100", "h100-sxm"), ("NVIDIA H100", "h100-sxm"),
                                           ("v100", "v100-32gb"), ("H100 PCIe", "h100-pcie")])
def test_a_name_whose_parts_share_their_memory_is_the_part_its_alias_names(name, key):
    """"H100" in papers and NeMo's tables is the SXM module; both H100 cards have 80 GB, so no
    forecast can say a model fits that does not: the alias resolves, the plan names the part."""
    assert get_hardware(name).key == key


@pytest.mark.parametrize(("name", "key"), [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("DGX H100", "h100-sxm"), ("HGX H100", "h100-sxm"),
    ("H200 SXM 141GB", "h200"), ("GeForce RTX 4090", "rtx4090"), ("NVIDIA GeForce RTX 4090", "rtx4090"),
    ("HGX A100 80GB", "a100-80gb"), ("DGX B200", "b200")])
def test_a_part_named_with_its_system_or_memory(name, key):
    """nvidia-smi's names ("NVIDIA H100 80GB HBM3"), a system around the part (DGX, HGX), a brand
    (GeForce) and the part's own memory size ("141GB") name the part; the memory word must be the part's."""
    assert get_hardware(name).key == key


def test_system_words_do_not_hide_an_ambiguity():
    """A DGX A100 came with 40 or 80 GB cards: still refused, naming them."""
    with pytest.raises(UserError, match="matches 3 catalog entries"):
        get_hardware("DGX A100")
    with pytest.raises(UserError, match="unknown hardware"):
        get_hardware("H200 SXM 80GB")


@pytest.mark.parametrize(("key", "mib"), [
    ("h100-sxm", 81559), ("h800", 81559), ("h200", 143771), ("a100-80gb", 81920), ("a800-80gb", 81920),
    ("a100-40gb", 40960), ("rtx4090", 24564), ("l40s", 46068), ("b200", 183359)])
def test_fit_checks_use_the_memory_the_driver_exposes(key, mib):
    """NVIDIA's "80GB" parts expose ~80 GiB (nvidia-smi memory.total), 7 % more than 80e9 bytes; where a
    source shows it, that is the device's memory; the datasheet figure stays what the catalog prints."""
    spec = get_hardware(key)
    assert spec.memory_visible_mib == mib and spec.memory_bytes == mib * 2**20
    assert spec.memory_bytes > spec.memory_gb * 1e9
    assert get_hardware("a100-80gb-pcie").memory_visible_mib is None  # no source shows it: the datasheet's
    assert get_hardware("a100-80gb-pcie").memory_bytes == 80e9
