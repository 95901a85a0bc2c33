"""report.html of a real short run (2 gloo ranks), opened in headless Chromium.

Skipped, with the reason, where no chromium is installed (Debian: `apt-get install chromium`;
.ci/run installs it when it can).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.report.headless_chromium import chromium_binary, open_page


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("html")
    run_dir = root / "run"
    overrides = [
        "model.n_layers=2", "model.hidden=64", "model.n_heads=4", "model.max_seq_len=64", "data.seq_len=64",
        "data.vocab_size=512", "data.max_bytes=300000", f"data.cache_dir={root / 'cache'}",
        "training.max_steps=10", "training.warmup_steps=2", "training.micro_batch_size=4", "training.eval_every=5",
        "training.eval_at_start=true", "parallel.nproc_per_node=2", "parallel.strategy=ddp", f"logging.run_dir={run_dir}", "logging.progress=false",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID")}
    env["OMP_NUM_THREADS"] = "1"
    train = subprocess.run([sys.executable, "-m", "flopwise", "train", *overrides], capture_output=True, text=True,
                           env=env, timeout=900)
    assert train.returncode == 0, train.stderr[-2000:]
    report = subprocess.run([sys.executable, "-m", "flopwise", "report", str(run_dir)], capture_output=True,
                            text=True, env=env, timeout=300)
    assert report.returncode == 0, report.stderr
    return run_dir


@pytest.mark.slow
@pytest.mark.distributed
def test_report_html_is_one_self_contained_page(real_run):
    page = (real_run / "report.html").read_text()
    assert len(re.findall(r'<img src="data:image/png;base64,', page)) == 4
    assert not re.search(r'(src|href)="(https?:)?//', page), "the page loads nothing from the network"
    assert "<script" not in page
    for section in ("Findings", "Figures", "Step time per rank", "Predicted vs measured", "Config", "Environment"):
        assert f"<h2>{section}</h2>" in page
    assert "strategy: ddp" in page  # the config
    assert "<td>torch</td>" in page and "<td>world_size</td><td>2</td>" in page  # the environment
    assert re.search(r"validation loss \(held-out batches\)</td><td>[\d.]+ at step 0,", page)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.skipif(chromium_binary() is None, reason="no chromium on PATH (Debian: apt-get install chromium)")
def test_report_html_renders_in_chromium_without_errors_and_every_plot_shows(real_run, tmp_path):
    shown = open_page(real_run / "report.html")
    assert shown.errors == []
    assert [i["alt"] for i in shown.images] == ["Loss", "Throughput per rank", "Step time breakdown", "Memory"]
    for image in shown.images:
        assert image["complete"] and image["natural_width"] > 0 and image["natural_height"] > 0, image
        assert image["width"] > 100 and image["height"] > 100, image
    assert shown.screenshot_png[:8] == b"\x89PNG\r\n\x1a\n"
