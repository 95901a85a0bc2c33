"""`RunDir`: one run directory, one property per entry.

Every module that reads or writes a run directory goes through this value, so the names of
its entries are spelled here and nowhere else (`tests/runrecord/test_run_dir.py` greps for
them). Torch-free.

    runs/<name>/
      config.yaml                  the resolved training config (written by `RunDir.write_config` only)
      plan.json                    the planner's prediction, before step 1 (`records.write_plan`)
      metrics.rank<R>.jsonl        one `StepRecord` per optimizer step, one file per rank
      predicted_vs_measured.json   a `Comparison`, at the end of the run
      environment.json             what the run ran on (`measure/environment.py`)
      tokenizer.json               the tokenizer the run trained with (read by export and generate)
      checkpoints/step-N/          see `train/checkpoint/store.py`
      run.lock                     one trainer per run directory (`train/launch/run_directory.py`)
      library.log, library.rank<R>.log   library warnings, shown with -v
      tensorboard/                 with `logging.tensorboard`
      export/                      `flopwise export` (model.safetensors, hf/)
      compressed/<method>/         `flopwise compress`
      report.md, report.html, plots/   `flopwise report`
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from flopwise.safe_write import write_file

CONFIG_FILE = "config.yaml"
PLAN_FILE = "plan.json"
COMPARISON_FILE = "predicted_vs_measured.json"
ENVIRONMENT_FILE = "environment.json"
TOKENIZER_FILE = "tokenizer.json"
CHECKPOINTS_DIR = "checkpoints"
LOCK_FILE = "run.lock"
TENSORBOARD_DIR = "tensorboard"
EXPORT_DIR = "export"
COMPRESSED_DIR = "compressed"
REPORT_FILE = "report.md"
REPORT_HTML_FILE = "report.html"
PLOTS_DIR = "plots"
SHARED_METRICS_FILE = "metrics.jsonl"  # read for runs of other tools that log one shared file
METRICS_PATTERN = "metrics.rank*.jsonl"
LIBRARY_LOG_PATTERN = "library*.log"


@dataclass(frozen=True)
class RunDir:
    """A run directory (`logging.run_dir`) and the path of each of its entries."""

    root: Path

    def __post_init__(self):
        object.__setattr__(self, "root", Path(self.root))

    @property
    def config(self) -> Path:
        return self.root / CONFIG_FILE

    @property
    def plan(self) -> Path:
        return self.root / PLAN_FILE

    @property
    def comparison(self) -> Path:
        return self.root / COMPARISON_FILE

    @property
    def environment(self) -> Path:
        return self.root / ENVIRONMENT_FILE

    @property
    def tokenizer(self) -> Path:
        return self.root / TOKENIZER_FILE

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS_DIR

    @property
    def lock(self) -> Path:
        return self.root / LOCK_FILE

    @property
    def tensorboard(self) -> Path:
        return self.root / TENSORBOARD_DIR

    @property
    def export(self) -> Path:
        return self.root / EXPORT_DIR

    @property
    def compressed(self) -> Path:
        return self.root / COMPRESSED_DIR

    @property
    def report(self) -> Path:
        return self.root / REPORT_FILE

    @property
    def report_html(self) -> Path:
        return self.root / REPORT_HTML_FILE

    @property
    def plots(self) -> Path:
        return self.root / PLOTS_DIR

    @property
    def shared_metrics(self) -> Path:
        return self.root / SHARED_METRICS_FILE

    def metrics(self, rank: int) -> Path:
        """`metrics.rank<R>.jsonl`: one file per rank needs no lock and never interleaves."""
        return self.root / f"metrics.rank{rank}.jsonl"

    def metrics_files(self) -> list[Path]:
        """Every rank's metrics file (and a shared `metrics.jsonl`, if another tool wrote one)."""
        shared = self.shared_metrics
        return sorted(self.root.glob(METRICS_PATTERN)) + ([shared] if shared.is_file() else [])

    def has_metrics(self) -> bool:
        """Whether any rank wrote a metrics file here."""
        return any(self.root.glob(METRICS_PATTERN))

    def library_log(self, rank: int) -> Path:
        """`library.log` (rank 0), `library.rank<R>.log` (the others)."""
        return self.root / ("library.log" if rank == 0 else f"library.rank{rank}.log")

    def library_logs(self) -> list[Path]:
        return sorted(self.root.glob(LIBRARY_LOG_PATTERN))

    def write_config(self, text: str) -> Path:
        """Write `config.yaml`, the run's resolved config: the one writer of that entry (atomic, no links)."""
        return write_file(self.config, text)
