"""Starting a run: in this process, or under torchrun when the config asks for several.

`flopwise train` with more than one process (`ResolvedRun.processes`: `parallel.nproc_per_node *
parallel.nnodes`, one for `strategy=single`), outside an existing launch, starts torchrun itself, once per node:

    python -m torch.distributed.run --nproc-per-node N
        [--standalone | --nnodes M --node-rank R --rdzv-backend c10d --rdzv-endpoint H:P --rdzv-id ID]
        --max-restarts K --signals-to-handle SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1
        -m flopwise.train.launch.worker <node-local copy of the resolved config>

(the launcher runs in this process through `torch.distributed.run.run`, so a failed
rank ends as one line instead of the launcher's traceback, and a preemption as exit 75).
Several nodes run the same command with their own `parallel.node_rank` (docs/strategies.md:
by hand, from an sbatch script, or in a Kubeflow PyTorchJob pod). The run happens directly
in this process when a launcher already started it as one rank: torchrun (LOCAL_RANK set)
or an `srun` task per process (SLURM_NTASKS = the job's processes). A rank that dies makes
torchrun stop the others at once; a rank on another node that waits on it fails after
`parallel.timeout_minutes` (the process-group timeout).

Restarts (`parallel.max_restarts`): on one node flopwise starts a fresh torchrun after a
preemption (exit 75) or a failed rank; on several nodes torchrun's own `--max-restarts`
does it. Each start resumes from the latest valid checkpoint (docs/checkpoints.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import tempfile
from pathlib import Path

from flopwise.errors import UserError
from flopwise.config.schema import RunConfig
from flopwise.config.loading import dump_config
from flopwise.config.resolve import ResolvedRun, processes_of, resolve_run
from flopwise.errors import PREEMPTED_EXIT_CODE, Preempted
from flopwise.train.launch.heartbeat import HEARTBEAT_DIR_ENV, STALLED_EXIT_CODE, StallWatch

ERROR_FILE_ENV = "FLOPWISE_ERROR_FILE"
LAUNCHER_PID_ENV = "FLOPWISE_LAUNCHER_PID"  # the workers watch this pid and stop when it is gone
# torchrun's default signals plus SIGUSR1, Slurm's warning signal: torchrun passes them on to
# the ranks, which save a checkpoint and stop with exit code 75 (docs/checkpoints.md).
FORWARDED_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"


class StoppedBySignal(Preempted):
    """This launcher was signalled (Ctrl-C, scancel, a pod's deletion) and its ranks saved a checkpoint.

    Exit code 75 like any preemption, but never restarted here: the job itself is being
    stopped, so the scheduler requeues it (or not).
    """


class RankStalled(UserError):
    """A rank stopped beating for `parallel.stall_seconds` (train/launch/heartbeat.py); this node's ranks were ended."""

    exit_code = STALLED_EXIT_CODE


def ignore_stop_signals() -> None:
    """The run is stopping on a signal: more Ctrl-Cs (or SIGTERMs) must neither cut the save or the
    message short nor kill the exit (Python puts the default handlers back while it shuts down,
    but leaves an ignored signal ignored)."""
    for sig in _signals(FORWARDED_SIGNALS):
        signal.signal(sig, signal.SIG_IGN)


@contextlib.contextmanager
def first_signal_only():
    """torchrun's handler raises SignalException at every stop signal, so a second Ctrl-C interrupted its
    shutdown (which forwards the first and waits for the ranks to save): the ranks' messages were lost,
    the command said nothing was saved and exited 130. Here only the first signal raises; later ones wait."""
    from torch.distributed.elastic.multiprocessing import api

    original = getattr(api, "_terminate_process_handler", None)  # torch 2.13's name; another torch: no change
    if original is None:
        yield
        return
    seen: list[int] = []

    def once(signum, frame):
        if seen:
            return
        seen.append(signum)
        original(signum, frame)

    api._terminate_process_handler = once  # read by PContext.start() when torchrun installs its handlers
    try:
        yield
    finally:
        api._terminate_process_handler = original


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
    args += [f"--max-restarts={restarts}", f"--signals-to-handle={FORWARDED_SIGNALS}",
             "-m", "flopwise.train.launch.worker", str(config_path)]
    if cfg.model.trust_remote_code:  # the file cannot carry it (config.loading.config_from_mapping)
        args.append("model.trust_remote_code=true")
    return args


def started_as_one_rank(cfg: RunConfig) -> bool:
    """Whether a launcher started this process as one rank of the job, so it must not start torchrun.

    torchrun (and launchers like it) set LOCAL_RANK. `srun` sets SLURM_PROCID in every task:
    one task per process (SLURM_NTASKS equals the config's processes) makes each task a rank;
    one task per node makes each task this node's launcher. RANK/WORLD_SIZE alone do not
    decide: the Kubeflow Training Operator sets them per pod (node), not per process.
    """
    if "LOCAL_RANK" in os.environ and "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return True
    if "SLURM_PROCID" in os.environ and "RANK" not in os.environ:
        return int(os.environ.get("SLURM_NTASKS", "1")) == processes_of(cfg.parallel)
    return False


def launch(cfg: RunConfig) -> None:
    """Run `cfg`: directly when one process (or already one rank of a launch), else under torchrun.

    The run directory is claimed first (lock, reuse and config checks: run_directory.py)
    by the one process that leads the run, and released when it ends.
    """
    # torch loads only when a run starts: launch stays light for the CLI and torchrun_args
    from flopwise.train.launch.machine_fit import check_fits_this_machine
    from flopwise.train.parallel.parallelize import check_strategy
    from flopwise.train.launch.run_directory import claim_run_directory
    from flopwise.train.launch.strategy_choice import settle_for_this_device

    one_rank = started_as_one_rank(cfg)
    if not one_rank:  # the ranks torchrun starts read the config this launcher writes, `precision.mode` named in it
        device_default = _device_precision_default(cfg)
        if device_default is not None and _leads_run(cfg, one_rank):
            print(device_default, flush=True)
    choice = settle_for_this_device(cfg, int(os.environ["WORLD_SIZE"]) if one_rank and "WORLD_SIZE" in os.environ
                                    else None)
    if choice is not None and _leads_run(cfg, one_rank):
        print(choice.line(), flush=True)
    check_strategy(cfg.parallel)
    run = resolve_run(cfg)
    check_fits_this_machine(cfg, run)  # an impossible size is one line now, not an allocator traceback per rank
    if cfg.model.kind == "hf":
        from flopwise.train.model import refuse_remote_code_without_switch

        refuse_remote_code_without_switch(cfg.model)  # before data is prepared: one line, no wait
    try:
        if _leads_run(cfg, one_rank):
            with claim_run_directory(cfg):
                _launch(cfg, run, one_rank)
        else:
            _launch(cfg, run, one_rank)
    except Preempted:
        ignore_stop_signals()  # saved and stopping: a Ctrl-C now must not turn exit 75 into 130
        raise


def _device_precision_default(cfg: RunConfig) -> str | None:
    """A pretrained model's precision default for this node's device (bf16 on a bf16 GPU), applied here
    so every rank, the plan and the run's config.yaml read it; the line saying so, or None."""
    import torch

    from flopwise.train.techniques import precision

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return precision.pretrained_precision_default(cfg, device)


def _leads_run(cfg: RunConfig, one_rank: bool) -> bool:
    """Global rank 0 when a launcher made this process one rank; node 0's launcher otherwise."""
    if one_rank:
        return int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))) == 0
    return cfg.parallel.nnodes == 1 or cfg.parallel.node_rank == 0


def _launch(cfg: RunConfig, run: ResolvedRun, one_rank: bool) -> None:
    if one_rank:
        run_here(cfg)  # torchrun or Slurm restarts this process; no retry loop of our own
        return
    if run.processes == 1:
        _run_here_with_restarts(cfg)
        return
    from flopwise.config.signature import signed_config_text
    from flopwise.runrecord.run_dir import RunDir
    from flopwise.train.launch.run_directory import prepare_run_directory

    run_dir = prepare_run_directory(Path(cfg.logging.run_dir))
    if cfg.parallel.node_rank == 0:
        RunDir(run_dir).write_config(signed_config_text(dump_config(cfg)))  # the run's record, before any rank starts
    _prepare_data_once(cfg)
    _run_torchrun_with_restarts(cfg)


def run_here(cfg: RunConfig) -> None:
    """The per-process run: join the group, train, leave the group."""
    # torch loads only when a run starts: launch stays light for the CLI and torchrun_args
    from flopwise.library_noise import route_library_noise

    route_library_noise(cfg.logging.run_dir)  # before torch.distributed / DeepSpeed are imported
    from flopwise.train.parallel.distributed import init_distributed, shutdown
    from flopwise.measure.environment import write_environment
    from flopwise.train.loop import run_training

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

    from flopwise.measure.bf16_on_cpu import bf16_warning

    if int(os.environ.get("RANK", "0")) != 0:
        return
    message = bf16_warning(cfg.precision.mode, on_cpu=not torch.cuda.is_available())
    if message:
        print(message, file=sys.stderr, flush=True)


def _run_here_with_restarts(cfg: RunConfig) -> None:
    """One process: after a preemption (checkpoint saved, exit code 75) start again, up to `parallel.max_restarts` times."""
    for attempt in range(cfg.parallel.max_restarts + 1):
        try:
            run_here(cfg)
            return
        except Preempted as stop:
            if attempt == cfg.parallel.max_restarts or str(stop).startswith("preempted by SIGINT"):
                raise  # Ctrl-C means stop, not "restart after a preemption"
            print(f"{stop}; restart {attempt + 1} of {cfg.parallel.max_restarts}", file=sys.stderr, flush=True)


def _run_torchrun_with_restarts(cfg: RunConfig) -> None:
    """One node: after a preemption (exit 75) or a failed rank, start a fresh torchrun (new rendezvous),
    up to `parallel.max_restarts` times; every start resumes from the latest valid checkpoint."""
    restarts = cfg.parallel.max_restarts if cfg.parallel.nnodes == 1 else 0
    for attempt in range(restarts + 1):
        try:
            _run_torchrun(cfg)
            return
        except StoppedBySignal:
            raise  # the job itself is being stopped: exit 75 and leave the restart to the scheduler
        except (Preempted, RankStalled) as stop:
            if attempt == restarts:
                raise
            print(f"{stop}; restart {attempt + 1} of {restarts}", file=sys.stderr, flush=True)
        except SystemExit as failed:  # a rank crashed (its output is above)
            if attempt == restarts or failed.code != 1:
                raise
            print(f"restart {attempt + 1} of {restarts} after a failed rank", file=sys.stderr, flush=True)


def _prepare_data_once(cfg: RunConfig) -> None:
    """Tokenize and cache in the launching process, so data errors surface before any rank starts."""
    # tokenizers and numpy load only when data is prepared
    from flopwise.train.data.prepare import prepare_data

    if cfg.parallel.node_rank == 0 or cfg.parallel.nnodes == 1:
        prepare_data(cfg.data)


def _run_torchrun(cfg: RunConfig) -> None:
    """One torchrun on this node; its ranks read a node-local copy of the resolved config.

    The copy is this node's own: several nodes sharing `logging.run_dir` never read a file
    another node (or rank 0, which records `config.yaml` there) is writing.
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    # torchrun sets OMP_NUM_THREADS=1 with a warning when unset; say it once, quietly.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # After an in-place restart the ranks must meet in a fresh store. torchrun's default shares its
    # rendezvous store with the ranks, unprefixed and kept across rounds, so restarted ranks read the
    # previous round's process-group keys (peer addresses of dead ranks) and hang while connecting.
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    # Each elastic module's logger has its own level, so quiet them one by one (e.g. the agent's
    # "Received 15 death signal" warning: the one line that matters is ours).
    for name in [n for n in logging.root.manager.loggerDict if n.startswith("torch.distributed.elastic")]:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    handlers = {sig: signal.getsignal(sig) for sig in _signals(FORWARDED_SIGNALS)}
    with tempfile.TemporaryDirectory(prefix="flopwise-launch-") as name:
        node_dir = Path(name)  # on this node's disk: the config copy and the ranks' error messages
        config_path = node_dir / "config.yaml"
        config_path.write_text(dump_config(cfg))
        os.environ[ERROR_FILE_ENV] = str(node_dir / "error")
        os.environ[LAUNCHER_PID_ENV] = str(os.getpid())
        os.environ[HEARTBEAT_DIR_ENV] = str(node_dir)
        stopped_by_signal = False
        try:
            with first_signal_only(), StallWatch(node_dir, cfg.parallel.stall_seconds) as watch:
                try:
                    run(get_args_parser().parse_args(torchrun_args(cfg, config_path)))
                except ChildFailedError:
                    if watch.message:  # the watch ended the ranks: its line, not theirs
                        raise RankStalled(watch.message) from None
                    raise
        except SignalException as stopped:  # torchrun forwarded it and waited for the workers to save
            stopped_by_signal = True
            ignore_stop_signals()  # kept until the exit: later Ctrl-Cs change nothing
            message = _first_user_error(node_dir)
            if message and message.startswith("preempted"):
                raise StoppedBySignal(message) from None
            print(f"error: stopped by signal {stopped.sigval.name} before the ranks saved a checkpoint",
                  file=sys.stderr)
            raise SystemExit(128 + int(stopped.sigval)) from None
        except ChildFailedError as failed:
            message = _first_user_error(node_dir)
            rank, failure = failed.get_first_failure()
            if message and failure.exitcode == PREEMPTED_EXIT_CODE:
                raise Preempted(message) from None  # exit code 75: the scheduler may requeue
            if message:
                raise UserError(message) from None
            rank = culprit_rank({r: f.exitcode for r, f in failed.failures.items()}, rank)
            failure = failed.failures[rank]
            if failure.exitcode < 0:
                how = f": killed by signal {_signal_name(-failure.exitcode)}"
            else:
                how = f" with exit code {failure.exitcode}"
            print(f"error: rank {rank} failed{how}; see its output above", file=sys.stderr)
            raise SystemExit(1) from None
        finally:
            for name in (ERROR_FILE_ENV, LAUNCHER_PID_ENV, HEARTBEAT_DIR_ENV):
                os.environ.pop(name, None)
            if not stopped_by_signal:
                for sig, handler in handlers.items():
                    signal.signal(sig, handler)


def culprit_rank(exitcodes: dict[int, int], first: int) -> int:
    """The rank that brought the job down, from each failed rank's exit code.

    A rank killed by a signal from outside (SIGKILL by the OOM killer, SIGSEGV) is the cause; the
    others then fail on the broken group, sometimes before torchrun notices the dead one, and
    torchrun stops the survivors with SIGTERM — so a SIGTERM death is an effect, not a cause.
    """
    killed = sorted(r for r, code in exitcodes.items() if code < 0)
    outside = [r for r in killed if -exitcodes[r] != signal.SIGTERM]
    return outside[0] if outside else first


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def _signals(names: str) -> list[signal.Signals]:
    return [getattr(signal, name) for name in names.split(",") if hasattr(signal, name)]


def _first_user_error(folder: Path) -> str | None:
    files = sorted(folder.glob("error.rank*"))
    return files[0].read_text().strip() if files else None
