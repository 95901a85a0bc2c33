"""runrecord/run_dir.py: one property per entry of a run directory, and no other module spells an entry's name."""

from __future__ import annotations

import ast
from pathlib import Path

from flopwise.runrecord import run_dir as layout
from flopwise.runrecord.run_dir import RunDir

SRC = Path(__file__).resolve().parents[2] / "src" / "flopwise"
ENTRY_NAMES = {value for name, value in vars(layout).items()
               if name.isupper() and isinstance(value, str) and not name.endswith("PATTERN")}
ENTRY_PREFIXES = ("metrics.rank", "library.", "library.rank")
# The same words naming something else than an entry of a run directory.
NOT_RUN_DIRECTORY = {
    ("train/data/files.py", "tokenizer.json"): "the token cache's tokenizer",
    ("config/schema.py", "tokenizer.json"): "a pretrained HF folder's tokenizer",
    ("train/data/tokenizer.py", "tokenizer.json"): "a pretrained HF folder's tokenizer",
    ("train/launch/k8s.py", "config.yaml"): "the key of a Kubernetes ConfigMap",
    ("train/launch/start.py", "config.yaml"): "the node-local copy torchrun's workers read",
    ("artifacts/export.py", "config.yaml"): "the export folder's own copy",
    ("compress/tasks.py", "config.yaml"): "a file inside a compressed artifact",
    ("compress/artifact.py", "config.yaml"): "a file inside a compressed artifact",
    ("artifacts/commands.py", "export"): "the `flopwise export` command's name",
    ("artifacts/export_hf.py", "tokenizer.json"): "a pretrained HF folder's tokenizer",
    ("compress/report.py", "report.md"): "the compressed artifact's own report",
    ("compress/report.py", "compressed"): "a key of compress's result",
    ("compress/model_run.py", "compressed"): "a key of compress's result",
    ("diagnose/doctor.py", "tensorboard"): "the Python package",
    ("extras.py", "tensorboard"): "the Python package",
}


def spelled_entry_names(root: Path = SRC) -> list[tuple[str, str, int]]:
    """(file, name, line) of every string constant outside runrecord/ that is an entry's name."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("runrecord/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                value = node.value
                if value in ENTRY_NAMES or value.startswith(ENTRY_PREFIXES):
                    if (rel, value) not in NOT_RUN_DIRECTORY:
                        found.append((rel, value, node.lineno))
    return found


def test_no_module_outside_runrecord_spells_an_entry_name():
    found = spelled_entry_names()
    assert not found, "run-directory entry names spelled outside runrecord/ (use RunDir):\n" + "\n".join(
        f"{rel}:{line}: {value!r}" for rel, value, line in found)


def test_a_planted_name_is_found(tmp_path):
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "writer.py").write_text('PATH = "predicted_vs_measured.json"\nLOG = f"metrics.rank{1}.jsonl"\n')
    assert spelled_entry_names(tmp_path) == [("train/writer.py", "predicted_vs_measured.json", 1),
                                             ("train/writer.py", "metrics.rank", 2)]


def test_each_entry_has_its_property_and_the_records_are_read_back(tmp_path):
    run = RunDir(str(tmp_path))
    assert run.root == tmp_path and run.config == tmp_path / "config.yaml"
    assert run.metrics(3) == tmp_path / "metrics.rank3.jsonl" and run.library_log(2).name == "library.rank2.log"
    assert not run.has_metrics() and run.metrics_files() == []
    run.metrics(0).write_text("{}\n")
    run.shared_metrics.write_text("{}\n")
    assert run.has_metrics() and run.metrics_files() == [run.metrics(0), run.shared_metrics]
    run.write_config("model: {}\n")
    assert run.config.read_text() == "model: {}\n"
    paths = {getattr(run, name) for name in ("config", "plan", "comparison", "environment", "tokenizer", "checkpoints",
                                             "lock", "tensorboard", "export", "compressed", "report", "report_html",
                                             "plots", "shared_metrics")}
    assert {p.name for p in paths} == ENTRY_NAMES and all(p.parent == tmp_path for p in paths)
