"""Device comparison: fewest devices that fit, deadline/budget modes, the Pareto front, and
`flopwise compare` writing PNG / JSON / CSV as a real process."""

import csv
import dataclasses
import json
import os
import subprocess
import sys

import pytest

from flopwise.catalog.hardware import get_hardware
from flopwise.errors import UserError
from flopwise.plan.compare import DEFAULT_HOST_MEMORY_GIB, compare_devices, device_counts, pareto_front
from flopwise.plan.planner import build_runspec
from flopwise.plan.search import fits_anywhere

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}


def run_compare(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flopwise", "compare", *args], capture_output=True, text=True,
                          env=ENV, timeout=120)


def test_device_counts_are_powers_of_two_then_whole_nodes():
    assert device_counts(get_hardware("h100-sxm"), 64) == [1, 2, 4, 8, 16, 32, 64]
    assert device_counts(get_hardware("tpu-v4"), 32) == [1, 2, 4, 8, 16, 32]


def test_fewest_devices_is_the_first_count_that_fits():
    result = compare_devices("llama2-13b", "100B", ["a100-40gb", "rtx4090"], max_devices=64)
    for verdict in result.verdicts:
        chosen = verdict.chosen
        assert chosen is not None and chosen.plan.fits
        hw = get_hardware(verdict.hardware)
        smaller = [n for n in device_counts(hw, 64) if n < chosen.devices]
        spec = build_runspec(model="llama2-13b", hardware=hw.key, gpus=1, tokens="100B")
        host = DEFAULT_HOST_MEMORY_GIB / hw.devices_per_node  # compare's default host-memory check
        assert all(fits_anywhere(spec, n, host_memory_per_device_gib=host) is None for n in smaller)
        assert chosen.plan.memory.cpu_offload_bytes <= host * 2**30
        assert chosen.layout.startswith(f"dp {chosen.plan.spec.layout.dp} ")
    assert any("no published price" in line and "rtx4090" in line for line in result.advice)


def test_deadline_picks_enough_devices_and_budget_the_fastest_within():
    deadline = compare_devices("gpt3-1.3b", "100B", ["a100-80gb", "h100-sxm"], deadline_days=3, max_devices=512)
    for verdict in deadline.verdicts:
        assert verdict.chosen.days <= 3
        slower = [o for o in verdict.options if o.devices < verdict.chosen.devices]
        assert all(o.days > 3 for o in slower)
    budget = compare_devices("gpt3-1.3b", "100B", ["a100-80gb"], budget_usd=20_000, max_devices=512)
    chosen = budget.verdicts[0].chosen
    assert chosen.on_demand_usd <= 20_000
    assert all(o.days >= chosen.days for o in budget.verdicts[0].options if o.on_demand_usd <= 20_000)


def test_pareto_front_has_no_dominated_option():
    result = compare_devices("gpt3-1.3b", "50B", ["a100-80gb", "h100-sxm", "a100-40gb", "v100-32gb"], max_devices=64)
    options = [o for v in result.verdicts for o in v.options if o.priced]
    front = pareto_front(options)
    assert front and [(o.hardware, o.devices) for o in front] == [(o.hardware, o.devices) for o in result.pareto]
    for f in front:
        assert not any(o.days <= f.days and o.on_demand_usd <= f.on_demand_usd
                       and (o.days < f.days or o.on_demand_usd < f.on_demand_usd) for o in options)
    for o in options:
        if o not in front:
            assert any(f.days <= o.days and f.on_demand_usd <= o.on_demand_usd for f in front)


def test_cnn_gets_a_sample_batch_and_the_cv_rule_of_thumb():
    result = compare_devices("resnet50", "10M", ["a100-80gb", "tpu-v4"], gpus=8)
    assert all(v.chosen is not None for v in result.verdicts)
    assert result.verdicts[0].chosen.plan.spec.layout.global_batch_size == 256
    assert result.rules_of_thumb[0].startswith("rule of thumb from the blog post \"AI算力发展趋势：从硬件加速到算法优化的技术演进\": CV tasks -> TPU | 8 x tpu-v4")


def test_budget_too_small_is_a_user_error():
    with pytest.raises(UserError, match="too small"):
        compare_devices("gpt3-1.3b", "100B", ["a100-80gb"], budget_usd=1.0, max_devices=64)


def test_cli_writes_png_json_csv(tmp_path):
    out = run_compare("--model", "gpt3-1.3b", "--tokens", "50B", "--hardware", "a100-80gb,h100-sxm,ascend-910b2",
                      "--max-devices", "64", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "rule of thumb from the blog post \"AI算力发展趋势：从硬件加速到算法优化的技术演进\": NLP tasks -> H100" in out.stdout and "ascend-910b2 (no price)" in out.stdout
    png = (tmp_path / "pareto.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    data = json.loads((tmp_path / "compare.json").read_text())
    assert {d["hardware"] for d in data["devices"]} == {"a100-80gb", "h100-sxm", "ascend-910b2"}
    assert data["pareto_front"]
    rows = list(csv.DictReader((tmp_path / "compare.csv").open()))
    ascend = [r for r in rows if r["hardware"] == "ascend-910b2"]
    assert ascend and all(r["on_demand_usd"] == "" and "no published price" in r["note"] for r in ascend)
    assert sum(r["chosen"] == "True" for r in rows) == 3


@pytest.mark.parametrize("args, message", [
    (("--hardware", "nosuchchip"), "error: unknown hardware 'nosuchchip'"),
    (("--model", "gpt3-1.3b", "--hardware", "a100-80gb", "--budget-usd", "5"), "error: --budget-usd 5 is too small"),
    (("--gpus", "8", "--deadline-days", "3"), "error: give at most one of --gpus, --budget-usd, --deadline-days"),
    (("--model", "mixtral-8x7b", "--hardware", "h100-sxm", "--ep", "3"), "error: --ep 3 does not divide"),
    (("--model", "llama2-7b", "--hardware", "h100-sxm", "--ep", "8"), "error: --ep 8: llama2-7b has no experts"),
    (("--model", "mixtral-8x7b", "--hardware", "rtx4090", "--gpus", "4", "--local", "--ep", "2"),
     "error: --ep is not taken with --local"),
    (("--model", "gpt3-125m", "--hardware", "h100-sxm", "--precision", "fp9"),
     "error: --precision 'fp9' is not one of fp32, tf32, bf16, fp16, fp8, bf16-true"),
])
def test_cli_bad_input_is_one_line_exit_2(tmp_path, args, message):
    out = run_compare(*args, "--max-devices", "64", "--out", str(tmp_path))
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), out.stderr


@pytest.mark.parametrize("extra", [(), ("--local", "--gpus", "4", "--hardware", "rtx4090")])
def test_cli_without_out_writes_no_files_and_says_how_to_get_them(tmp_path, extra):
    args = ("--model", "gpt3-125m", "--tokens", "1B", "--max-devices", "8")
    if not extra:
        args += ("--hardware", "a100-80gb,h100-sxm")
    done = subprocess.run([sys.executable, "-m", "flopwise", "compare", *args, *extra], capture_output=True,
                          text=True, env=ENV, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert list(tmp_path.iterdir()) == []
    assert "no files written; add --out DIR" in done.stdout


def test_cli_compare_holds_the_expert_parallelism_asked():
    """`--ep 8` on an MoE model: every device's chosen layout keeps it (so its expert states are an
    eighth), and the same job without it needs more memory per device."""
    args = ("--model", "mixtral-8x7b", "--hardware", "h100-sxm,a100-80gb", "--gpus", "64", "--tokens", "100B", "--json")
    with_ep = run_compare(*args, "--ep", "8")
    assert with_ep.returncode == 0, with_ep.stderr
    chosen = [d["chosen"] for d in json.loads(with_ep.stdout)["devices"]]
    assert len(chosen) == 2 and all(" ep 8," in c["layout"] for c in chosen)
    assert all(c["plan"]["layout"]["ep"] == 8 for c in chosen)
    without = json.loads(run_compare(*args).stdout)["devices"]
    assert all(" ep " not in d["chosen"]["layout"] for d in without)


def test_compare_without_sequence_parallelism_plans_every_tp_layout_without_it():
    """A 70B job on 64 H100 needs tensor parallelism: by default its layouts run with sequence
    parallelism (the layout says "+SP"); `--no-sequence-parallel` plans them without it: the
    activations it no longer splits need more memory, so the search settles on a slower layout."""
    from flopwise.plan.compare import compare_devices

    on = compare_devices("llama3-70b", "100B", ["h100-sxm"], gpus=64, seq_len=4096).verdicts[0].chosen
    off = compare_devices("llama3-70b", "100B", ["h100-sxm"], gpus=64, seq_len=4096,
                          sequence_parallel=False).verdicts[0].chosen
    assert on.plan.spec.layout.tp > 1 and on.plan.spec.layout.sequence_parallel and "+SP" in on.layout
    assert off.plan.spec.layout.tp > 1 and not off.plan.spec.layout.sequence_parallel and "+SP" not in off.layout
    from flopwise.plan.planner import plan

    same = on.plan.spec
    unsplit = plan(dataclasses.replace(same, layout=dataclasses.replace(same.layout, sequence_parallel=False)))
    assert unsplit.memory.total_bytes > on.plan.memory.total_bytes  # why the search moved to another layout
    assert off.days >= on.days
    done = run_compare("--model", "llama3-70b", "--hardware", "h100-sxm", "--gpus", "64", "--seq-len", "4096",
                       "--tokens", "100B", "--no-sequence-parallel", "--json")
    assert done.returncode == 0, done.stderr
    chosen = json.loads(done.stdout)["devices"][0]["chosen"]
    assert chosen["plan"]["layout"]["sequence_parallel"] is False and "+SP" not in chosen["layout"]


def test_pure_bf16_and_a_precision_as_sources_spell_it_are_compared_at_the_bf16_peak():
    """bf16-true (no fp32 master) computes in bf16, so every device with a bf16 peak is compared;
    "BF16" is bf16. Before, both read as "no published peak" on every device."""
    pure = compare_devices("gpt3-1.3b", "10B", ["a100-80gb", "h100-sxm"], gpus=8, precision="bf16-true")
    assert [v.chosen.plan.spec.workload.precision for v in pure.verdicts] == ["bf16-true", "bf16-true"]
    mixed = compare_devices("gpt3-1.3b", "10B", ["a100-80gb", "h100-sxm"], gpus=8, precision="BF16")
    assert [v.chosen.plan.spec.workload.precision for v in mixed.verdicts] == ["bf16", "bf16"]
    # no fp32 master copy and bf16 Adam states: less memory per device than mixed precision
    assert all(p.chosen.plan.memory.total_bytes < m.chosen.plan.memory.total_bytes
               for p, m in zip(pure.verdicts, mixed.verdicts))
