"""Layout search: every layout it returns is one plan() says fits, and a brute-force
enumeration written independently here finds nothing better under the planner's model."""

import itertools
import json
import os
import subprocess
import sys

import pytest

from flopwise.plan.planner import build_runspec, plan
from flopwise.plan.search import objective_value, search_layouts
from flopwise.plan.spec import Layout, RunSpec

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flopwise", *args], capture_output=True, text=True, env=ENV,
                          timeout=120)


def one_device_spec(**kw) -> RunSpec:
    """A RunSpec on one device: its global batch is exactly the one asked for."""
    return build_runspec(gpus=1, **kw)


def brute_force(spec: RunSpec, devices: int, max_mbs: int = 64, max_v: int = 8) -> list:
    """Every layout, planned one by one with plan() (no pruning, no shared code with search.py)."""
    model, g = spec.model, spec.layout.global_batch_size
    per_node = spec.cluster.hardware.devices_per_node
    kv = model.n_kv_heads or model.n_heads
    plans = []
    for tp in range(1, devices + 1):
        if devices % tp or model.n_heads % tp or kv % tp or tp > per_node:
            continue
        for pp in range(1, devices // tp + 1):
            if (devices // tp) % pp or pp > model.n_layers:
                continue
            dp = devices // (tp * pp)
            if g % dp:
                continue
            per_rank = g // dp
            scheds = [("1f1b", 1)] if pp == 1 else [("1f1b", 1), ("gpipe", 1)] + [
                ("interleaved", v) for v in range(2, max_v + 1) if pp * v <= model.n_layers]
            mems = [(z, o) for z in range(4) for o in ("none", "optimizer", "params") if o != "params" or z == 3]
            if dp == 1:  # ZeRO shards nothing over one rank: only these differ
                mems = [(0, "none"), (0, "optimizer"), (3, "params")]
            for mbs, (sched, v), (zero, off), rc in itertools.product(
                    [m for m in range(1, max_mbs + 1) if per_rank % m == 0], scheds, mems,
                    ("none", "selective", "full")):
                lay = Layout(dp=dp, tp=tp, pp=pp, micro_batch_size=mbs, grad_accum=per_rank // mbs, zero_stage=zero,
                             sequence_parallel=tp > 1, recompute=rc, offload=off, pipeline_schedule=sched,
                             virtual_stages=v, flash_attention=spec.layout.flash_attention)
                result = plan(RunSpec(spec.model, lay, spec.workload, spec.cluster))
                if result.memory.may_fit:  # fits, or tight (within the memory band): the search keeps both
                    plans.append(result)
    return plans


CASES = [
    dict(model="gpt3-125m", hardware="a100-40gb", tokens="10B", global_batch=64, seq_len=1024, devices=8),
    dict(model="llama2-7b", hardware="rtx4090", tokens="1B", global_batch=32, devices=4),
    dict(model="gpt3-1.3b", hardware="v100-32gb", tokens="20B", global_batch=32, seq_len=2048, precision="fp16",
         devices=16),
]


@pytest.mark.parametrize("case", CASES, ids=[c["model"] + "-" + c["hardware"] for c in CASES])
def test_nothing_beats_the_top_ranked_layout(case):
    case = dict(case)
    devices = case.pop("devices")
    spec = one_device_spec(**case)
    result = search_layouts(spec, devices, top=3)
    every = brute_force(spec, devices)
    assert every, "the case should have layouts that fit"
    assert result.best is not None and result.best.fits  # one that fits ranks before any tight one
    best_value = min(objective_value(p, "time") for p in every if p.fits)
    assert objective_value(result.best, "time") == pytest.approx(best_value, rel=1e-12)
    assert result.fitting == len(every)
    # the search's exhaustive mode agrees too
    exhaustive = search_layouts(spec, devices, top=3, exhaustive=True)
    assert [p.spec.layout for p in exhaustive.ranked] == [p.spec.layout for p in result.ranked]


def test_every_returned_layout_is_one_plan_says_fits():
    spec = one_device_spec(model="gpt3-2.7b", hardware="a100-80gb", tokens="50B", global_batch=256)
    result = search_layouts(spec, 32, top=8)
    assert len(result.ranked) == 8
    values = [objective_value(p, "time") for p in result.ranked]
    assert values == sorted(values)
    for found in result.ranked:
        again = plan(found.spec)
        assert again.fits
        assert again.to_dict() == found.to_dict()
        lay = found.spec.layout
        assert lay.devices == 32 and lay.global_batch_size == 256


def test_objectives_and_counts_are_reported():
    spec = one_device_spec(model="gpt3-1.3b", hardware="h100-sxm", tokens="20B", global_batch=64)
    for objective in ("time", "cost", "energy"):
        result = search_layouts(spec, 16, objective=objective, top=2)
        assert result.best is not None and result.evaluated > 0
        data = result.to_dict()
        assert data["objective"] == objective and data["ranked"][0]["plan"]["fits"]
    # GPT-3 1.3B: 24 heads, 24 layers on 16 devices: tp 16 does not divide the heads; pp 16 (uneven) is kept
    # (with the allocator reserve and fp32 logits counted, the largest micro-batches no longer fit)
    assert data["rejected"]["tp does not divide the attention/KV heads"] == 1
    assert set(data["rejected"]) <= {"tp does not divide the attention/KV heads", "does not fit in device memory"}
    assert data["fitting"] > 0


def test_host_memory_limit_excludes_large_offloads():
    spec = one_device_spec(model="llama2-13b", hardware="rtx4090", tokens="1B", global_batch=16)
    unchecked = search_layouts(spec, 4, top=1)
    assert unchecked.best is not None and unchecked.best.spec.layout.offload != "none"
    limited = search_layouts(spec, 4, top=1, host_memory_per_device_gib=8)
    assert limited.best is None and limited.rejected["host_memory"] > 0


def test_cli_search_json_ranks_full_plans():
    out = run_cli("plan", "--model", "gpt3-350m", "--hardware", "a100-80gb", "--gpus", "8", "--global-batch", "64",
                  "--tokens", "10B", "--search", "--top", "3", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["devices"] == 8 and len(data["ranked"]) == 3
    assert all(r["plan"]["fits"] for r in data["ranked"])
    assert data["ranked"][0]["plan"]["inputs"]["layout"]["global_batch_size"] == 64


def test_cli_search_table_says_what_was_rejected():
    out = run_cli("plan", "--model", "gpt3-1.3b", "--hardware", "v100-32gb", "--gpus", "16", "--global-batch", "32",
                  "--tokens", "20B", "--precision", "fp16", "--search", "--top", "2")
    assert out.returncode == 0, out.stderr
    assert "layouts evaluated" in out.stdout and "rejected:" in out.stdout and "fp16" in out.stdout


def test_cli_nothing_fits_is_one_line_with_nearest_option():
    out = run_cli("plan", "--model", "llama3.1-405b", "--hardware", "rtx4090", "--gpus", "4", "--search",
                  "--host-memory-gib", "256")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no layout of llama3.1-405b fits on 4 x rtx4090")
    assert "nearest that fits: --gpus" in lines[0]
    assert "Traceback" not in out.stderr


def test_cli_bad_objective_is_exit_2():
    out = run_cli("plan", "--model", "gpt3-125m", "--gpus", "8", "--search", "--objective", "speed")
    assert out.returncode == 2 and "--objective 'speed' is not one of time, cost, energy" in out.stderr


@pytest.mark.parametrize("as_json", [True, False], ids=["json", "table"])
def test_cli_search_honours_no_sequence_parallel(as_json):
    """`--no-sequence-parallel` (a trainer without it) is planned on every layout the search ranks;
    without the flag the same search plans it with every tp > 1."""
    args = ("plan", "--model", "gpt3-1.3b", "--hardware", "v100-32gb", "--gpus", "16", "--global-batch", "32",
            "--seq-len", "2048", "--precision", "fp16", "--tokens", "20B", "--search", "--top", "8")
    if as_json:
        def layouts(*extra):
            out = run_cli(*args, "--json", *extra)
            assert out.returncode == 0, out.stderr
            return [(r["plan"]["layout"]["tp"], r["plan"]["layout"]["sequence_parallel"])
                    for r in json.loads(out.stdout)["ranked"]]

        default, without = layouts(), layouts("--no-sequence-parallel")
        assert any(tp > 1 for tp, _ in default) and all(sp == (tp > 1) for tp, sp in default)
        assert any(tp > 1 for tp, _ in without) and not any(sp for _, sp in without)
    else:
        out = run_cli(*args, "--no-sequence-parallel")
        assert out.returncode == 0, out.stderr
        assert "+SP" not in out.stdout and "sequence parallelism off" in out.stdout
        assert "+SP" in run_cli(*args).stdout
