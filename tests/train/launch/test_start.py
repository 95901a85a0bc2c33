"""Multi-node on the real engine: two torchrun "nodes" on this machine, and torchrun's elastic restart.

Each "node" is its own `flopwise train` process with `parallel.nnodes=2` and its own
`parallel.node_rank`; both meet through torchrun's c10d rendezvous on a localhost port, one
process per node, FSDP2 on gloo. The reference is the same config on one node with two
processes: the per-rank losses must be the same numbers (same ranks, same data, same
collectives). The restart test kills one rank with SIGKILL after a checkpoint was written;
torchrun's `--max-restarts` restarts the group on both nodes, the new ranks resume from the
latest checkpoint by themselves and finish with every step once, bit for bit.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from flopwise.config.loading import dump_config, load_config
from flopwise.train.launch.start import FORWARDED_SIGNALS, started_as_one_rank, torchrun_args

STEPS = 8


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("nodes")
    (root / "text").mkdir()
    text = "".join(f"class Rack{i % 23}:\n    slot = {i % 11}\n    host = 'rack {i}'\n" for i in range(3000))
    (root / "text" / "racks.py").write_text(text)
    return root


def config(corpus: Path, run_dir: Path, nnodes: int, nproc: int) -> dict:
    """A tiny FSDP2 run, global batch 8 over 2 ranks, a checkpoint every 2 steps."""
    return {
        "model": {"n_layers": 2, "hidden": 32, "n_heads": 2, "max_seq_len": 64},
        "data": {"paths": [str(corpus / "text")], "cache_dir": str(corpus / "cache"), "vocab_size": 320,
                 "seq_len": 32, "prefetch": 2, "tokenizer_train_bytes": 200000},
        "parallel": {"strategy": "fsdp", "nproc_per_node": nproc, "nnodes": nnodes, "backend": "gloo",
                     "timeout_minutes": 2},
        "training": {"max_steps": STEPS, "micro_batch_size": 4, "global_batch_size": 8, "warmup_steps": 2,
                     "lr": 1e-2, "eval_every": STEPS, "eval_batches": 2},
        "checkpoint": {"every_steps": 2, "keep_last": 20},
        "logging": {"run_dir": str(run_dir), "progress": False},
    }


def write(cfg: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg))
    return path


def clean_env() -> dict:
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["OMP_NUM_THREADS"] = "1"
    return env


def train_cli(config_path: Path, *overrides: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "flopwise", "train", str(config_path), *overrides],
                            cwd=config_path.parent, env={**clean_env(), **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_two_nodes(config_path: Path, *overrides: str, env: dict | None = None) -> list[subprocess.Popen]:
    """Node 0 and node 1: the same command, its own node rank, one rendezvous endpoint and id."""
    endpoint = f"127.0.0.1:{free_port()}"
    return [train_cli(config_path, f"parallel.node_rank={rank}", f"parallel.rdzv_endpoint={endpoint}",
                      f"parallel.rdzv_id=two-nodes-{config_path.parent.name}", *overrides, env=env)
            for rank in (0, 1)]


def finish(nodes: list[subprocess.Popen]) -> list[tuple[int, str, str]]:
    """Exit code, stdout and stderr of each node; on a timeout the nodes and their ranks are killed."""
    try:
        return [(node.wait(timeout=600), *node.communicate(timeout=60)) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                kill_tree(node.pid)


def kill_tree(pid: int) -> None:
    """A launcher and the ranks it started (ranks outlive a killed torchrun)."""
    import psutil

    try:
        launcher = psutil.Process(pid)
        processes = [*launcher.children(recursive=True), launcher]
    except psutil.NoSuchProcess:
        return
    for process in processes:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass


def losses(run_dir: Path, rank: int) -> list[float]:
    records = [json.loads(line) for line in (run_dir / f"metrics.rank{rank}.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1)), "steps repeated or missing"
    return [r["loss"] for r in records]


@pytest.fixture(scope="module")
def one_node_reference(corpus, tmp_path_factory):
    """The same run on one node: two processes under one torchrun."""
    root = tmp_path_factory.mktemp("one-node")
    path = write(config(corpus, root / "run", nnodes=1, nproc=2), root / "config.yaml")
    (code, _, err), = finish([train_cli(path)])
    assert code == 0, err[-3000:]
    return {rank: losses(root / "run", rank) for rank in (0, 1)}


def test_torchrun_forwards_slurms_warning_signal_and_restarts_in_place_only_across_nodes(tmp_path):
    two = load_config(None, ["parallel.nnodes=2", "parallel.node_rank=1", "parallel.max_restarts=3",
                             "parallel.rdzv_endpoint=10.0.0.1:29400", "parallel.rdzv_id=job-7"])
    args = torchrun_args(two, tmp_path / "c.yaml")
    assert "--max-restarts=3" in args and "--rdzv-endpoint=10.0.0.1:29400" in args and "--node-rank=1" in args
    assert f"--signals-to-handle={FORWARDED_SIGNALS}" in args and "SIGUSR1" in FORWARDED_SIGNALS
    one = load_config(None, ["parallel.max_restarts=3"])
    assert "--max-restarts=0" in torchrun_args(one, tmp_path / "c.yaml")  # one node: a fresh torchrun instead


def test_which_process_starts_torchrun(monkeypatch):
    """A rank started by torchrun or by an srun task per process runs; a node's launcher starts torchrun."""
    cfg = load_config(None, ["parallel.nproc_per_node=4", "parallel.nnodes=2"])
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    assert not started_as_one_rank(cfg)
    monkeypatch.setenv("RANK", "1")  # the Kubeflow Training Operator's per-pod (node) rank
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert not started_as_one_rank(cfg)
    monkeypatch.setenv("LOCAL_RANK", "1")  # torchrun's worker
    assert started_as_one_rank(cfg)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("SLURM_PROCID", "1")
    monkeypatch.setenv("SLURM_NTASKS", "2")  # srun, one task per node
    assert not started_as_one_rank(cfg)
    monkeypatch.setenv("SLURM_NTASKS", "8")  # srun, one task per process
    assert started_as_one_rank(cfg)


def test_single_runs_in_this_process_whatever_nproc_per_node_says(monkeypatch, tmp_path):
    """`parallel.strategy=single` is one process: the launcher trains in place, never under torchrun
    (nproc_per_node keeps its default of 2), as the planner and the trainer count it."""
    from flopwise.train.launch import start

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    started = []
    monkeypatch.setattr(start, "_run_here_with_restarts", lambda cfg: started.append("in place"))
    monkeypatch.setattr(start, "_run_torchrun_with_restarts", lambda cfg: started.append("torchrun"))
    monkeypatch.setattr(start, "_prepare_data_once", lambda cfg: None)  # no corpus to tokenize here
    cfg = load_config(None, ["parallel.strategy=single", f"logging.run_dir={tmp_path / 'run'}"])
    assert cfg.parallel.nproc_per_node == 2
    start.launch(cfg)
    two = load_config(None, ["parallel.strategy=ddp", f"logging.run_dir={tmp_path / 'two'}"])
    start.launch(two)
    assert started == ["in place", "torchrun"]
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "1")  # srun with one task: that task is the run's one rank
    assert started_as_one_rank(cfg) and not started_as_one_rank(two)


def test_a_device_precision_default_reaches_the_ranks_torchrun_starts(monkeypatch, tmp_path, capsys):
    """The ranks read the config this launcher writes, with `precision.mode` named in it (so a rank
    applies no default of its own): the launcher applies a pretrained model's device default first."""
    from flopwise.train.launch import start
    from flopwise.train.techniques import precision

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)

    def bf16_device(cfg, device):  # what a bf16 GPU answers for a pretrained model with no mode given
        cfg.precision.mode = "bf16"
        return "precision.mode=bf16: this GPU computes in bf16"

    monkeypatch.setattr(precision, "pretrained_precision_default", bf16_device)
    written = []
    monkeypatch.setattr(start, "_run_torchrun_with_restarts", lambda cfg: written.append(dump_config(cfg)))
    monkeypatch.setattr(start, "_prepare_data_once", lambda cfg: None)
    start.launch(load_config(None, ["parallel.strategy=ddp", f"logging.run_dir={tmp_path / 'run'}"]))
    assert yaml.safe_load(written[0])["precision"]["mode"] == "bf16"
    assert load_config(tmp_path / "run" / "config.yaml").precision.mode == "bf16"
    assert "precision.mode=bf16" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.distributed
def test_two_nodes_on_one_machine_train_like_one_node(corpus, tmp_path, one_node_reference):
    run_dir = tmp_path / "run"
    path = write(config(corpus, run_dir, nnodes=2, nproc=1), tmp_path / "config.yaml")
    results = finish(start_two_nodes(path))
    for node, (code, _, err) in enumerate(results):
        assert code == 0, f"node {node}: {err[-3000:]}"
    for rank in (0, 1):  # one rank per node: both nodes trained every step
        assert losses(run_dir, rank) == one_node_reference[rank]
    assert load_config(run_dir / "config.yaml").parallel.nnodes == 2


@pytest.mark.slow
@pytest.mark.distributed
def test_torchrun_restarts_both_nodes_after_a_killed_rank_and_they_resume(corpus, tmp_path, one_node_reference):
    psutil = pytest.importorskip("psutil")
    run_dir = tmp_path / "run"
    path = write(config(corpus, run_dir, nnodes=2, nproc=1), tmp_path / "config.yaml")
    # rank 0 sleeps 0.5 s per step (flopwise's straggler switch), so steps are left to run after step 4
    nodes = start_two_nodes(path, "parallel.max_restarts=1", env={"FLOPWISE_TEST_SLOW_RANK": "0:0.5"})
    try:
        deadline = time.monotonic() + 600
        while not (run_dir / "checkpoints" / "step-4").is_dir():  # two checkpoints written, steps left to run
            assert all(node.poll() is None for node in nodes), "a node ended early"
            assert time.monotonic() < deadline, "no checkpoint was written"
            time.sleep(0.05)
        workers = [p for p in psutil.Process(nodes[1].pid).children(recursive=True) if "RANK" in p.environ()]
        assert len(workers) == 1, "node 1 should run one rank"
        workers[0].send_signal(signal.SIGKILL)
    finally:
        results = finish(nodes)
    for node, (code, _, err) in enumerate(results):
        assert code == 0, f"node {node}: {err[-3000:]}"
    printed = " ".join(" ".join(out.split()) for _, out, _ in results)
    assert "resumed from checkpoint step-" in printed, printed[-3000:]
    for rank in (0, 1):
        assert losses(run_dir, rank) == one_node_reference[rank]  # each step once, bit for bit


@pytest.mark.slow
@pytest.mark.distributed
def test_slurms_warning_signal_to_a_nodes_launcher_saves_and_exits_75(corpus, tmp_path, one_node_reference):
    """SIGUSR1 to `flopwise train` itself (what `#SBATCH --signal=USR1@...` delivers): torchrun passes it
    to the ranks, they save, the command exits 75 (the sbatch script requeues), and the rerun continues."""
    run_dir = tmp_path / "run"
    path = write(config(corpus, run_dir, nnodes=1, nproc=2), tmp_path / "config.yaml")
    launcher = train_cli(path, env={"FLOPWISE_TEST_SLOW_RANK": "0:0.5"})
    try:
        deadline = time.monotonic() + 600
        while not (run_dir / "checkpoints" / "step-2").is_dir():
            assert launcher.poll() is None and time.monotonic() < deadline, "no checkpoint was written"
            time.sleep(0.05)
        launcher.send_signal(signal.SIGUSR1)
    finally:
        (code, _, err), = finish([launcher])
    assert code == 75, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("error: preempted by SIGUSR1 at step"), err[-3000:]
    (code, _, err), = finish([train_cli(path)])
    assert code == 0, err[-3000:]
    for rank in (0, 1):
        assert losses(run_dir, rank) == one_node_reference[rank]


def test_the_rank_killed_from_outside_is_blamed_not_the_one_torchrun_stopped():
    """Rank 1 SIGKILLed, rank 0 then SIGTERMed by torchrun: the message must name rank 1."""
    from flopwise.train.launch.start import culprit_rank

    assert culprit_rank({0: -signal.SIGTERM, 1: -signal.SIGKILL}, first=0) == 1
    assert culprit_rank({0: 1, 1: -signal.SIGTERM}, first=0) == 0
    assert culprit_rank({0: -signal.SIGSEGV, 1: 1}, first=1) == 0
    assert culprit_rank({0: 1, 1: 1}, first=1) == 1
