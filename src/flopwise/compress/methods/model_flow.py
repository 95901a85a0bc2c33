"""The "model" flow's method: a task's torch network in, a compressed network out.

Each method file of this flow holds one `ModelMethod`: what it does to a copy of the model
(`apply`), plus the few facts the run needs about it (does it quantize to INT8, which PT2E
flow, which sparsity layout). `compress/model_run.py` measures the float model, applies the
method, saves, measures again and reports, the same way for every method.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

from flopwise.compress.methods.base import Job
from flopwise.compress.result import CompressResult
from flopwise.errors import UserError

PRUNE_BACKEND = "torch.nn.utils.prune"  # what sparsifies the weights, named where a backend is reported


@dataclass(frozen=True)
class ModelMethod:
    """One compression of a task's network.

    `apply(task, cfg, backend)` compresses a copy of `task.model` and returns it with the method's
    details (they go to the record as they are).
    """

    name: str
    summary: str
    apply: Callable[..., tuple[object, dict]]
    # INT8 quantization: picks a backend, is measured against a compiled fp32 baseline, and runs compiled
    quantizes: bool = False
    pt2e_only: bool = False  # runs on the PT2E flow only (static calibration, QAT)
    # compressed-tensors `sparsity_structure` of the saved weights ("unstructured", "2:4"); None: not sparse
    sparsity_structure: str | None = None
    # (compiled-or-not runnable model) -> names of the layers moved to a faster sparse format
    accelerate: Callable[[object], list] | None = None
    # (task, fp32 eager measurement, compressed measurement, details) -> figures added to the summary
    extra_summary: Callable[[object, dict, dict, dict], dict] | None = None
    # (cfg, where) -> None: this method's own refusals (UserError), besides the backend rule
    refuse: Callable[[object, str], None] | None = None
    flow: str = "model"

    def check(self, cfg, where: str) -> None:
        """Settings this method cannot run with, caught before any training."""
        if self.refuse is not None:
            self.refuse(cfg, where)
        if self.pt2e_only and cfg.backend in ("torchao", "eager"):
            raise UserError(f"{where}: compress.backend: {self.name} runs on the PT2E flow only (allowed: auto, pt2e-x86)")

    def backend(self, cfg) -> str:
        """The backend that will run, checked against the method."""
        if not self.quantizes:
            return PRUNE_BACKEND
        from flopwise.compress.quantize import default_backend

        backend = default_backend(self.name) if cfg.backend == "auto" else cfg.backend
        if self.pt2e_only and backend != "pt2e-x86":
            raise UserError(f"compress.backend: {self.name} runs on the PT2E flow only (allowed: auto, pt2e-x86; got {backend})")
        return backend

    def timed_batch(self, cfg, given: int | None) -> int:
        """Batch 1 is always timed; `compress.latency_batch` (>= 2) is the second, larger batch."""
        if given == 1:
            raise UserError("--latency-batch 1: batch 1 is always measured for this method; "
                            "--latency-batch sets the second, larger batch (>= 2)")
        return cfg.latency_batch

    def run(self, job: Job) -> CompressResult:
        """Build the task, compress it into `job.out`, write the report files (compress/model_run.py)."""
        from flopwise.compress.model_run import run_job

        return run_job(self, job)


def int8_start(task, cfg, backend: str) -> tuple[object, object, list, dict]:
    """What every INT8 method starts from: a copy of the model in eval mode, an example input,
    the calibration inputs (seeded), and the details every INT8 record holds."""
    model = copy.deepcopy(task.model).eval()
    example = task.make_input(cfg.batch_size)
    batches = task.train_batches(cfg.batch_size, 123)
    calibration = [next(batches)[0] for _ in range(cfg.calib_batches)]
    details = {"backend": backend, "per_channel": cfg.per_channel, "weight_bits": cfg.weight_bits}
    return model, example, calibration, details


def finetune_with_masks(model, task, cfg, before_step=None) -> None:
    """Fine-tune a masked model for `compress.finetune_steps` (masks keep pruned weights at zero)."""
    from flopwise.compress.finetune import finetune

    finetune(model.train(), task, cfg.finetune_steps, cfg.lr, cfg.batch_size, before_step=before_step)
