"""Shared by the benchmarks that train tiny models through `flopwise train` and read back its own
`predicted_vs_measured.json` (mesh_memory.py, pipeline_bubble.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml


def write_corpus(root: Path) -> Path:
    """A small repetitive Python corpus in root/text (enough tokens for a few steps of a tiny model)."""
    folder = root / "text"
    folder.mkdir()
    (folder / "items.py").write_text(
        "".join(f"class Item{i % 31}:\n    size = {i % 17}\n    name = 'item {i}'\n" for i in range(3000)))
    return folder


def train_and_compare(root: Path, cfg: dict) -> dict:
    """Train `cfg` in a fresh process (one thread per rank); its predicted_vs_measured.json, or
    {"error": [last stderr line]} when the run failed."""
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "flopwise", "train", str(path)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1:]}
    return json.loads((Path(cfg["logging"]["run_dir"]) / "predicted_vs_measured.json").read_text())
