"""`flopwise launch slurm|k8s CONFIG [KEY=VALUE]...`: a job file for a cluster scheduler, from a train config.

Both files run the same per-node command (`flopwise train CONFIG parallel.node_rank=R ...`,
which starts torchrun) and carry the planner's per-node forecast in comments.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Optional

import typer

from flopwise.errors import UserError

LAUNCH_HELP = (
    "Write a job file that trains a config on several nodes: an sbatch script (srun + torchrun) or a "
    "Kubeflow PyTorchJob manifest, with the planner's per-node forecast in its comments. "
    "See docs/strategies.md (multi-node)."
)
CONFIG_ARGUMENT = typer.Argument(None, metavar="[CONFIG.yaml] [KEY=VALUE]...",
                                 help="A YAML config and/or dotted overrides, as for `flopwise train`.")
NODES = typer.Option(None, "--nodes", help="Nodes (sets parallel.nnodes). [default: the config's]")
GPUS = typer.Option(None, "--gpus-per-node", help="GPUs per node (sets parallel.nproc_per_node). [default: the config's]")
HARDWARE = typer.Option("h100-sxm", "--hardware", help="The GPU, for the forecast (catalog key, see `flopwise hardware`).")
OUT = typer.Option(None, "--out", help="Write the file here (default: print it).")


def register_launch(app: typer.Typer) -> None:
    """`flopwise launch slurm` and `flopwise launch k8s`."""
    launch = typer.Typer(name="launch", help=LAUNCH_HELP, no_args_is_help=True)
    app.add_typer(launch, name="launch")

    @launch.command(name="slurm")
    def slurm(
        args: Optional[list[str]] = CONFIG_ARGUMENT,
        nodes: Optional[int] = NODES,
        gpus_per_node: Optional[int] = GPUS,
        partition: Optional[str] = typer.Option(None, "--partition", help="Slurm partition. [default: the cluster's]"),
        time: str = typer.Option("24:00:00", "--time", help="Time limit, HH:MM:SS or D-HH:MM:SS."),
        name: Optional[str] = typer.Option(None, "--name", help="Job name. [default: the run directory's name]"),
        hardware: str = HARDWARE,
        out: Optional[str] = OUT,
    ) -> None:
        """An sbatch script: one srun task per node runs `flopwise train`, which starts torchrun; requeued on exit 75."""
        from flopwise.train.launch.forecast import forecast_node
        from flopwise.train.launch.slurm import SlurmJob, sbatch_script

        cfg = _job_config(args, nodes, gpus_per_node)
        job = SlurmJob(name=name or Path(cfg.logging.run_dir).name or "flopwise", time=time, partition=partition)
        _emit(sbatch_script(cfg, job, forecast_node(cfg, hardware), _this_command()), out, "sbatch")

    @launch.command(name="k8s")
    def k8s(
        args: Optional[list[str]] = CONFIG_ARGUMENT,
        image: str = typer.Option(..., "--image", help="A container image with flopwise installed."),
        nodes: Optional[int] = NODES,
        gpus_per_node: Optional[int] = GPUS,
        name: Optional[str] = typer.Option(None, "--name", help="Job name. [default: from the run directory's name]"),
        namespace: Optional[str] = typer.Option(None, "--namespace", help="Kubernetes namespace. [default: kubectl's]"),
        pvc: Optional[str] = typer.Option(None, "--pvc", help="A PersistentVolumeClaim for data, cache and run_dir."),
        mount: str = typer.Option("/shared", "--mount", help="Where --pvc is mounted in every pod."),
        hardware: str = HARDWARE,
        out: Optional[str] = OUT,
    ) -> None:
        """A Kubeflow PyTorchJob (Master + Workers, nprocPerNode, nvidia.com/gpu) and a ConfigMap with the config."""
        from flopwise.train.launch.k8s import KubernetesJob, job_name_for, pytorchjob_manifest
        from flopwise.train.launch.forecast import forecast_node

        cfg = _job_config(args, nodes, gpus_per_node)
        if cfg.parallel.backend == "gloo":
            raise UserError("parallel.backend: gloo is the CPU backend; the PyTorchJob asks for GPUs (nccl or auto)")
        job = KubernetesJob(name=name or job_name_for(Path(cfg.logging.run_dir).name), image=image,
                            namespace=namespace, volume_claim=pvc, volume_mount=mount)
        _emit(pytorchjob_manifest(cfg, job, forecast_node(cfg, hardware), _this_command()), out, "kubectl apply -f")


def _job_config(args: list[str] | None, nodes: int | None, gpus_per_node: int | None):
    """The config with --nodes/--gpus-per-node as overrides (validated like any other key)."""
    from flopwise.config.loading import split_arguments
    from flopwise.config.loading import load_config

    config_path, overrides = split_arguments(args or [])
    if nodes is not None:
        overrides.append(f"parallel.nnodes={nodes}")
    if gpus_per_node is not None:
        overrides.append(f"parallel.nproc_per_node={gpus_per_node}")
    return load_config(config_path, overrides)


def _this_command() -> str:
    return "flopwise " + " ".join(shlex.quote(arg) for arg in sys.argv[1:])


def _emit(text: str, out: str | None, how_to_run: str) -> None:
    if out is None:
        sys.stdout.write(text)
        return
    path = Path(out)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as err:
        raise UserError(f"--out: cannot write {path}: {err.strerror or err}") from None
    print(f"wrote {path}; run it with: {how_to_run} {shlex.quote(str(path))}")
