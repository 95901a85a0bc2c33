"""Starting a run: in this process, or under torchrun when the config asks for several.

`flopwise train` with `parallel.nproc_per_node * parallel.nnodes > 1`, outside an existing
launch, starts torchrun itself:

    python -m torch.distributed.run --nproc-per-node N
        [--standalone | --nnodes M --node-rank R --rdzv-backend c10d --rdzv-endpoint H:P --rdzv-id ID]
        --max-restarts K -m flopwise.train.worker runs/<name>/config.yaml

(the launcher runs in this process through `torch.distributed.run.run`, so a failed
rank ends as one line instead of the launcher's traceback). Inside torchrun or Slurm
(RANK/WORLD_SIZE or SLURM_PROCID set) the run happens directly in this process. A
rank that dies makes torchrun stop the others at once; a rank on another node that
waits on it fails after `parallel.timeout_minutes` (the process-group timeout).

Restarts (`parallel.max_restarts`): on one node flopwise starts a fresh torchrun after a
preemption (exit 75) or a failed rank; on several nodes torchrun's own `--max-restarts`
does it. Each start resumes from the latest valid checkpoint (docs/checkpoints.md).
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path

from flopwise.errors import UserError
from flopwise.train.config import RunConfig
from flopwise.train.config_loading import dump_config

ERROR_FILE_ENV = "FLOPWISE_ERROR_FILE"


def world_size_of(cfg: RunConfig) -> int:
    """Processes the config asks for in all."""
    return cfg.parallel.nproc_per_node * cfg.parallel.nnodes


def torchrun_args(cfg: RunConfig, config_path: Path) -> list[str]:
    """torchrun's command line for this config (without the `python -m torch.distributed.run`)."""
    p = cfg.parallel
    args = [f"--nproc-per-node={p.nproc_per_node}"]
    if p.nnodes == 1:
        args.append("--standalone")  # a free local port: several jobs on one machine never collide
    else:
        args += [
            f"--nnodes={p.nnodes}",
            f"--node-rank={p.node_rank}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={p.rdzv_endpoint}",
            f"--rdzv-id={p.rdzv_id}",
        ]
    # One node: flopwise restarts a fresh torchrun itself (`_run_torchrun_with_restarts`); torchrun's
    # in-place restarts can fail to reconnect a gloo group (pytorch#167288). Several nodes: torchrun's.
    restarts = p.max_restarts if p.nnodes > 1 else 0
    args += [f"--max-restarts={restarts}", "-m", "flopwise.train.worker", str(config_path)]
    return args


def launch(cfg: RunConfig) -> None:
    """Run `cfg`: directly when one process (or already inside a launch), else under torchrun."""
    from flopwise.train.parallel import check_strategy, launched_externally

    check_strategy(cfg.parallel)
    if launched_externally():
        run_here(cfg)  # torchrun or Slurm restarts this process; no retry loop of our own
        return
    if world_size_of(cfg) == 1:
        _run_here_with_restarts(cfg)
        return
    run_dir = Path(cfg.logging.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path = run_dir / "config.yaml"
    config_path.write_text(dump_config(cfg))
    _prepare_data_once(cfg)
    _run_torchrun_with_restarts(cfg, config_path)


def run_here(cfg: RunConfig) -> None:
    """The per-process run: join the group, train, leave the group."""
    from flopwise.train.library_noise import route_library_noise

    route_library_noise(cfg.logging.run_dir)  # before torch.distributed / DeepSpeed are imported
    from flopwise.train.environment import write_environment
    from flopwise.train.loop import run_training
    from flopwise.train.parallel import init_distributed, shutdown

    _warn_about_bf16_on_cpu(cfg)
    env = init_distributed(cfg.parallel)
    write_environment(cfg.logging.run_dir)
    try:
        run_training(cfg, env)
    finally:
        shutdown(env)


def _warn_about_bf16_on_cpu(cfg: RunConfig) -> None:
    """Rank 0 says once, with a measurement, when bf16 will be slower than fp32 on this CPU."""
    import torch

    from flopwise.train.bf16_on_cpu import bf16_warning

    if int(os.environ.get("RANK", "0")) != 0:
        return
    message = bf16_warning(cfg.precision.mode, on_cpu=not torch.cuda.is_available())
    if message:
        print(message, file=sys.stderr, flush=True)


def _run_here_with_restarts(cfg: RunConfig) -> None:
    """One process: after a preemption (checkpoint saved, exit code 75) start again, up to `parallel.max_restarts` times."""
    from flopwise.train.faults import Preempted

    for attempt in range(cfg.parallel.max_restarts + 1):
        try:
            run_here(cfg)
            return
        except Preempted as stop:
            if attempt == cfg.parallel.max_restarts:
                raise
            print(f"{stop}; restart {attempt + 1} of {cfg.parallel.max_restarts}", file=sys.stderr, flush=True)


def _run_torchrun_with_restarts(cfg: RunConfig, config_path: Path) -> None:
    """One node: after a preemption (exit 75) or a failed rank, start a fresh torchrun (new rendezvous),
    up to `parallel.max_restarts` times; every start resumes from the latest valid checkpoint."""
    from flopwise.train.faults import Preempted

    restarts = cfg.parallel.max_restarts if cfg.parallel.nnodes == 1 else 0
    for attempt in range(restarts + 1):
        try:
            _run_torchrun(torchrun_args(cfg, config_path))
            return
        except Preempted as stop:
            if attempt == restarts:
                raise
            print(f"{stop}; restart {attempt + 1} of {restarts}", file=sys.stderr, flush=True)
        except SystemExit as failed:  # a rank crashed (its output is above)
            if attempt == restarts or failed.code != 1:
                raise
            print(f"restart {attempt + 1} of {restarts} after a failed rank", file=sys.stderr, flush=True)


def _prepare_data_once(cfg: RunConfig) -> None:
    """Tokenize and cache in the launching process, so data errors surface before any rank starts."""
    from flopwise.train.data import prepare_data

    if cfg.parallel.node_rank == 0 or cfg.parallel.nnodes == 1:
        prepare_data(cfg.data)


def _run_torchrun(args: list[str]) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    # torchrun sets OMP_NUM_THREADS=1 with a warning when unset; say it once, quietly.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    with tempfile.TemporaryDirectory(prefix="flopwise-errors-") as errors:
        os.environ[ERROR_FILE_ENV] = str(Path(errors) / "error")
        try:
            run(get_args_parser().parse_args(args))
        except ChildFailedError as failed:
            from flopwise.train.faults import PREEMPTED_EXIT_CODE, Preempted

            message = _first_user_error(Path(errors))
            rank, failure = failed.get_first_failure()
            if message and failure.exitcode == PREEMPTED_EXIT_CODE:
                raise Preempted(message) from None  # exit code 75: the scheduler may requeue
            if message:
                raise UserError(message) from None
            print(f"error: rank {rank} failed with exit code {failure.exitcode}; see its output above",
                  file=sys.stderr)
            raise SystemExit(1) from None
        finally:
            os.environ.pop(ERROR_FILE_ENV, None)


def _first_user_error(folder: Path) -> str | None:
    files = sorted(folder.glob("error.rank*"))
    return files[0].read_text().strip() if files else None
