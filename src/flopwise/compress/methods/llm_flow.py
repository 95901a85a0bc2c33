"""The "llm" flow's method: a torchao weight quantization of an HF causal-LM folder.

Each method file of this flow holds one `LLMQuantMethod`; `compress/llm.py` loads the run's
HF export quantized, saves the folder transformers loads, and measures before and after.
Kept apart from the registry so method files need not import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from flopwise.compress.methods.base import Job
from flopwise.compress.result import CompressResult
from flopwise.errors import UserError


@dataclass(frozen=True)
class LLMQuantMethod:
    """A torchao weight quantization that transformers can save and load.

    `torchao_config(device_type)` returns the torchao config for that device ("cpu"/"cuda");
    `note(device_type)` says what the device gets when it differs from the name (or "").
    """

    name: str
    summary: str
    torchao_config: Callable[[str], object]
    note: Callable[[str], str] = lambda device_type: ""
    # inputs per scale group on that device (None: not grouped); linears whose input width is not a
    # multiple of it are left in float (`compress/llm.py: ungroupable_linears`)
    group_size: Callable[[str], int | None] = lambda device_type: None
    flow: str = "llm"

    def check(self, cfg, where: str) -> None:
        """Only a trained causal LM (a run directory) can be quantized this way."""
        if cfg.task not in (None, "lm"):
            raise UserError(f"{where}: compress.method: {cfg.method} compresses a trained causal LM (a run directory), "
                            f"not the {cfg.task} task")

    def timed_batch(self, cfg, given: int | None) -> int:
        """Generation is timed at one batch: `--latency-batch`, else `compress.latency_batch` when set, else 1."""
        return given or (cfg.latency_batch if "latency_batch" in cfg.model_fields_set else 1)

    def run(self, job: Job) -> CompressResult:
        """Quantize the run's HF export into `job.out` and measure both (compress/llm.py)."""
        from flopwise.compress.llm import compress_llm_run, llm_result

        record = compress_llm_run(self, Path(job.source), job.cfg, job.out, latency_batch=job.latency_batch,
                                  new_tokens=job.cfg.new_tokens, report=job.progress,
                                  trust_remote_code=job.trust_remote_code, accept_run=job.accept_run)
        return llm_result(record, job.out)
