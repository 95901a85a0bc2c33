"""`flopwise launch slurm` under a real Slurm: submit, stop it twice, requeued by Slurm, resumed bit for bit.

The cluster (tests/train/launch/slurm_cluster.py) is Debian's slurm-wlm on this machine: slurmctld and
two slurmd (nodes n1 and n2, 2 CPUs each; the Debian build runs several slurmd per host), munge
authentication, all started and stopped by this module. Skipped, with the reason, where the
programs are missing (`.ci/run` installs them) or the test does not run as root (slurmd starts
jobs as their user).

The job is the script `flopwise launch slurm` writes, submitted as is with sbatch: a tiny FSDP2
run on 2 nodes x 1 CPU process (gloo), a checkpoint every few steps. It is stopped the two ways
Slurm stops a running job early:

1. The time-limit warning. `scancel --signal=USR1` delivers SIGUSR1 to every task of the job's
   steps and not to the batch shell, as `#SBATCH --signal=USR1@120` does before the time limit:
   the ranks save a checkpoint and exit 75, and the script's `scontrol requeue` requeues the job.
2. A preemption. A job in a partition of a higher PriorityTier asks for every CPU, and with
   `PreemptMode=REQUEUE` slurmctld requeues the training job itself: SIGTERM to every process
   of the job, SIGKILL after KillWait. The ranks save a checkpoint within that time.

Each time `scontrol show job` shows the job requeued (Restarts counts up, the job waits as
PENDING); each run resumes from the latest checkpoint, and the per-rank losses of the finished
job equal those of an uninterrupted run on one node with two processes, every step once and
bit for bit (the same comparison as tests/train/launch/test_start.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flopwise.train.checkpoint import store as ckpt
from tests.train.checkpoint.test_policy import losses
from tests.train.launch.slurm_cluster import LocalSlurm, missing_programs
from tests.train.launch.test_start import clean_env, config, corpus, free_port, write  # noqa: F401

STEPS = 30
EVERY = 3  # a checkpoint every 3 steps


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A running two-node cluster for this test session; stopped at its end."""
    missing = missing_programs()
    if missing:
        pytest.skip(f"Slurm is not installed ({', '.join(missing)} missing; "
                    "Debian: apt-get install slurmctld slurmd slurm-client munge)")
    if os.geteuid() != 0:
        pytest.skip("slurmd must run as root to start jobs")
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def run_config(corpus: Path, run_dir: Path, nnodes: int, nproc: int) -> dict:  # noqa: F811
    cfg = config(corpus, run_dir, nnodes=nnodes, nproc=nproc)
    # 8 micro-batches per rank and step: steps long enough (~0.5 s here) to stop the job between checkpoints
    cfg["model"].update(hidden=64, n_heads=4)
    cfg["training"].update(max_steps=STEPS, eval_every=STEPS, global_batch_size=64)
    cfg["checkpoint"].update(every_steps=EVERY, grace_seconds=30)
    return cfg


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):  # noqa: F811
    """The uninterrupted run: one node, two processes."""
    root = tmp_path_factory.mktemp("slurm-reference")
    path = write(run_config(corpus, root / "run", nnodes=1, nproc=2), root / "config.yaml")
    done = subprocess.run([sys.executable, "-m", "flopwise", "train", str(path)], cwd=root, env=clean_env(),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return {rank: losses(root / "run", rank) for rank in (0, 1)}


def sbatch_script(tmp_path: Path, corpus: Path) -> Path:  # noqa: F811
    """`flopwise launch slurm` for 2 nodes x 1 CPU process; the rendezvous on a free port of the first node."""
    path = write(run_config(corpus, tmp_path / "run", nnodes=2, nproc=1), tmp_path / "config.yaml")
    script = tmp_path / "job.sbatch"
    done = subprocess.run([sys.executable, "-m", "flopwise", "launch", "slurm", str(path), "--time", "15:00",
                           f"parallel.rdzv_endpoint=localhost:{free_port()}", "--out", str(script)],
                          cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return script


def wait_until(condition, what: str, slurm: LocalSlurm, job_id: str, timeout: float = 300) -> None:
    """Poll `condition`; fail with the job's state and output when the job ended badly or time ran out."""
    deadline = time.monotonic() + timeout
    while not condition():
        state = slurm.job(job_id)
        failed = state["JobState"] in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
        if failed or time.monotonic() > deadline:
            output = Path(state["StdOut"])
            tail = output.read_text()[-4000:] if output.exists() else "(no output)"
            pytest.fail(f"{what}: {'job ended' if failed else f'not within {timeout} s'}; "
                        f"JobState={state['JobState']} Restarts={state['Restarts']}; output:\n{tail}")
        time.sleep(0.2)


def steps_done(run_dir: Path, rank: int = 1) -> int:
    metrics = run_dir / f"metrics.rank{rank}.jsonl"
    return len(metrics.read_text().splitlines()) if metrics.exists() else 0


def latest_checkpoint(run_dir: Path) -> int:
    saved = ckpt.published_steps(run_dir)
    return saved[-1][0] if saved else 0


def requeued(slurm: LocalSlurm, job_id: str, restarts: int) -> bool:
    """Slurm's own record: the job counts `restarts` requeues and is back in the queue or running again."""
    state = slurm.job(job_id)
    return int(state["Restarts"]) == restarts and state["JobState"] in ("PENDING", "RUNNING", "COMPLETING")


@pytest.mark.slow
@pytest.mark.distributed
def test_the_sbatch_script_is_requeued_by_slurm_and_resumes_bit_for_bit(slurm, corpus, tmp_path,  # noqa: F811
                                                                        reference):
    script = sbatch_script(tmp_path, corpus)
    run_dir = tmp_path / "run"
    job_id = slurm.run("sbatch", "--parsable", str(script), cwd=tmp_path).strip()

    # 1. the time-limit warning: SIGUSR1 to the tasks -> checkpoint, exit 75 -> the script requeues
    wait_until(lambda: latest_checkpoint(run_dir) >= EVERY and steps_done(run_dir) > EVERY, "first run", slurm, job_id)
    slurm.run("scancel", "--signal=USR1", job_id)
    wait_until(lambda: requeued(slurm, job_id, 1), "requeue by the script", slurm, job_id)
    first_stop = latest_checkpoint(run_dir)
    assert first_stop < STEPS

    # 2. a preemption: a job of a higher PriorityTier takes every CPU; slurmctld requeues this one
    wait_until(lambda: slurm.job(job_id)["JobState"] == "RUNNING" and latest_checkpoint(run_dir) > first_stop
               and steps_done(run_dir) > latest_checkpoint(run_dir), "second run", slurm, job_id)
    urgent = slurm.run("sbatch", "--parsable", "--partition=urgent", "--nodes=2", "--cpus-per-task=2",
                       "--output=/dev/null", "--wrap=sleep 1", cwd=tmp_path).strip()
    wait_until(lambda: requeued(slurm, job_id, 2), "requeue by preemption", slurm, job_id)

    wait_until(lambda: slurm.job(job_id)["JobState"] == "COMPLETED", "the requeued job's end", slurm, job_id)
    state = slurm.job(job_id)
    assert (state["Restarts"], state["ExitCode"]) == ("2", "0:0"), state
    assert slurm.job(urgent)["JobState"] == "COMPLETED"
    output = " ".join((tmp_path / f"slurm-run-{job_id}.out").read_text().split())
    assert f"flopwise: preempted (exit 75); requeueing job {job_id}" in output, output[-3000:]
    assert re.search(rf"\*\*\* JOB {job_id} ON \S+ CANCELLED AT \S+ DUE TO PREEMPTION \*\*\*", output), output[-3000:]
    resumed = [int(step) for step in re.findall(r"resumed from checkpoint step-(\d+)", output)]
    assert len(resumed) == 2 and resumed[0] == first_stop < resumed[1] < STEPS, output[-3000:]
    for signal_name, step in zip(("SIGUSR1", "SIGTERM"), resumed):  # each resume is from the signal's own checkpoint
        assert f"error: preempted by {signal_name} at step {step}: checkpoint" in output, output[-3000:]
    for rank in (0, 1):
        assert losses(run_dir, rank) == reference[rank]  # every step once, bit for bit
