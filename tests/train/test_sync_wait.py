"""`sync_wait_seconds`: the time a rank waits for the others before the gradient sync.

A real 2-process DDP run (gloo, under torchrun) where rank 1 sleeps 0.3 s before its last forward
of every step (a `before_final_forward` hook the test passes to `run_training`, so production
code holds no test-only delay): rank 0 records the wait, rank 1 (arriving last) barely
waits, the sleep stays out of rank 0's compute time, and `flopwise diagnose` names rank 1.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest
import yaml

from flopwise.config.loading import load_config
from flopwise.train.loop import measure_sync_wait
from flopwise.train.parallel.distributed import DistEnv
from tests.train.parallel.test_distributed import base_config, corpus, metrics  # noqa: F401  (fixtures)

SLEEP = 0.3
DRIVER = """
import sys, time
from flopwise.config.loading import load_config
from flopwise.train.parallel.distributed import init_distributed, shutdown
from flopwise.train.loop import run_training

cfg = load_config(sys.argv[1], [])
env = init_distributed(cfg.parallel)
slow_down = [lambda: time.sleep(float(sys.argv[2]))] if env.rank == 1 else []
try:
    run_training(cfg, env, before_final_forward=slow_down)
finally:
    shutdown(env)
"""


def test_measured_by_default_only_with_several_ranks():
    import torch

    cpu = torch.device("cpu")
    one, two = DistEnv(0, 1, 0, None, cpu, False), DistEnv(0, 2, 0, "gloo", cpu, True)
    assert not measure_sync_wait(load_config(None, []).training, one)
    assert measure_sync_wait(load_config(None, []).training, two)
    assert not measure_sync_wait(load_config(None, ["training.measure_sync_wait=false"]).training, two)


def run_with_rank_1_slowed(config: dict, tmp_path) -> None:
    """Train `config` on 2 torchrun processes whose rank 1 sleeps SLEEP s before each step's last forward."""
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID")}
    env.update(OMP_NUM_THREADS="1")
    driver = tmp_path / "slowed_rank.py"
    driver.write_text(DRIVER)
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             str(driver), str(path), str(SLEEP)], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.distributed
def test_a_slowed_rank_is_named_by_diagnose(corpus, tmp_path):
    run_dir = tmp_path / "straggler"
    run_with_rank_1_slowed(base_config(corpus, run_dir, 4, strategy="ddp", nproc_per_node=2), tmp_path)

    # Steps 1-2 are warm-up: DDP rebuilds its buckets in the second forward, a collective of its own.
    fast, slow = metrics(run_dir, 0)[2:], metrics(run_dir, 1)[2:]
    median = lambda rows, key: statistics.median(r[key] for r in rows)  # noqa: E731
    assert median(fast, "sync_wait_seconds") > 0.8 * SLEEP > median(slow, "sync_wait_seconds")
    # the wait is not counted as rank 0's compute
    assert median(fast, "compute_seconds") + 0.5 * SLEEP < median(slow, "compute_seconds")

    diagnosis = subprocess.run([sys.executable, "-m", "flopwise", "diagnose", str(run_dir), "--json"],
                               capture_output=True, text=True, timeout=120)
    assert diagnosis.returncode == 0, diagnosis.stderr
    stragglers = [f for f in json.loads(diagnosis.stdout)["findings"] if f["kind"] == "straggler"]
    assert stragglers and {f["rank"] for f in stragglers} == {1}


@pytest.mark.slow
@pytest.mark.distributed
def test_a_slowed_rank_is_named_from_sampled_probes(corpus, tmp_path):
    """measure_every=4 over 10 steps: the probe runs on steps 1-5, 8 and 10 of both ranks; on the
    others rank 0's wait is inside its compute, and diagnose still names rank 1 (the synthetic
    run of tests/diagnose/test_analyze.py is the one where the unprobed steps would hide it)."""
    run_dir = tmp_path / "sampled"
    config = base_config(corpus, run_dir, 4, strategy="ddp", nproc_per_node=2)
    config["training"].update(max_steps=10, eval_every=10, measure_every=4)
    run_with_rank_1_slowed(config, tmp_path)
    for rank in (0, 1):
        rows = metrics(run_dir, rank)
        assert [r["step"] for r in rows if "sync_wait_seconds" in r] == [1, 2, 3, 4, 5, 8, 10]
        assert [r["step"] for r in rows if "memory_saved_activations_bytes" in r] == [1, 2, 3, 4, 5, 8, 10]
    unprobed = [r for r in metrics(run_dir, 0) if r["step"] in (6, 7, 9)]
    assert statistics.median(r["compute_seconds"] for r in unprobed) > 0.8 * SLEEP  # the wait, inside compute

    diagnosis = subprocess.run([sys.executable, "-m", "flopwise", "diagnose", str(run_dir), "--json"],
                               capture_output=True, text=True, timeout=120)
    assert diagnosis.returncode == 0, diagnosis.stderr
    stragglers = [f for f in json.loads(diagnosis.stdout)["findings"] if f["kind"] == "straggler"]
    assert stragglers and {f["rank"] for f in stragglers} == {1}
