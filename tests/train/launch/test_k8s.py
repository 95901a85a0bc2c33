"""`flopwise launch k8s`: the manifest loads as YAML, passes the PyTorchJob CRD's own schema, has what the
Kubeflow Training Operator requires, and its pods' command lines, with the variables the operator sets,
are valid `flopwise train` calls.

The schema is the training-operator's CRD, vendored unmodified in tests/train/launch/kubeflow/ (release
v1.9.0; README there), checked with `jsonschema` after its Kubernetes extensions are translated
(tests/train/launch/crd_schema.py): the whole PyTorchJob, not chosen fields.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml

from flopwise.cli import main
from flopwise.config.loading import load_config
from flopwise.train.launch.k8s import job_name_for
from tests.train.launch.crd_schema import crd_validator

ROOT = Path(__file__).resolve().parents[3]
MULTI_NODE = ROOT / "configs" / "multi_node.yaml"
PYTORCHJOB_CRD = Path(__file__).parent / "kubeflow" / "kubeflow.org_pytorchjobs.yaml"


@pytest.fixture(scope="module")
def pytorchjob_schema():
    return crd_validator(PYTORCHJOB_CRD, "v1")


def schema_errors(validator, document: dict) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in validator.iter_errors(document)]


def manifest(tmp_path: Path, monkeypatch, *flags: str) -> list[dict]:
    out = tmp_path / "job.yaml"
    argv = ["launch", "k8s", str(MULTI_NODE), "--image", "registry.example.com/flopwise:0.1", "--out", str(out), *flags]
    monkeypatch.setattr(sys, "argv", ["flopwise", *argv])
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code in (0, None)
    assert out.read_text().startswith("# Written by: flopwise launch k8s")
    return list(yaml.safe_load_all(out.read_text()))


def expand(text: str, env: dict) -> str:
    """Kubernetes' $(VAR) expansion in command and args."""
    return re.sub(r"\$\(([A-Z_]+)\)", lambda m: env[m.group(1)], text)


@pytest.mark.parametrize("flags", [
    [],
    ["--nodes", "1"],  # a Master alone, no Worker replicas
    ["--nodes", "4", "--gpus-per-node", "4", "--pvc", "datasets", "--mount", "/data", "--namespace", "ml-team"],
])
def test_the_pytorchjob_passes_the_crd_schema(tmp_path, monkeypatch, pytorchjob_schema, flags):
    _, job = manifest(tmp_path, monkeypatch, *flags)
    assert schema_errors(pytorchjob_schema, job) == []


@pytest.mark.parametrize("change, error", [
    (lambda job: job["spec"].update(nprocPerNod="8"), "Additional properties are not allowed ('nprocPerNod'"),
    (lambda job: job["spec"].update(nprocPerNode=8), "8 is not of type 'string'"),
    (lambda job: job["spec"]["pytorchReplicaSpecs"]["Master"].update(replicas="one"), "'one' is not of type 'integer'"),
    (lambda job: master_container(job).update(env={"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "110"}), "is not of type 'array'"),
    (lambda job: master_container(job)["ports"].append(dict(master_container(job)["ports"][0])), "duplicate entry"),
    (lambda job: master_container(job)["resources"]["limits"].update(cpu=[4]), "[4] is not valid under any"),
    (lambda job: job["spec"].pop("pytorchReplicaSpecs"), "'pytorchReplicaSpecs' is a required property"),
    (lambda job: job["spec"]["pytorchReplicaSpecs"]["Master"].update(replicas=2**31), "is not a 'int32'"),
])
def test_the_crd_schema_refuses_what_the_api_server_would(tmp_path, monkeypatch, pytorchjob_schema, change, error):
    """The check can fail: unknown fields, wrong types, list-map keys, int-or-string, int32 are all seen."""
    _, job = manifest(tmp_path, monkeypatch)
    change(job)
    errors = schema_errors(pytorchjob_schema, job)
    assert len(errors) == 1 and error in errors[0], errors


def master_container(job: dict) -> dict:
    return job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]


def test_the_pytorchjob_has_what_the_operator_requires(tmp_path, monkeypatch):
    config_map, job = manifest(tmp_path, monkeypatch, "--nodes", "4", "--pvc", "datasets")
    assert (job["apiVersion"], job["kind"], job["metadata"]["name"]) == ("kubeflow.org/v1", "PyTorchJob", "multi-node")
    assert job["spec"]["nprocPerNode"] == "8"
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert (replicas["Master"]["replicas"], replicas["Worker"]["replicas"]) == (1, 3)
    for kind in ("Master", "Worker"):
        spec = replicas[kind]
        assert spec["restartPolicy"] == "OnFailure"
        pod = spec["template"]["spec"]
        container, = pod["containers"]
        assert container["name"] == "pytorch" and container["image"] == "registry.example.com/flopwise:0.1"
        assert container["command"] == ["flopwise", "train", "/etc/flopwise/config.yaml"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
        assert {"name": "shared", "persistentVolumeClaim": {"claimName": "datasets"}} in pod["volumes"]
        assert pod["terminationGracePeriodSeconds"] > int(container["env"][0]["value"])  # torchrun's shutdown wait
    assert replicas["Master"]["template"]["spec"]["containers"][0]["ports"][0]["name"] == "pytorchjob-port"
    assert config_map["kind"] == "ConfigMap" and config_map["metadata"]["name"] == "multi-node-config"


def test_each_pod_runs_flopwise_train_with_its_node_rank(tmp_path, monkeypatch):
    config_map, job = manifest(tmp_path, monkeypatch)
    config = tmp_path / "config.yaml"
    config.write_text(config_map["data"]["config.yaml"])
    container = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    operator_env = {"PET_NODE_RANK": "1", "MASTER_ADDR": "multi-node-master-0", "MASTER_PORT": "23456"}
    cfg = load_config(config, [expand(arg, operator_env) for arg in container["args"]])
    assert cfg.parallel.node_rank == 1 and cfg.parallel.nnodes == 2 and cfg.parallel.nproc_per_node == 8
    assert cfg.parallel.rdzv_endpoint == "multi-node-master-0:23456"
    assert cfg.model == load_config(MULTI_NODE).model


def test_job_names_follow_kubernetes_rules():
    assert job_name_for("multi_node") == "multi-node"
    assert job_name_for("2024 Run!") == "flopwise-2024-run"
    assert len(job_name_for("x" * 80)) == 40


@pytest.mark.parametrize("flags, message", [
    (["--image", "x", "--name", "Bad_Name"], "error: --name: 'Bad_Name' is not a job name"),
    (["--image", "x", "--gpus-per-node", "0"], "error: override 'parallel.nproc_per_node=0'"),
    (["--image", "x", "model.n_layerz=3"], "error: "),
    (["--image", "x", "parallel.backend=gloo"], "error: parallel.backend: gloo is the CPU backend"),
])
def test_a_bad_flag_is_one_line_and_exit_2(flags, message, capsys):
    with pytest.raises(SystemExit) as done:
        main(["launch", "k8s", str(MULTI_NODE), *flags])
    assert done.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(message), err


def test_a_missing_image_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as done:
        main(["launch", "k8s", str(MULTI_NODE)])
    assert done.value.code == 2
    assert "--image" in capsys.readouterr().err
