"""scripts/tour.sh: every command of the README tour, in order, from a fresh clone, does what the README says."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    """Each `flopwise ...` line of the README, comment dropped; a continued line ends in `...` as the tour names it."""
    lines = [line.split("#")[0].strip() for line in (ROOT / "README.md").read_text().splitlines()
             if line.startswith("flopwise ")]
    return [line[:-1].strip() + " ..." if line.endswith("\\") else line for line in lines]


def tour_step_names() -> list[str]:
    names = re.findall(r'^step "((?:[^"\\]|\\.)*)"', (ROOT / "scripts" / "tour.sh").read_text(), flags=re.M)
    return [name.replace('\\"', '"') for name in names]


def test_every_readme_command_has_a_tour_step():
    steps = tour_step_names()
    missing = [cmd for cmd in readme_commands() if not any(step == cmd or step.startswith(cmd + " (") for step in steps)]
    assert not missing, f"README commands the tour does not run: {missing}"


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
