"""`flopwise launch slurm`: the sbatch script parses, and run by bash it does what Slurm would see.

The script is executed for real by bash with `srun`, `scontrol` and `flopwise` replaced by
small recording scripts on PATH (there is no Slurm here): that shows the per-node command line
each node would run, the config file it would read, and the requeue on exit code 75 only.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flopwise.cli import main
from flopwise.config.loading import load_config

ROOT = Path(__file__).resolve().parents[3]
MULTI_NODE = ROOT / "configs" / "multi_node.yaml"


def write_script(tmp_path: Path, monkeypatch, *flags: str) -> Path:
    out = tmp_path / "job.sbatch"
    run_dir = tmp_path / "run"
    monkeypatch.setattr(sys, "argv", ["flopwise", "launch", "slurm", str(MULTI_NODE), *flags])
    with pytest.raises(SystemExit) as done:
        main(["launch", "slurm", str(MULTI_NODE), f"logging.run_dir={run_dir}", "--out", str(out), *flags])
    assert done.value.code in (0, None)
    return out


def fake_slurm(tmp_path: Path) -> Path:
    """`srun` runs its command once per node (task = node 0 and 1); `scontrol` and `flopwise` record their calls.

    `scontrol show node` answers as Slurm 22.05 does, with a NodeAddr other than the node's name.
    """
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(
        '#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\n'
        'rc=0\nfor node in 0 1; do SLURM_NODEID=$node SLURM_PROCID=$node SLURM_NTASKS=2 "$@" || rc=$?; done\n'
        'exit $rc\n')
    (bin_dir / "scontrol").write_text(
        '#!/bin/bash\nif [ "$1 $2" = "show hostnames" ]; then printf "gpu-a17\\ngpu-a18\\n"; exit 0; fi\n'
        'if [ "$1 $2" = "show node" ]; then\n'
        '  printf "NodeName=$3 Arch=x86_64 CoresPerSocket=48\\n"\n'
        '  printf "   NodeAddr=10.1.0.17 NodeHostName=$3 Version=22.05.8\\n"\n'
        '  exit 0\nfi\n'
        'echo "$@" >> "$CALLS/scontrol"\n')
    (bin_dir / "flopwise").write_text(
        '#!/bin/bash\nprintf "%s\\n" "$@" > "$CALLS/flopwise.node$SLURM_NODEID"\n'
        'echo "${SLURM_PROCID-unset}" > "$CALLS/procid.node$SLURM_NODEID"\nexit "$FAKE_EXIT"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return bin_dir


def run_script(script: Path, tmp_path: Path, exit_code: int) -> subprocess.CompletedProcess:
    calls = tmp_path / f"calls-{exit_code}"
    calls.mkdir()
    bin_dir = tmp_path / "bin" if (tmp_path / "bin").exists() else fake_slurm(tmp_path)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(calls), "FAKE_EXIT": str(exit_code),
           "SLURM_JOB_ID": "4242",
           "SLURM_JOB_NODELIST": "gpu-a[17-18]", "SLURM_JOB_NUM_NODES": "2"}
    return subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)


def test_the_script_parses_and_asks_slurm_for_requeue_and_a_warning_signal(tmp_path, monkeypatch):
    script = write_script(tmp_path, monkeypatch, "--partition", "gpu", "--time", "1-12:00:00")
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --partition=gpu", "#SBATCH --time=1-12:00:00", "#SBATCH --requeue",
                 "#SBATCH --signal=USR1@120"):
        assert line in text.splitlines(), line
    assert 'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)' in text
    assert "# Planner forecast (`flopwise plan`, docs/planner.md) for 2 node(s) x 8 NVIDIA H100" in text
    assert "#   power per node: 8 x 700 W = 5.6 kW at TDP" in text


def test_each_node_runs_flopwise_train_with_its_rank_and_exit_75_requeues(tmp_path, monkeypatch):
    script = write_script(tmp_path, monkeypatch)
    preempted = run_script(script, tmp_path, 75)
    assert preempted.returncode == 75, preempted.stderr
    calls = tmp_path / "calls-75"
    assert (calls / "scontrol").read_text().split() == ["requeue", "4242"]
    for node in (0, 1):
        args = (calls / f"flopwise.node{node}").read_text().splitlines()
        assert args[0] == "train"
        assert args[2:] == [f"parallel.node_rank={node}", "parallel.rdzv_endpoint=10.1.0.17:29500",
                            "parallel.rdzv_id=slurm-4242"]
        cfg = load_config(args[1], args[2:])  # the config the script wrote, with this node's overrides
        assert cfg.parallel.nnodes == 2 and cfg.parallel.nproc_per_node == 8 and cfg.parallel.node_rank == node
        assert cfg.logging.run_dir == tmp_path / "run"
        # the task is the node's launcher, never one rank (as 1 process per node would make it)
        assert (calls / f"procid.node{node}").read_text().strip() == "unset"
        assert cfg.model == load_config(MULTI_NODE).model
    crashed = run_script(script, tmp_path, 1)
    assert crashed.returncode == 1
    assert not (tmp_path / "calls-1" / "scontrol").exists()  # a crash is not requeued


def test_a_gloo_config_is_a_cpu_job_and_the_rendezvous_port_is_the_configs(tmp_path, monkeypatch):
    script = write_script(tmp_path, monkeypatch, "parallel.backend=gloo", "--gpus-per-node", "2",
                          "parallel.rdzv_endpoint=node0:31000")
    lines = script.read_text().splitlines()
    assert "#SBATCH --cpus-per-task=2" in lines and not [line for line in lines if line.startswith("#SBATCH --gpus")]
    assert any(line.startswith("srun --kill-on-bad-exit=0 --cpus-per-task=2 ") for line in lines)
    run_script(script, tmp_path, 0)
    args = (tmp_path / "calls-0" / "flopwise.node1").read_text().splitlines()
    assert "parallel.rdzv_endpoint=10.1.0.17:31000" in args


@pytest.mark.parametrize("flags, message", [
    (["--time", "3h"], "error: --time: '3h' is not a Slurm time"),
    (["--nodes", "0"], "error: override 'parallel.nnodes=0': parallel.nnodes"),
    (["--hardware", "h900"], "error: unknown hardware 'h900'"),
])
def test_a_bad_flag_is_one_line_and_exit_2(flags, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        main(["launch", "slurm", str(MULTI_NODE), "--out", str(tmp_path / "x.sbatch"), *flags])
    assert done.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(message), err
    assert not (tmp_path / "x.sbatch").exists()


def test_a_missing_config_is_one_line_and_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        main(["launch", "slurm", str(tmp_path / "missing.yaml")])
    assert done.value.code == 2
    assert capsys.readouterr().err.strip() == f"error: {tmp_path / 'missing.yaml'}: config file not found"
