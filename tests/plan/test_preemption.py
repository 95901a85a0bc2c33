"""Spot planning: Young/Daly intervals against their closed forms, Daly's expected wall time,
the break-even rate, and `flopwise plan --spot` as a real process."""

import json
import math
import os
import subprocess
import sys

import pytest

from flopwise.errors import UserError
from flopwise.plan.preemption import (
    break_even_rate, daly_interval, estimate_spot, expected_wall_seconds, spot_wall_seconds_at, young_interval,
)

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}


def test_young_interval_is_sqrt_2cm():
    # C = 5 min, M = 24 h: sqrt(2 * 300 * 86400) = 7200 s exactly
    assert young_interval(300.0, 86_400.0) == pytest.approx(7200.0, rel=1e-15)


@pytest.mark.parametrize("c, m", [(300.0, 86_400.0), (60.0, 3600.0), (1800.0, 7200.0), (10.0, 1e7)])
def test_daly_interval_matches_closed_form(c, m):
    x = c / (2 * m)
    expected = math.sqrt(2 * c * m) * (1 + math.sqrt(x) / 3 + x / 9) - c
    assert daly_interval(c, m) == pytest.approx(expected, rel=1e-15)
    # the brief's spelling of the same formula: 1 + sqrt(C/(2M))/3 + C/(18M)
    assert daly_interval(c, m) == pytest.approx(math.sqrt(2 * c * m) * (1 + math.sqrt(c / (2 * m)) / 3 + c / (18 * m)) - c)
    # for C << M Daly's optimum tends to Young's minus C
    if c / m < 1e-5:
        assert daly_interval(c, m) == pytest.approx(young_interval(c, m) - c, rel=1e-3)


def test_daly_interval_is_m_when_checkpoints_are_slow():
    assert daly_interval(5000.0, 2000.0) == 2000.0
    assert daly_interval(4000.0, 2000.0) == 2000.0


def test_daly_interval_minimises_expected_wall_time():
    c, r, m, work = 600.0, 300.0, 6 * 3600.0, 30 * 86_400.0
    tau = daly_interval(c, m)
    best = expected_wall_seconds(work, tau, c, r, m)
    for factor in (0.5, 0.8, 1.25, 2.0):
        assert expected_wall_seconds(work, tau * factor, c, r, m) > best


def test_expected_wall_time_closed_form_and_limits():
    c, r, m, tau, work = 120.0, 60.0, 10_000.0, 1_500.0, 1e6
    expected = m * math.exp(r / m) * (math.exp((tau + c) / m) - 1) * work / tau
    assert expected_wall_seconds(work, tau, c, r, m) == pytest.approx(expected, rel=1e-12)
    # no preemptions: work plus the checkpoints written
    assert expected_wall_seconds(work, tau, c, r, math.inf) == pytest.approx(work + work / tau * c)


def test_estimate_spot_accounts_for_every_second_and_recommends_from_cost():
    work = 10 * 86_400.0
    est = estimate_spot(work, 64, 4.0, 300.0, 600.0, on_demand_usd_per_device_hour=4.0, spot_usd_per_device_hour=1.5)
    assert est.mtbf_seconds == pytest.approx(21_600.0)
    parts = work + est.checkpoint_overhead_seconds + est.restart_overhead_seconds + est.lost_work_seconds
    assert parts == pytest.approx(est.spot_wall_seconds, rel=1e-12)
    assert est.expected_preemptions == pytest.approx(est.spot_wall_seconds / est.mtbf_seconds)
    assert est.on_demand_usd == pytest.approx(work / 3600 * 64 * 4.0)
    assert est.spot_usd == pytest.approx(est.spot_wall_seconds / 3600 * 64 * 1.5)
    assert est.recommendation == "spot"
    # at the break-even rate, spot's expected cost equals on-demand's
    rate = est.break_even_preemptions_per_day
    ratio = spot_wall_seconds_at(rate, work, 300.0, 600.0) / work
    assert ratio == pytest.approx(4.0 / 1.5, rel=1e-6)
    above = estimate_spot(work, 64, rate * 1.1, 300.0, 600.0, 4.0, 1.5)
    assert above.recommendation == "on-demand"


def test_break_even_when_spot_is_not_cheaper():
    assert break_even_rate(1e5, 60.0, 60.0, price_ratio=0.9) == 0.0


def test_bad_spot_inputs_are_user_errors():
    with pytest.raises(UserError, match="--preemptions-per-day"):
        estimate_spot(1e5, 8, -1.0, 60.0, 0.0, 2.0, 1.0)
    with pytest.raises(UserError, match="--checkpoint-seconds must be > 0"):
        estimate_spot(1e5, 8, 1.0, 0.0, 0.0, 2.0, 1.0)


def run_plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flopwise", "plan", *args], capture_output=True, text=True, env=ENV,
                          timeout=120)


def test_cli_spot_json_uses_the_catalog_spot_price():
    out = run_plan("--model", "llama2-7b", "--hardware", "h100-sxm", "--gpus", "64", "--tokens", "1T", "--spot",
                   "--preemptions-per-day", "3", "--checkpoint-seconds", "120", "--restart-seconds", "300", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    spot, plan = data["spot"], data["plan"]
    assert spot["daly_interval_seconds"] == pytest.approx(daly_interval(120.0, 86_400.0 / 3))
    assert spot["spot_usd_per_device_hour"] == plan["cost"]["spot_usd_per_device_hour"]
    assert spot["work_seconds"] == pytest.approx(plan["time"]["total_seconds"])
    assert spot["recommendation"] in ("spot", "on-demand")


def test_cli_search_then_spot_prints_the_verdict():
    out = run_plan("--model", "gpt3-1.3b", "--hardware", "a100-80gb", "--gpus", "8", "--tokens", "26B", "--search",
                   "--top", "1", "--spot", "--preemptions-per-day", "2", "--checkpoint-seconds", "60",
                   "--spot-price-per-hour", "0.8")
    assert out.returncode == 0, out.stderr
    assert "Daly 2006" in out.stdout and "break-even preemption rate" in out.stdout and "recommend" in out.stdout


def test_cli_spot_without_a_spot_price_is_one_line():
    out = run_plan("--model", "gpt3-1.3b", "--hardware", "a100-80gb", "--gpus", "8", "--spot",
                   "--preemptions-per-day", "2", "--checkpoint-seconds", "60")
    assert out.returncode == 2
    assert out.stderr.strip() == ("error: --spot: no spot price for a100-80gb in the catalog; "
                                  "pass --spot-price-per-hour")
