"""flopwise report: report.md with findings and tables, and readable PNG figures."""

import matplotlib.image
import pytest
from tests.diagnose.synthetic_runs import write_run_dir

from flopwise.cli import main
from flopwise.diagnose.analyze import diagnose
from flopwise.report.run_report import write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_report_writes_markdown_and_four_plots(tmp_path):
    run_dir = write_run_dir(tmp_path / "run", ranks=2, straggler=(1, 0.35), stall=(0, [20, 21], 0.5))
    files = write_report(run_dir, diagnose)
    assert files.report == run_dir / "report.md"
    assert sorted(p.name for p in files.plots) == ["loss.png", "memory.png", "step_breakdown.png", "tokens_per_second.png"]
    for png in files.plots:
        assert png.read_bytes()[:8] == PNG_MAGIC
        height, width, _ = matplotlib.image.imread(png).shape
        assert width >= 500 and height >= 300
    text = files.report.read_text()
    for section in ("## Findings", "## Step time per rank", "## Predicted vs measured", "## Figures"):
        assert section in text
    assert "`straggler` (rank 1)" in text and "`data_stall` (rank 0)" in text
    assert "![Loss](plots/loss.png)" in text
    assert "| memory_bytes.activations | 9.5 MiB | 11.4 MiB | 1.20 |" in text
    assert "| step_seconds | 0.15 | 0.12 | 0.80 |" in text


def test_report_without_plan_or_validation_still_plots_measured_memory(tmp_path):
    run_dir = write_run_dir(tmp_path / "run", ranks=2, val_every=0, plan_step_seconds=None)
    files = write_report(run_dir, diagnose)
    assert (run_dir / "plots" / "memory.png") in files.plots
    text = files.report.read_text()
    assert "## Predicted vs measured" not in text and "No problems found" in text


def test_report_cli_prints_where_it_wrote(tmp_path, capsys):
    run_dir = write_run_dir(tmp_path / "run", ranks=1, steps=12)
    with pytest.raises(SystemExit) as exit_info:
        main(["report", str(run_dir)])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert f"wrote {run_dir / 'report.md'}" in out and "step_breakdown.png" in out


def test_report_on_a_missing_run_dir_is_one_line_and_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["report", str(tmp_path / "nope")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "does not exist" in err
