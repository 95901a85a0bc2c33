"""A missing optional extra is one line naming the pip install, never a ModuleNotFoundError.

The module is made unimportable in a real subprocess (`sys.modules[name] = None`, which
is how Python reports a module that is not there), then the command that needs it runs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CASES = [
    ("torch", ["train", "parallel.nproc_per_node=1", "parallel.strategy=single"], "flopwise[train]"),
    ("numpy", ["train", "parallel.nproc_per_node=1", "parallel.strategy=single"], "flopwise[train]"),
    ("sklearn", ["compress", "--task", "digits-mlp", "--method", "int8-dynamic"], "flopwise[compress]"),
]


@pytest.mark.parametrize("module,argv,extra", CASES, ids=[c[0] for c in CASES])
def test_a_missing_extra_is_one_line_naming_the_install(module, argv, extra, tmp_path):
    script = f"import sys; sys.modules[{module!r}] = None\nfrom flopwise.cli import main\nmain(sys.argv[1:])"
    done = subprocess.run([sys.executable, "-c", script, *argv], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and f"pip install '{extra}'" in last, done.stderr[-2000:]
