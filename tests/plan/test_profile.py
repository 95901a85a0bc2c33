"""Device profiles: JSON round trip, interpolation over the measured grid, one-line errors,
and `plan --profile` as a real process."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flopwise.errors import UserError
from flopwise.plan import comm, step_comm
from flopwise.plan.planner import build_runspec, plan
from flopwise.plan.profile import (
    AttentionPoint,
    CollectivePoint,
    DeviceProfile,
    GemmPoint,
    default_profile_path,
    device_slug,
    load_profile,
    profile_from_dict,
)

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "120"}


def make_profile(kind: str = "cpu", device: str = "cpu (Test CPU)") -> DeviceProfile:
    grid = [("fp32", 128, 128, 128, 50e9), ("fp32", 1024, 1024, 1024, 100e9), ("fp32", 1024, 4096, 1024, 90e9),
            ("bf16", 128, 128, 128, 100e9), ("bf16", 1024, 1024, 1024, 400e9)]
    return DeviceProfile(
        device=device, device_kind=kind, gemm=tuple(GemmPoint(*row) for row in grid),
        memory_bandwidth_bytes_per_s=20e9, kernel_overhead_seconds=8e-6,
        collectives=(CollectivePoint("all_reduce", 2, 2**20, 1e9), CollectivePoint("all_reduce", 2, 2**24, 3e9)),
        op_seconds_per_element={"norm": 3e-9, "swiglu": 2e-9, "gelu": 3e-9, "add": 1e-9, "rope": 5e-9,
                                "cross_entropy": 1.5e-9},
        attention=(AttentionPoint("fp32", 128, 32, 30e9), AttentionPoint("fp32", 512, 64, 40e9),
                   AttentionPoint("bf16", 128, 32, 15e9)),
        optimizer_seconds_per_param={"adamw": 2e-9}, fsdp_unit_seconds=((2**16, 4e-3), (2**21, 12e-3)),
        threads=1, processes=2, torch_version="2.x", host="test", created="2026-12-03T09:00:00+00:00",
    )


def test_round_trip_keeps_every_field(tmp_path):
    profile = make_profile()
    path = profile.save(tmp_path / "deep" / "p.json")
    assert load_profile(path) == profile
    data = json.loads(path.read_text())
    assert data["schema_version"] == 3 and data["gemm_flops_per_s"]["bf16"][1] == [1024, 1024, 1024, 400e9]
    assert data["fsdp_unit_seconds"] == [[2**16, 4e-3], [2**21, 12e-3]]
    assert data["attention_flops_per_s"]["fp32"][1] == [512, 64, 40e9]
    assert data["op_seconds_per_element"]["rope"] == 5e-9 and data["optimizer_seconds_per_param"] == {"adamw": 2e-9}


def test_a_version_1_file_still_loads_without_operator_timings(tmp_path):
    data = make_profile().to_dict()
    for key in ("op_seconds_per_element", "attention_flops_per_s", "optimizer_seconds_per_param"):
        del data[key]
    data["schema_version"] = 1
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    old = load_profile(path)
    assert old.schema_version == 1 and old.gemm == make_profile().gemm
    assert old.op_seconds_per_element == {} and old.attention == () and old.optimizer_seconds_per_param == {}
    assert old.attention_flops_per_s(128, 32, "fp32") is None


def test_collective_times_interpolate_in_size_with_a_latency_floor():
    profile = make_profile()
    small = 2**20 * 1.0 / 1e9  # all-reduce of 1 MiB over 2 ranks: size x 2(n-1)/n / busbw
    large = 2**24 * 1.0 / 3e9
    assert profile.collective_seconds("all_reduce", 2**20, 2) == pytest.approx(small)
    assert profile.collective_seconds("all_reduce", 2**24) == pytest.approx(large)
    assert profile.collective_seconds("all_reduce", 1024, 2) == pytest.approx(small)  # latency floor
    middle = profile.collective_seconds("all_reduce", (2**20 + 2**24) / 2, 2)
    assert middle == pytest.approx((small + large) / 2)
    assert profile.collective_seconds("all_reduce", 2**25, 2) == pytest.approx(2 * large)  # at the best bandwidth
    assert profile.collective_seconds("all_gather", 2**20, 2) is None
    assert profile.collective_seconds("all_reduce", 2**20, 4) is None  # another world size


def test_attention_rates_interpolate_and_hold_beyond_the_longest_sequence():
    profile = make_profile()
    assert profile.attention_flops_per_s(128, 32, "fp32") == 30e9
    assert 30e9 < profile.attention_flops_per_s(256, 45, "fp32") < 40e9
    assert profile.attention_flops_per_s(8192, 64, "fp32") == 40e9
    assert profile.attention_flops_per_s(128, 32, "fp16") is None


def test_fsdp_charges_each_unit_as_often_as_the_step_gathers_and_reduces_it():
    def seconds(op, nbytes, world):
        return {"all_gather": 1e-3, "reduce_scatter": 2e-3, "all_reduce": 3e-3}[op] + nbytes / 1e9

    units = (0.5, 0.25, 0.25)
    twice = step_comm.zero3_collectives("fsdp", 1, 2, 0.0)  # 2 micro-batches, no root unit
    fsdp = comm.measured_dp_seconds(seconds, 2, 3, 8e6, 4e6, units, twice, 25 * 2**20)
    assert fsdp == pytest.approx(2 * 2 * (3 * 1e-3 + 4e6 / 1e9) + (3 * 2e-3 + 8e6 / 1e9))
    # a pipeline stage stays gathered across its micro-batches: one gather and one reduce per step
    once = step_comm.zero3_collectives("fsdp", 2, 2, 0.0)
    staged = comm.measured_dp_seconds(seconds, 2, 3, 8e6, 4e6, units, once, 25 * 2**20)
    assert staged == pytest.approx((3 * 1e-3 + 4e6 / 1e9) + (3 * 2e-3 + 8e6 / 1e9))
    ddp = comm.measured_dp_seconds(seconds, 2, 0, 60 * 2**20, 0, units, None, 25 * 2**20)
    assert ddp == pytest.approx(3 * (3e-3 + 20 * 2**20 / 1e9))  # three 20 MiB buckets
    assert comm.measured_dp_seconds(lambda *a: None, 2, 3, 8e6, 4e6, units, twice, 1) is None
    # measured FSDP unit costs replace the collectives: each unit pays its size's cost per
    # three of its collectives (the two gathers and one reduce-scatter the cost was measured on)
    def cost(nbytes):
        return 1e-3 + nbytes / 1e9

    with_units = comm.measured_dp_seconds(seconds, 2, 3, 8e6, 4e6, units, twice, 25 * 2**20, cost)
    assert with_units == pytest.approx((2 + 2 + 1) / 3 * sum(cost(share * 4e6) for share in units))
    assert comm.measured_dp_seconds(seconds, 2, 3, 8e6, 4e6, units, twice, 25 * 2**20, lambda b: None) == fsdp


def test_fsdp_unit_costs_interpolate_in_size_and_extend_along_the_last_slope(tmp_path):
    profile = make_profile()
    assert profile.fsdp_unit_cost(0) == 4e-3  # below the smallest unit: its cost
    assert profile.fsdp_unit_cost((2**16 + 2**21) / 2) == pytest.approx(8e-3)
    slope = 8e-3 / (2**21 - 2**16)
    assert profile.fsdp_unit_cost(2**22) == pytest.approx(12e-3 + slope * 2**21)
    assert dataclasses.replace(profile, fsdp_unit_seconds=()).fsdp_unit_cost(2**20) is None
    # a version-2 file's single tiny-unit figure is not a cost by size: it is left out
    data = profile.to_dict()
    data.update(schema_version=2, fsdp_unit_seconds=2e-3)
    (tmp_path / "v2.json").write_text(json.dumps(data))
    assert load_profile(tmp_path / "v2.json").fsdp_unit_seconds == ()


def test_measured_points_come_back_exactly_and_peak_is_the_best():
    profile = make_profile()
    assert profile.gemm_flops_per_s(1024, 1024, 1024, "fp32") == 100e9
    assert profile.gemm_flops_per_s(128, 128, 128, "bf16") == 100e9
    assert profile.peak_flops("fp32") == 100e9 and profile.peak_flops("bf16") == 400e9
    assert profile.peak_flops("fp16") is None and profile.gemm_flops_per_s(512, 512, 512, "fp16") is None
    assert profile.collective_bus_bytes_per_s == 3e9
    assert profile.dtypes() == ("fp32", "bf16")


def test_interpolation_lies_between_its_neighbours_in_log_space():
    profile = make_profile()
    middle = profile.gemm_flops_per_s(362, 362, 362, "bf16")  # the log-space midpoint of 128 and 1024
    assert 100e9 < middle < 400e9
    assert middle == pytest.approx(250e9, rel=0.01)  # equal distances, equal weights
    nearer_large = profile.gemm_flops_per_s(700, 700, 700, "bf16")
    assert middle < nearer_large < 400e9
    # beyond the grid the nearest points decide; no rate above the best measured
    assert profile.gemm_flops_per_s(8192, 8192, 8192, "fp32") <= 100e9


def test_below_the_smallest_measured_gemm_its_time_is_a_floor():
    profile = make_profile()
    tiny = profile.gemm_flops_per_s(64, 64, 64, "fp32")  # 1/8 of the smallest work
    assert tiny == pytest.approx(50e9 / 8)


@pytest.mark.parametrize(
    "content, fragment",
    [
        (None, "not found"),
        ("{not json", "not valid JSON"),
        ("[]", "not a JSON object"),
        ('{"schema_version": 99}', "schema_version 99"),
        ('{"schema_version": 1, "device": "x", "device_kind": "tpu"}', "device_kind"),
        ('{"schema_version": 1, "device": "x", "device_kind": "cpu", "gemm_flops_per_s": {"fp32": [[1, 2]]}}',
         "[m, n, k, flops_per_s]"),
        ('{"schema_version": 1, "device": "x", "device_kind": "cpu", "gemm_flops_per_s": {"int3": [[1, 1, 1, 1]]}}',
         "int3"),
        ('{"schema_version": 1, "device": "x", "device_kind": "cpu", "gemm_flops_per_s": {"fp32": [[1, 1, 1, 1]]}}',
         "memory_bandwidth_bytes_per_s"),
    ],
)
def test_bad_files_give_one_line_naming_the_file(tmp_path, content, fragment):
    path = tmp_path / "profile.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(UserError) as err:
        load_profile(path)
    message = str(err.value)
    assert fragment in message and str(path) in message and "\n" not in message


def test_cache_path_follows_xdg_and_names_device_threads_and_processes(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = default_profile_path("cpu (AMD EPYC 9654)", threads=1, processes=2)
    assert path == tmp_path / "flopwise" / "profiles" / "cpu-amd-epyc-9654-1t-2p.json"
    keyed = default_profile_path("cpu (AMD EPYC 9654)", 1, 2, host="Node7.lab", torch_version="2.5.1+cpu")
    assert keyed.name == "cpu-amd-epyc-9654-1t-2p-node7-lab-torch2.5.1-cpu.json"
    # another machine or another torch build sharing the home directory gets its own file
    assert default_profile_path("cpu (AMD EPYC 9654)", 1, 2, host="node8", torch_version="2.5.1+cpu") != keyed
    assert default_profile_path("cpu (AMD EPYC 9654)", 1, 2, host="Node7.lab", torch_version="2.6.0") != keyed
    assert device_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"


def test_plan_takes_gemm_efficiency_from_the_profile():
    spec = build_runspec(model="gpt2-124m", hardware="h100-sxm", gpus=1, seq_len=1024, batch_tokens="8K",
                         tokens="1B", precision="bf16")
    profile = make_profile(kind="cuda", device="NVIDIA H100 80GB HBM3")
    slow = plan(spec, profile=profile)
    assert "profile" in slow.time.efficiency_source and slow.time.efficiency_confidence == "measured"
    faster = DeviceProfile(**{**profile.__dict__, "gemm": tuple(
        GemmPoint(p.dtype, p.m, p.n, p.k, p.flops_per_s * 2) for p in profile.gemm)})
    # the operator model: twice the GEMM rate speeds up the GEMMs only (attention, memory-bound
    # kernels and the optimizer keep their time), so the step gains less than 2x
    gain = plan(spec, profile=faster).time.tokens_per_second / slow.time.tokens_per_second
    assert 1.2 < gain < 2.0
    assert plan(spec).time.efficiency_source != slow.time.efficiency_source  # no profile: the table


def cpu_spec(**layout):
    profile = make_profile()
    from flopwise.plan.profile import hardware_from_profile

    spec = build_runspec(model="gpt2-124m", hardware="h100-sxm", gpus=2, seq_len=256, batch_tokens="4K",
                         tokens="1M", precision="fp32", **layout)
    cluster = dataclasses.replace(spec.cluster, hardware=hardware_from_profile(profile))
    return dataclasses.replace(spec, cluster=cluster), profile


def test_a_cpu_profile_times_the_operators_it_measured():
    spec, profile = cpu_spec()
    measured = plan(spec, profile=profile).time
    assert measured.optimizer_seconds == pytest.approx(2e-9 * spec_params(spec) / spec.layout.dp, rel=0.05)
    slower = DeviceProfile(**{**profile.__dict__, "op_seconds_per_element": {
        k: 10 * v for k, v in profile.op_seconds_per_element.items()}})
    assert plan(spec, profile=slower).time.memory_bound_seconds > 5 * measured.memory_bound_seconds
    slow_attention = DeviceProfile(**{**profile.__dict__, "attention": tuple(
        AttentionPoint(p.dtype, p.seq, p.head_dim, p.flops_per_s / 2) for p in profile.attention)})
    assert plan(spec, profile=slow_attention).time.attention_seconds == pytest.approx(2 * measured.attention_seconds)
    bare = DeviceProfile(**{**profile.__dict__, "op_seconds_per_element": {}, "attention": (),
                            "optimizer_seconds_per_param": {}})
    assert plan(spec, profile=bare).time.memory_bound_seconds != measured.memory_bound_seconds


def test_fsdp_shards_and_recomputed_forwards_are_charged_as_measured():
    spec, profile = cpu_spec(zero=3)
    sharded = DeviceProfile(**{**profile.__dict__, "optimizer_seconds_per_param": {"adamw": 2e-9, "adamw_fsdp": 6e-9}})
    params = spec_params(spec) / spec.layout.dp
    assert plan(spec, profile=sharded).time.optimizer_seconds == pytest.approx(6e-9 * params, rel=0.05)
    ddp, _ = cpu_spec(zero=0)
    assert plan(ddp, profile=sharded).time.optimizer_seconds == pytest.approx(2e-9 * spec_params(ddp), rel=0.05)

    def recompute_cost(share):
        shared = DeviceProfile(**{**profile.__dict__, "op_forward_share": dict.fromkeys(profile.op_seconds_per_element,
                                                                                        share)})
        full, _ = cpu_spec(zero=3, recompute="full")
        return (plan(full, profile=shared).time.memory_bound_seconds
                - plan(spec, profile=shared).time.memory_bound_seconds)

    # full recompute re-runs the element-wise operators' forward: their measured share of the time
    assert recompute_cost(0.6) == pytest.approx(2 * recompute_cost(0.3))
    assert recompute_cost(0.3) > 0


def test_the_measured_collectives_are_charged_on_a_cpu():
    spec, profile = cpu_spec()
    timed = DeviceProfile(**{**profile.__dict__, "collectives": tuple(
        CollectivePoint(op, 2, size, 0.25e9) for op in ("all_gather", "reduce_scatter", "all_reduce")
        for size in (2**16, 2**24))})
    fast = plan(spec, profile=profile).time
    slow = plan(spec, profile=timed).time
    assert slow.dp_exposed_seconds > 5 * fast.dp_exposed_seconds
    assert slow.step_seconds - fast.step_seconds == pytest.approx(slow.dp_exposed_seconds - fast.dp_exposed_seconds)


def test_operator_timings_leave_a_gpu_plan_alone():
    spec = build_runspec(model="gpt2-124m", hardware="h100-sxm", gpus=8, seq_len=1024, batch_tokens="64K",
                         tokens="1B", precision="bf16")
    gpu = make_profile(kind="cuda", device="NVIDIA H100 80GB HBM3")
    bare = DeviceProfile(**{**gpu.__dict__, "op_seconds_per_element": {}, "attention": (),
                            "optimizer_seconds_per_param": {}})
    assert plan(spec, profile=gpu).time.step_seconds == plan(spec, profile=bare).time.step_seconds


def spec_params(spec) -> float:
    return plan(spec).to_dict()["params"]


def run_plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flopwise", "plan", *args], capture_output=True, text=True,
                          env=ENV, timeout=60)


def test_plan_profile_cli_plans_the_profiled_cpu_and_rejects_bad_files(tmp_path):
    path = make_profile().save(tmp_path / "cpu.json")
    out = run_plan("--profile", str(path), "--model", "gpt2-124m", "--gpus", "1", "--precision", "bf16",
                   "--seq-len", "256", "--batch-tokens", "2K", "--tokens", "1M", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["inputs"]["hardware"] == "cpu-measured"
    assert result["time"]["peak_flops"] == 400e9 and "profile" in result["time"]["efficiency_source"]
    (tmp_path / "bad.json").write_text('{"schema_version": 0}')
    bad = run_plan("--profile", str(tmp_path / "bad.json"))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "schema_version" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_search_and_the_default_zero_stage_are_timed_with_the_profile(tmp_path):
    """`plan --search --profile` ranks layouts on the measured rates, and plain `plan --profile`
    chooses its default ZeRO stage on them (the reason's figures are the profiled plans')."""
    from flopwise.plan.planner import choose_zero_stage
    from flopwise.plan.search import search_layouts

    profile = make_profile(kind="cuda", device="NVIDIA H100 80GB HBM3")  # ~1000x slower GEMMs than the curve
    spec = build_runspec(model="gpt2-124m", hardware="h100-sxm", gpus=8, seq_len=1024, batch_tokens="256K",
                         tokens="1B", precision="bf16")
    measured = search_layouts(spec, 8, top=2, profile=profile).best
    curve = search_layouts(spec, 8, top=2).best
    assert measured.time.step_seconds == pytest.approx(plan(measured.spec, profile).time.step_seconds)
    assert measured.time.step_seconds > 50 * curve.time.step_seconds

    path = profile.save(tmp_path / "h100.json")
    common = ("--model", "gpt2-124m", "--hardware", "h100-sxm", "--gpus", "8", "--seq-len", "1024",
              "--batch-tokens", "256K", "--tokens", "1B", "--precision", "bf16", "--json")
    out = run_plan("--search", "--top", "2", "--profile", str(path), *common)
    assert out.returncode == 0, out.stderr
    best = json.loads(out.stdout)["ranked"][0]["plan"]
    assert best["time"]["step_seconds"] > 50 * curve.time.step_seconds
    assert "profile" in best["time"]["efficiency_source"]

    out = run_plan("--profile", str(path), *common)
    assert out.returncode == 0, out.stderr
    chosen = json.loads(out.stdout)
    stage, reason = choose_zero_stage(spec, profile)
    assert reason != choose_zero_stage(spec)[1]  # the measured rates change the trade-off
    assert chosen["layout"]["zero"] == stage
    assert chosen["defaults"][0] == reason


def test_the_default_split_is_chosen_on_the_profile():
    """With nothing fitting unsplit, the TP x PP default is the fastest split under the profile:
    no slower, on the measured rates, than the split chosen from the curve."""
    profile = make_profile(kind="cuda", device="NVIDIA H100 80GB HBM3")
    options = dict(model="llama2-70b", hardware="h100-sxm", gpus=64, tokens="1B")
    measured = build_runspec(**options, profile=profile)
    curve = build_runspec(**options)
    assert any(d.startswith(f"tp {measured.layout.tp}, pp {measured.layout.pp}: the fastest split")
               for d in measured.cluster.extra["defaults"])
    assert plan(measured, profile).fits
    assert (plan(measured, profile).time.step_seconds
            <= plan(curve, profile).time.step_seconds * 1.0101)


def test_plan_config_uses_the_profile_and_refuses_the_flags_it_would_ignore(tmp_path):
    """`plan --config` predicts what `flopwise train` on that device predicts: with the device's profile."""
    config = Path(__file__).resolve().parents[2] / "configs" / "gpu_single_node.yaml"
    path = make_profile(kind="cuda", device="NVIDIA H100 80GB HBM3").save(tmp_path / "h100.json")
    common = ("--config", str(config), "--hardware", "h100-sxm", "--json", "parallel.nproc_per_node=1")
    curve = run_plan(*common)
    profiled = run_plan(*common, "--profile", str(path))
    assert curve.returncode == 0 and profiled.returncode == 0, curve.stderr + profiled.stderr
    curve_step = json.loads(curve.stdout)["time"]["step_seconds"]
    profiled_time = json.loads(profiled.stdout)["time"]
    assert profiled_time["step_seconds"] > 50 * curve_step and "profile" in profiled_time["efficiency_source"]
    ignored = run_plan(*common, "--stack", "megatron-core", "--pue", "1.3")
    assert ignored.returncode == 2 and "drop --stack, --pue" in ignored.stderr and "Traceback" not in ignored.stderr


def test_a_profile_replaced_at_its_path_is_kept_as_prev(tmp_path):
    path = tmp_path / "cpu.json"
    first = make_profile()
    assert first.save_keeping_previous(path) is None  # nothing there before
    second = dataclasses.replace(make_profile(), created="2026-12-04T09:00:00+00:00")
    previous = second.save_keeping_previous(path)
    assert previous == tmp_path / "cpu.prev.json"
    assert load_profile(path) == second and load_profile(previous) == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cpu.json", "cpu.prev.json"]  # no temporary file left


def test_the_load_a_profile_was_measured_under_round_trips_and_warns_when_busy(tmp_path):
    from flopwise.plan.profile import busy_warning

    quiet = dataclasses.replace(make_profile(), load_before=0.3, load_after=2.4, cpu_count=4)
    path = quiet.save(tmp_path / "quiet.json")
    assert load_profile(path) == quiet
    # after: 2.4 less its own 2 processes x 1 thread = 0.4; before 0.3; per core 0.1
    assert quiet.busy_load_per_core() == pytest.approx(0.1)
    assert busy_warning(quiet) is None
    busy = dataclasses.replace(quiet, load_before=3.0)
    assert busy.busy_load_per_core() == pytest.approx(0.75)
    assert "busy" in busy_warning(busy) and "0.75" in busy_warning(busy)
    assert make_profile().busy_load_per_core() is None and busy_warning(make_profile()) is None  # not recorded
    data = quiet.to_dict() | {"load_before": -1}
    with pytest.raises(UserError, match="load_before"):
        profile_from_dict(data)
