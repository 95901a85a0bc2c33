"""Small-team hybrid plan: local cards vs a cloud node, priced from the planner's own figures,
and `flopwise compare --local` as a real process."""

import json
import os
import subprocess
import sys

import pytest

from flopwise.errors import UserError
from flopwise.plan.hybrid import HOURS_PER_YEAR, Site, parse_site, plan_hybrid

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}


@pytest.fixture(scope="module")
def seed_example():
    """The seed's setup: 4 x RTX 4090 locally, 8 x V100 32GB in the cloud, a 1B-token fine-tune of Llama 2 7B."""
    return plan_hybrid("llama2-7b", "1B", Site("rtx4090", 4, 128.0), Site("v100-32gb", 8),
                       electricity_usd_per_kwh=0.15, local_hardware_usd=1599.0, amortize_years=3.0)


def test_local_cost_is_electricity_plus_amortised_cards(seed_example):
    job = seed_example.job
    assert job.local is not None and job.local.plan.fits
    expected = job.local.kwh * 0.15 + job.local.device_hours * 1599.0 / (3.0 * HOURS_PER_YEAR)
    assert job.local_usd == pytest.approx(expected, rel=1e-12)
    assert job.cloud_usd == pytest.approx(job.cloud.plan.cost.on_demand_usd)
    # offloaded states stay within the machine's RAM, shared by its 4 cards
    assert job.local.plan.memory.cpu_offload_bytes <= 128.0 / 4 * 2**30


def test_sweep_finds_where_local_stops_fitting(seed_example):
    rows = seed_example.sweep
    sizes = [r.params for r in rows]
    assert sizes == sorted(sizes) and "llama2-7b" in [r.model for r in rows]
    first_out = next(i for i, r in enumerate(rows) if r.local is None)
    assert all(r.local is not None for r in rows[:first_out])
    assert any(f"from {rows[first_out].model}" in line and "no longer fits locally" in line
               for line in seed_example.findings)


def test_buy_break_even_tokens_makes_costs_equal(seed_example):
    job, tokens = seed_example.job, seed_example.buy_break_even_tokens
    assert tokens is not None and tokens > 0
    per_token_cloud = job.cloud_usd / seed_example.tokens
    per_token_power = job.local.kwh * 0.15 / seed_example.tokens
    assert 4 * 1599.0 + per_token_power * tokens == pytest.approx(per_token_cloud * tokens, rel=1e-9)


def test_parse_site_and_bad_inputs():
    assert parse_site("v100-32gb:8:768", "--cloud") == Site("v100-32gb", 8, 768.0)
    assert parse_site("a100-80gb", "--cloud") == Site("a100-80gb", 8)
    with pytest.raises(UserError, match="DEVICE:COUNT"):
        parse_site("v100-32gb:eight", "--cloud")
    with pytest.raises(UserError, match="--electricity-usd-per-kwh"):
        plan_hybrid("gpt3-125m", "1B", Site("rtx4090", 2), electricity_usd_per_kwh=-1, sweep=False)


def run_compare(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flopwise", "compare", *args], capture_output=True, text=True,
                          env=ENV, timeout=120)


def test_cli_local_prints_crossovers_and_writes_files(tmp_path):
    out = run_compare("--model", "llama2-7b", "--hardware", "rtx4090", "--gpus", "4", "--local", "--tokens", "1B",
                      "--local-hardware-usd", "1599", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "local 4 x rtx4090" in out.stdout and "cloud 8 x v100-32gb" in out.stdout
    assert "no longer fits locally" in out.stdout and "buying the 4 x rtx4090" in out.stdout
    data = json.loads((tmp_path / "hybrid.json").read_text())
    assert data["job"]["model"] == "llama2-7b" and data["job"]["local"] is not None
    assert (tmp_path / "hybrid.csv").read_text().startswith("model,params,local_layout")


def test_cli_local_needs_hardware_and_gpus(tmp_path):
    out = run_compare("--model", "llama2-7b", "--local", "--out", str(tmp_path))
    assert out.returncode == 2
    assert out.stderr.strip().startswith("error: --local needs one --hardware (your cards) and --gpus")
