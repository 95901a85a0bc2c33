"""scripts/tour.sh: every command of the README tour, in order, from a fresh clone, does what the README says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.tour
@pytest.mark.distributed
def test_the_readme_tour_runs_from_a_fresh_clone(tmp_path):
    results = tmp_path / "tour.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID")}
    env.update(TOUR_PYTHON=sys.executable, TOUR_STEPS="6", TOUR_RESULTS=str(results), OMP_NUM_THREADS="1")
    done = subprocess.run(["bash", str(ROOT / "scripts" / "tour.sh"), str(tmp_path / "work")], capture_output=True,
                          text=True, env=env, timeout=3600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "did what the README says" in done.stdout
    readme_commands = [line.split("#")[0].strip() for line in (ROOT / "README.md").read_text().splitlines()
                       if line.startswith("flopwise ")]
    steps = json.loads(results.read_text())["steps"]
    assert len(steps) >= len(readme_commands), "every README command is part of the tour"
