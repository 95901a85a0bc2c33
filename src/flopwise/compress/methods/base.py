"""What every compression method is: the `Method` protocol, and the `Job` the command hands it.

A method is one file in this package holding one object that satisfies `Method`; the
registry (`methods/__init__.py`) lists it once, and `flopwise compress` runs whatever the
registry returns for `--method` (compress/commands.py has no per-method code). Two flows
implement the protocol: `ModelMethod` (a task's torch network: PT2E / torch.ao INT8, QAT,
pruning, 2:4; `methods/model_flow.py`) and `LLMQuantMethod` (an HF causal-LM folder in, a
smaller one out; `methods/llm_flow.py`). No torch here: the registry is read by the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, runtime_checkable

from flopwise.compress.result import CompressResult

FLOWS = ("model", "llm")


def _silent(line: str) -> None:
    """No progress lines."""


@dataclass(frozen=True)
class Job:
    """One compression asked for: the checked settings, where the model comes from, where it goes."""

    cfg: Any  # a compress.config.CompressConfig (not imported here: config reads this package's names)
    source: str | Path  # a built-in task name, a run directory, or a model file
    out: Path
    latency_batch: int = 1  # the batch of the timed calls, as the method's `timed_batch` resolved it
    trust_remote_code: bool = False
    accept_run: bool = False
    progress: Callable[[str], None] = _silent  # hears each phase as it starts


@runtime_checkable
class Method(Protocol):
    """A compression method: its name, what it accepts, its checks, and one entry that runs it."""

    name: str  # the `--method` / `compress.method` value
    flow: str  # what it accepts: "model" (a task's network) or "llm" (an HF causal-LM folder)
    summary: str  # one line for people

    def check(self, cfg: Any, where: str) -> None:
        """Raise a UserError naming `where` for settings this method cannot run with (before any work)."""

    def timed_batch(self, cfg: Any, given: int | None) -> int:
        """The batch of the timed calls, from `--latency-batch` (None when not given) and the settings."""

    def run(self, job: Job) -> CompressResult:
        """Compress, save in `job.out`, measure before and after, and return the result."""
