"""The memory forecast's own error band: a layout planned over the usable memory by less than
the validated error of the memory forecast is "tight" (kept, flagged), never judged not to fit."""

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flopwise.plan import band
from flopwise.plan.memory import GIB
from flopwise.plan.planner import build_runspec, plan, plan_memory
from flopwise.plan.search import search_layouts

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}


def with_capacity(spec, capacity_bytes: float):
    """`spec` with the device's reserve set so that `capacity_bytes` are usable."""
    device = spec.cluster.hardware.memory_bytes
    cluster = dataclasses.replace(spec.cluster, memory_reserve_gib=(device - capacity_bytes) / GIB)
    return dataclasses.replace(spec, cluster=cluster)


def test_the_memory_band_is_the_quantile_of_the_published_peaks_errors_never_under_its_floor():
    results = json.loads((ROOT / "benchmarks" / "results" / "validate_planner.json").read_text())
    peaks = results["published_memory_errors"]
    shipped = json.loads(band.BANDS_PATH.read_text())[band.MEMORY_KEY]
    assert shipped["rows"] == len(peaks) >= 2
    assert shipped["validated_error"] == pytest.approx(band.band_quantile(peaks))
    assert shipped["expected_error"] == pytest.approx(max(band.MIN_MEMORY_BAND, band.band_quantile(peaks)))
    assert band.memory_band() == pytest.approx(shipped["expected_error"])
    assert 0.02 <= band.memory_band() <= 0.25


def test_no_published_run_is_judged_not_to_fit():
    summary = json.loads((ROOT / "benchmarks" / "results" / "validate_planner.json").read_text())["summary"]
    assert summary["judged_not_to_fit"] == 0


@pytest.mark.parametrize("over, verdict", [(0.0, "fits"), (0.05, "tight"), (0.25, "does not fit")])
def test_the_verdict_follows_the_band(over, verdict):
    spec = build_runspec(model="llama2-7b", hardware="h100-sxm", gpus=8, zero=3, micro_batch=2)
    allocated = plan_memory(spec).allocated_bytes
    memory = plan_memory(with_capacity(spec, allocated / (1.0 + over) * (1 + 1e-9 if over == 0 else 1.0)))
    assert memory.band == pytest.approx(band.memory_band())
    assert memory.verdict == verdict
    assert memory.fits == (verdict == "fits")
    assert memory.may_fit == (verdict != "does not fit")
    assert memory.to_dict()["verdict"] == verdict


def test_a_search_keeps_a_tight_layout_when_nothing_fits_and_ranks_fitting_ones_first():
    spec = build_runspec(model="gpt3-125m", hardware="rtx4090", gpus=1, global_batch=4, seq_len=1024,
                         allocator_reserve=0.0)
    nothing = search_layouts(with_capacity(spec, 1 * GIB / 1024), 1, exhaustive=True)
    assert nothing.best is None
    leanest = nothing.smallest_memory_gib * GIB  # total = allocated with no allocator reserve
    tight = search_layouts(with_capacity(spec, leanest / 1.05), 1, exhaustive=True)
    assert tight.best is not None and tight.best.memory.verdict == "tight"
    assert tight.best.memory.allocated_bytes == pytest.approx(leanest)
    assert search_layouts(with_capacity(spec, leanest / 1.30), 1, exhaustive=True).best is None
    # the hungriest layout made tight: every layout that fits ranks before it
    every = search_layouts(with_capacity(spec, 20 * GIB), 1, top=50, exhaustive=True)
    hungriest = max(p.memory.allocated_bytes for p in every.ranked)
    roomy = search_layouts(with_capacity(spec, hungriest / 1.05), 1, top=50, exhaustive=True)
    verdicts = [p.memory.verdict for p in roomy.ranked]
    assert "fits" in verdicts and "tight" in verdicts
    assert verdicts == sorted(verdicts, key=lambda v: v != "fits")
    fitting = [p.time.step_seconds for p in roomy.ranked if p.fits]
    assert all(p.time.step_seconds < max(fitting) for p in roomy.ranked if not p.fits) or len(fitting) < 50


def test_a_stated_recompute_is_planned_as_given_and_a_tight_plan_says_so():
    """Llama 3.1 405B at the 8,192-GPU layout of its paper (Table 4, sec. 3.3.2): no activation
    checkpointing, ZeRO-2, interleaved. It fits an H100's 79.6 GiB less the 2 GiB reserve; with 7 GiB
    reserved (72.6 GiB usable) it is planned 7 % over: tight."""
    args = ["plan", "--model", "llama3.1-405b", "--hardware", "h100-sxm", "--gpus", "8192", "--tp", "8", "--pp", "16",
            "--seq-len", "8192", "--global-batch", "2048", "--stack", "torchtitan", "--sequence-parallel",
            "--schedule", "interleaved", "--virtual-stages", "7", "--zero", "2", "--framework", "megatron"]
    roomy = subprocess.run([sys.executable, "-m", "flopwise", *args, "--recompute", "none", "--json"],
                           capture_output=True, text=True, env=ENV, timeout=120)
    assert roomy.returncode == 0 and json.loads(roomy.stdout)["memory"]["verdict"] == "fits", roomy.stderr
    args += ["--memory-reserve-gib", "7"]
    stated = subprocess.run([sys.executable, "-m", "flopwise", *args, "--recompute", "none", "--json"],
                            capture_output=True, text=True, env=ENV, timeout=120)
    assert stated.returncode == 0, stated.stderr
    out = json.loads(stated.stdout)
    assert out["memory"]["verdict"] == "tight" and out["fits"] is False and out["memory"]["may_fit"] is True
    assert not any("recompute" in option for option in out["memory"]["fits_with"])
    text = subprocess.run([sys.executable, "-m", "flopwise", *args, "--recompute", "none"],
                          capture_output=True, text=True, env=ENV, timeout=120)
    assert text.returncode == 0 and "tight" in text.stdout and "may fit" in text.stdout
    # left open, the stack's recompute ladder makes the same layout fit outright
    open_ = json.loads(subprocess.run([sys.executable, "-m", "flopwise", *args, "--json"], capture_output=True,
                                      text=True, env=ENV, timeout=120).stdout)
    assert open_["fits"] is True and any("recompute" in option for option in open_["memory"]["fits_with"])


def test_a_stated_layout_that_is_tight_is_kept_as_stated_and_an_open_one_gets_recompute():
    """NeMo's Nemotron-H 8B row (8 H100, tp 1, micro-batch 1, fp8, no recompute) is planned a little
    over the usable memory, within the forecast's band: typed whole, as the row states it, it is kept
    so (tight, no recompute added, advice listed); the search, which states no layout, still only
    ranks layouts that fit outright, the stack's recompute among them."""
    layout = dict(model="nemotron-h-8b", hardware="h100-sxm", stack="nemo", gpus=8, seq_len=8192, precision="fp8",
                  global_batch=128)
    stated = plan(build_runspec(tp=1, micro_batch=1, **layout))
    assert not stated.fits and stated.memory.may_fit and stated.memory.verdict == "tight"
    assert stated.spec.layout.recompute == "none" and stated.advice
    assert plan_memory(build_runspec(tp=1, micro_batch=1, **layout)).fits_with == stated.memory.fits_with
    open_ = plan(build_runspec(tp=1, **layout))  # the micro-batch left open: the stack's ladder applies
    assert open_.fits and open_.spec.layout.recompute != "none"
    assert open_.time.step_seconds > stated.time.step_seconds


def test_fsdp_zero2_in_a_pipeline_holds_unsharded_fp32_gradients():
    """FSDP2 without resharding after forward, in a pipeline stage: the schedule syncs only the
    last micro-batch, so each stage parameter's gradient is held whole in fp32 until then."""
    spec = build_runspec(model="llama2-7b", hardware="h100-sxm", gpus=16, pp=2, zero=2, micro_batch=1,
                         global_batch=64, recompute="full")
    memory = plan_memory(spec)
    assert memory.gradients == pytest.approx(memory.weights * 2.0, rel=1e-9)  # fp32 beside bf16 weights
    sharded = plan_memory(dataclasses.replace(spec, layout=dataclasses.replace(spec.layout, framework="megatron")))
    assert sharded.gradients < memory.gradients / 4
    assert plan(spec).to_dict()["memory"]["gradients"] == pytest.approx(memory.gradients)


def test_a_search_table_names_its_tight_layouts_apart_from_those_that_fit():
    """GPT-3 175B on 1,024 A100-80GB: micro-batch 3 is planned a few GiB over the usable memory,
    within the band; the heading counts those rows apart and each has a note with both figures."""
    out = subprocess.run([sys.executable, "-m", "flopwise", "plan", "--model", "gpt3-175b", "--hardware",
                          "a100-80gb", "--gpus", "1024", "--global-batch", "1536", "--tokens", "300B",
                          "--search", "--top", "5"], capture_output=True, text=True, env=ENV, check=True).stdout
    heading = out.splitlines()[0]
    tight_notes = [line for line in out.splitlines() if " tight: " in line]
    assert "best 5 by time" in heading
    assert tight_notes, out
    assert f"then {len(tight_notes)} tight (may not fit)" in heading
    for note in tight_notes:
        allocated, reserved, usable = (float(x) for x in re.findall(r"(\d+\.\d) (?:GiB allocated|with|GiB usable)", note))
        assert allocated < reserved and usable < allocated <= usable * 1.11, note


def test_a_search_where_only_tight_layouts_remain_says_none_fits_outright():
    """79.5 GiB of an A100-80GB's 80 reserved: Llama 2 7B's leanest layouts are within the band, none fits."""
    args = [sys.executable, "-m", "flopwise", "plan", "--model", "llama2-7b", "--hardware", "a100-80gb", "--gpus",
            "8", "--tokens", "1B", "--search", "--top", "3"]
    out = subprocess.run([*args, "--memory-reserve-gib", "79.5"], capture_output=True, text=True, env=ENV,
                         check=True).stdout
    assert "none fits outright; best" in out.splitlines()[0] and " tight: " in out
    refused = subprocess.run([*args, "--memory-reserve-gib", "82"], capture_output=True, text=True, env=ENV)
    assert refused.returncode == 2
    assert (refused.stdout + refused.stderr).strip().splitlines() == [
        "error: --memory-reserve-gib 82 leaves no usable memory on a100-80gb (80.0 GiB)"]
