"""`flopwise launch slurm`: an sbatch script that runs a config on several nodes through srun and torchrun.

Every node runs one srun task, `flopwise train` with this node's `parallel.node_rank`, which
starts torchrun for the node's GPUs; the nodes meet in torchrun's c10d rendezvous on the
first node of the allocation (`scontrol show hostnames`), at the address Slurm itself uses to
reach that node (its NodeAddr, which may differ from the node's name) and the port of
`parallel.rdzv_endpoint`. Slurm's warning signal (SIGUSR1, `--signal=USR1@S`, sent to every
task) reaches torchrun, which passes it to the ranks (`--signals-to-handle`); they save a
checkpoint and exit 75, and the script then requeues the job (`--requeue`, `scontrol
requeue`), which resumes from the latest checkpoint. `parallel.backend: gloo` writes a CPU job
(no GPUs asked for, one CPU per process), the way tests/train/test_slurm_cluster.py runs the
script under a real Slurm.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from flopwise.errors import UserError
from flopwise.config.schema import RunConfig
from flopwise.config.loading import dump_config
from flopwise.train.launch.forecast import NodeForecast, forecast_lines

SLURM_TIME = re.compile(r"^(\d+-)?\d{1,2}(:\d{2}){0,2}$|^\d+$")
CONFIG_END = "FLOPWISE_CONFIG_END"


@dataclass(frozen=True)
class SlurmJob:
    """What sbatch needs beyond the config."""

    name: str
    time: str = "24:00:00"
    partition: str | None = None
    warning_seconds: int = 120  # SIGUSR1 this long before the time limit


def check_slurm_job(job: SlurmJob) -> None:
    """One-line errors for values sbatch would refuse."""
    if not SLURM_TIME.match(job.time):
        raise UserError(f"--time: '{job.time}' is not a Slurm time (allowed: MM, HH:MM:SS, D-HH:MM:SS)")
    if job.partition is not None and not re.fullmatch(r"[\w.,-]+", job.partition):
        raise UserError(f"--partition: '{job.partition}' is not a partition name (letters, digits, . , _ -)")
    if job.warning_seconds < 60:
        raise UserError(f"warning time {job.warning_seconds} s: Slurm signals with a 60 s resolution (allowed: >= 60)")


def sbatch_script(cfg: RunConfig, job: SlurmJob, forecast: NodeForecast, command: str) -> str:
    """The whole sbatch script; `command` is the `flopwise launch` line that wrote it (for its header)."""
    check_slurm_job(job)
    p = cfg.parallel
    run_dir = str(cfg.logging.run_dir)
    rdzv_port = p.rdzv_endpoint.rpartition(":")[2]
    shutdown = job.warning_seconds - 10
    partition = f"#SBATCH --partition={job.partition}\n" if job.partition else ""
    cpu_job = p.backend == "gloo"
    # srun does not inherit sbatch's --cpus-per-task (Slurm >= 22.05, srun(1)): the step asks again.
    resources = f"--cpus-per-task={p.nproc_per_node}" if cpu_job else f"--gpus-per-node={p.nproc_per_node}"
    srun_cpus = f" --cpus-per-task={p.nproc_per_node}" if cpu_job else ""
    devices = f"{p.nproc_per_node} CPU process(es)" if cpu_job else f"{p.nproc_per_node} GPU(s)"
    forecast_text = "\n".join(f"# {line}".rstrip() for line in forecast_lines(forecast))
    config_text = dump_config(cfg).rstrip("\n")
    if CONFIG_END in config_text:
        raise UserError(f"the config contains the text {CONFIG_END}, which ends the script's embedded copy")
    return f"""#!/bin/bash
# Written by: {command}
# Submit with: sbatch THIS_FILE, from an environment where `flopwise` runs (sbatch passes it on).
# Relative paths in the config are relative to the submit directory, and logging.run_dir,
# data.cache_dir and the data must be on a file system every node sees.
#
{forecast_text}
#
# One srun task per node runs `flopwise train`, which starts torchrun for the node's {devices};
# the nodes meet in torchrun's c10d rendezvous on the first node. {job.warning_seconds} s before the time limit
# Slurm sends SIGUSR1 to every task: the ranks save a checkpoint and exit 75, and this script requeues
# the job, which resumes from the latest checkpoint (docs/checkpoints.md, docs/strategies.md).
#SBATCH --job-name={job.name}
#SBATCH --nodes={p.nnodes}
#SBATCH --ntasks-per-node=1
#SBATCH {resources}
#SBATCH --time={job.time}
{partition}#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --signal=USR1@{job.warning_seconds}
#SBATCH --output=slurm-%x-%j.out

set -u

run_dir={shlex.quote(run_dir)}
mkdir -p "$run_dir"
config="$run_dir/launch.config.yaml"  # the resolved config, the same on every node
cat > "$config" <<'{CONFIG_END}'
{config_text}
{CONFIG_END}

head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
# The address Slurm reaches the first node at (NodeAddr; the node's name when none is configured).
head_addr=$(scontrol show node "$head_node" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)
# After a signal torchrun waits this long for the ranks' checkpoint before it kills them.
export TORCH_ELASTIC_SHUTDOWN_TIMEOUT={shutdown}

# No --kill-on-bad-exit: after a preemption a node that exits first must not kill rank 0 while it
# publishes the checkpoint; a lost node ends the others after parallel.timeout_minutes.
# Each task is its node's launcher and starts torchrun. Without SLURM_PROCID flopwise never takes
# it for one rank of an srun-per-process launch, which it would when a node runs one process.
srun --kill-on-bad-exit=0{srun_cpus} bash -c "exec env -u SLURM_PROCID flopwise train '$config' \\
    parallel.node_rank=\\$SLURM_NODEID parallel.rdzv_endpoint=${{head_addr:-$head_node}}:{rdzv_port} \\
    parallel.rdzv_id=slurm-$SLURM_JOB_ID"
rc=$?
if [ "$rc" -eq 75 ]; then  # preempted, checkpoint saved
    echo "flopwise: preempted (exit 75); requeueing job $SLURM_JOB_ID, which resumes from the latest checkpoint"
    scontrol requeue "$SLURM_JOB_ID"
fi
exit "$rc"
"""
