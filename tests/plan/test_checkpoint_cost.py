"""The planner plans checkpoints: bytes per save from the memory plan, blocking and total time,
the Daly interval (the `--spot` code), and `flopwise plan --storage-gbps` as a real process."""

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from flopwise.plan.checkpoint_cost import PCIE5_X16_GBPS, checkpoint_bytes, checkpoint_cost
from flopwise.plan.preemption import daly_interval

GB = 1e9
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}


def memory(weights, optimizer, master):
    return SimpleNamespace(weights=weights, optimizer_states=optimizer, master_weights=master)


def layout(dp, zero, tp=1, pp=1):
    return SimpleNamespace(dp=dp, tp=tp, pp=pp, zero_stage=zero)


@pytest.mark.parametrize("zero, job", [
    (0, 2 + 8 + 4),            # everything replicated over dp: the job writes one copy
    (1, 2 + 8 * (8 + 4)),      # optimizer sharded: each of 8 ranks writes its own part
    (3, 8 * (2 + 8 + 4)),      # everything sharded
])
def test_a_replicated_tensor_is_written_once_a_sharded_one_by_every_rank(zero, job):
    device, total = checkpoint_bytes(memory(2 * GB, 8 * GB, 4 * GB), layout(dp=8, zero=zero))
    assert device == 14 * GB
    assert total == job * GB


def test_tensor_and_pipeline_parallel_ranks_each_hold_a_distinct_part():
    _, total = checkpoint_bytes(memory(1 * GB, 2 * GB, 0), layout(dp=4, zero=0, tp=2, pp=3))
    assert total == 6 * 3 * GB


def test_blocking_is_the_host_copy_and_total_adds_the_storage_write():
    cost = checkpoint_cost(device_bytes=63 * GB, job_bytes=100 * GB, storage_gbps=10, step_seconds=2.0)
    assert cost.blocking_seconds == pytest.approx(63 / PCIE5_X16_GBPS)
    assert cost.total_seconds == pytest.approx(1.0 + 10.0)
    assert cost.daly_interval_seconds is None  # no preemption rate, no interval


def test_the_interval_is_dalys_with_the_blocking_time_and_never_shorter_than_a_save():
    cost = checkpoint_cost(device_bytes=63 * GB, job_bytes=10 * GB, storage_gbps=10, step_seconds=2.0,
                           preemptions_per_day=4)
    assert cost.daly_interval_seconds == pytest.approx(daly_interval(1.0, 86_400 / 4))
    assert cost.interval_steps == round(cost.daly_interval_seconds / 2.0)
    slow = checkpoint_cost(device_bytes=63 * GB, job_bytes=10_000 * GB, storage_gbps=1, step_seconds=2.0,
                           preemptions_per_day=4)
    assert slow.daly_interval_seconds == pytest.approx(slow.total_seconds)  # one save in flight at a time


def test_plan_prints_the_checkpoint_cost_and_its_json_carries_it():
    args = [sys.executable, "-m", "flopwise", "plan", "--storage-gbps", "10", "--preemptions-per-day", "2"]
    out = subprocess.run(args, capture_output=True, text=True, env=ENV, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "the run waits" in out.stdout and "checkpoint interval (Daly 2006)" in out.stdout
    data = json.loads(subprocess.run(args + ["--json"], capture_output=True, text=True, env=ENV, timeout=60).stdout)
    saving = data["checkpoint"]
    assert saving["storage_gbps"] == 10 and saving["total_seconds"] > saving["blocking_seconds"] > 0
    assert saving["daly_interval_seconds"] >= saving["total_seconds"]


def test_a_storage_bandwidth_of_zero_is_one_line():
    out = subprocess.run([sys.executable, "-m", "flopwise", "plan", "--storage-gbps", "0"], capture_output=True,
                         text=True, env=ENV, timeout=60)
    assert out.returncode == 2 and out.stderr.strip().startswith("error: --storage-gbps")
    assert "Traceback" not in out.stderr
