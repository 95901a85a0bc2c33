"""Tables at 80 columns (CI logs, piped output): nothing squeezed to zero width, no key cut."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from flopwise.catalog.hardware import load_hardware
from tests.diagnose.synthetic_runs import write_run_dir

ENV = {**os.environ, "COLUMNS": "80", "OMP_NUM_THREADS": "1"}


def flopwise(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "flopwise", *args], capture_output=True, text=True, env=ENV,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def assert_fits_80_columns(out: str) -> None:
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "…" not in out, "a cell was truncated"


def test_hardware_shows_every_catalog_key_whole():
    out = flopwise("hardware")
    assert_fits_80_columns(out)
    keys_in_rows = {line.split()[0] for line in out.splitlines() if line.strip()}
    assert set(load_hardware()) <= keys_in_rows


def test_diagnose_shows_every_rank_and_its_tokens_per_second(tmp_path):
    run_dir = write_run_dir(tmp_path / "run", ranks=8, straggler=(5, 0.35))
    out = flopwise("diagnose", str(run_dir))
    assert_fits_80_columns(out)
    rows = [line.split() for line in out.splitlines() if re.match(r"^\s*\d+\s+\d", line)]
    assert sorted({int(r[0]) for r in rows}) == list(range(8))
    assert all(re.fullmatch(r"[\d,]+|n/a", r[-1]) for r in rows), "the tokens/s column is there on every row"
    assert "rank 5" in out


def test_plan_and_its_layout_search_fit():
    assert_fits_80_columns(flopwise("plan"))
    out = flopwise("plan", "--model", "gpt3-175b", "--hardware", "a100-80gb", "--gpus", "1024", "--global-batch",
                   "1536", "--tokens", "300B", "--search", "--top", "5")
    table_lines = [line for line in out.splitlines() if re.match(r"^\s*[1-5]\s+\S", line)]
    assert sorted({line.split()[0] for line in table_lines}) == ["1", "2", "3", "4", "5"]
    assert "…" not in out


def test_compare_names_every_device_it_compared():
    out = flopwise("compare", "--model", "llama2-7b", "--tokens", "1T", "--gpus", "64")
    assert "…" not in out
    for key in load_hardware():
        assert re.search(rf"^ ?{re.escape(key)}\b", out, re.M), key
