"""`compress_task(task, cfg, out)`: the library entry to a "model" method, named by `cfg.method`.

The command line goes through the registry's `Method.run`; scripts and tests that hold a
`Task` already (benchmarks/compress.py) call this. The run itself is `model_run.py`.
"""

from __future__ import annotations

from pathlib import Path

from flopwise.compress.methods import get_method
from flopwise.compress.model_run import compress_with
from flopwise.errors import UserError


def compress_task(task, cfg, out: Path, progress=None) -> dict:
    """Run the method `cfg.method` on `task`, save the result in `out`, and return before/after measurements."""
    method = get_method(cfg.method)
    if method.flow != "model":
        raise UserError(f"compress.method: {method.name} compresses an HF causal-LM folder, not a task's network")
    return compress_with(method, task, cfg, out, progress=progress)
