"""`flopwise launch k8s`: a Kubeflow Training Operator PyTorchJob (kubeflow.org/v1) for a config.

Why a PyTorchJob rather than a JobSet: the operator already does the per-node wiring the run
needs (a service per pod, MASTER_ADDR/MASTER_PORT, PET_NNODES, PET_NPROC_PER_NODE,
PET_NODE_RANK in every pod), while a JobSet would leave it to the manifest to derive ranks
and the first pod's address from indexes and hostnames.

Each pod (Master = node 0, Workers = nodes 1..N-1) runs `flopwise train` with its node rank,
which starts torchrun for the pod's GPUs; the pods meet in torchrun's c10d rendezvous on the
Master's service. No elasticPolicy: the job keeps a fixed size, because flopwise's data order
and global batch assume one world size per run (a resize is a relaunch that reshards, see
docs/checkpoints.md). Failures are restarted at two levels: torchrun's `--max-restarts`
(`parallel.max_restarts`) restarts the ranks in place, and `restartPolicy: OnFailure`
restarts a container that exited non-zero. Not `ExitCode`: it treats exit codes 1-127 as
permanent, so a preempted run (exit 75, checkpoint saved) would never be restarted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import yaml

from flopwise.errors import UserError
from flopwise.config.schema import RunConfig
from flopwise.config.loading import dump_config
from flopwise.train.launch.forecast import NodeForecast, forecast_lines

CONFIG_MOUNT = "/etc/flopwise"
# The Master's port the operator names MASTER_PORT and exposes through the Master's service
# (the operator's own default, written out): the pods' c10d rendezvous.
MASTER_PORT = {"name": "pytorchjob-port", "containerPort": 23456}
# Names the operator turns into services (`<name>-worker-<i>`): DNS-1035 labels of at most 63 characters.
NAME = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")


@dataclass(frozen=True)
class KubernetesJob:
    """What the cluster needs beyond the config."""

    name: str
    image: str
    namespace: str | None = None
    volume_claim: str | None = None  # a PersistentVolumeClaim every pod mounts (data, cache, run_dir)
    volume_mount: str = "/shared"
    grace_seconds: int = 120  # from SIGTERM to SIGKILL when a pod is stopped


def check_kubernetes_job(job: KubernetesJob) -> None:
    """One-line errors for values the API server would refuse."""
    if not NAME.match(job.name):
        raise UserError(f"--name: '{job.name}' is not a job name (allowed: lower-case letters, digits and '-', "
                        "starting with a letter, at most 40 characters)")
    if not job.image.strip() or any(c.isspace() for c in job.image):
        raise UserError(f"--image: '{job.image}' is not an image reference (e.g. registry.example.com/flopwise:0.1)")
    if not job.volume_mount.startswith("/"):
        raise UserError(f"--mount: '{job.volume_mount}' is not an absolute path")


def job_name_for(text: str) -> str:
    """A valid job name from a run directory's name (`runs/multi_node` -> `multi-node`)."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    if not name[:1].isalpha():
        name = f"flopwise-{name}"
    return name[:40].strip("-")


def pytorchjob_manifest(cfg: RunConfig, job: KubernetesJob, forecast: NodeForecast, command: str) -> str:
    """A ConfigMap with the resolved config and the PyTorchJob that runs it, as one YAML stream."""
    check_kubernetes_job(job)
    p = cfg.parallel
    metadata = {"name": job.name, **({"namespace": job.namespace} if job.namespace else {})}
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {**metadata, "name": f"{job.name}-config"},
        "data": {"config.yaml": dump_config(cfg)},
    }
    replicas = {"Master": _replica(1, cfg, job, ports=[MASTER_PORT])}
    if p.nnodes > 1:
        replicas["Worker"] = _replica(p.nnodes - 1, cfg, job)
    pytorch_job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": metadata,
        "spec": {
            "nprocPerNode": str(p.nproc_per_node),
            "runPolicy": {"cleanPodPolicy": "None"},
            "pytorchReplicaSpecs": replicas,
        },
    }
    header = [f"Written by: {command}", "Apply with: kubectl apply -f THIS_FILE", "", *forecast_lines(forecast), "",
              *_explanation(cfg, job)]
    comments = "\n".join(f"# {line}".rstrip() for line in header)
    documents = yaml.dump_all([config_map, pytorch_job], Dumper=_BlockTextDumper, sort_keys=False, width=120)
    return f"{comments}\n{documents}"


class _BlockTextDumper(yaml.SafeDumper):
    """Safe YAML that writes multi-line text (the embedded config) as a readable `|` block."""


def _text(dumper: yaml.SafeDumper, text: str):
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


_BlockTextDumper.add_representer(str, _text)


def _replica(count: int, cfg: RunConfig, job: KubernetesJob, ports: list[dict] | None = None) -> dict:
    gpus = cfg.parallel.nproc_per_node
    mounts = [{"name": "config", "mountPath": CONFIG_MOUNT, "readOnly": True}, {"name": "shm", "mountPath": "/dev/shm"}]
    volumes = [{"name": "config", "configMap": {"name": f"{job.name}-config"}},
               {"name": "shm", "emptyDir": {"medium": "Memory"}}]
    if job.volume_claim:
        mounts.append({"name": "shared", "mountPath": job.volume_mount})
        volumes.append({"name": "shared", "persistentVolumeClaim": {"claimName": job.volume_claim}})
    container = {
        "name": "pytorch",  # the operator finds the training container by this name
        "image": job.image,
        "command": ["flopwise", "train", f"{CONFIG_MOUNT}/config.yaml"],
        # $(VAR) is expanded by Kubernetes from the variables the operator sets in every pod
        "args": ["parallel.node_rank=$(PET_NODE_RANK)", "parallel.rdzv_endpoint=$(MASTER_ADDR):$(MASTER_PORT)",
                 f"parallel.rdzv_id={job.name}"],
        "env": [{"name": "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "value": str(job.grace_seconds - 10)}],
        "resources": {"limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}},
        "volumeMounts": mounts,
    }
    if ports:
        container["ports"] = ports
    return {
        "replicas": count,
        "restartPolicy": "OnFailure",
        "template": {"spec": {"terminationGracePeriodSeconds": job.grace_seconds, "containers": [container],
                              "volumes": volumes}},
    }


def _explanation(cfg: RunConfig, job: KubernetesJob) -> list[str]:
    p = cfg.parallel
    shared = (f"the PersistentVolumeClaim {job.volume_claim} is mounted at {job.volume_mount} in every pod"
              if job.volume_claim else "no shared volume was given (--pvc)")
    return [
        f"{p.nnodes} pod(s) (Master = node 0, Worker = nodes 1..{p.nnodes - 1}), each running `flopwise train`, which",
        f"starts torchrun for its {p.nproc_per_node} GPU(s); the pods meet in torchrun's c10d rendezvous on the Master.",
        "A stopped pod gets SIGTERM: the ranks save a checkpoint within terminationGracePeriodSeconds and exit 75;",
        "restartPolicy OnFailure restarts the container, which resumes from the latest checkpoint.",
        f"logging.run_dir, data.cache_dir and the data must be on storage every pod sees: {shared}.",
        "PyTorchJob rather than JobSet, no elasticPolicy, OnFailure rather than ExitCode: see docs/strategies.md.",
    ]
