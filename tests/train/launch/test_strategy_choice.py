"""train/launch/strategy_choice.py: the default strategy on this machine, and a resume keeping the recorded one."""

from __future__ import annotations

from pathlib import Path

from flopwise.config.loading import dump_config, load_config
from flopwise.train.launch.strategy_choice import settle_for_this_device

DEFAULT = Path(__file__).resolve().parents[3] / "configs" / "default.yaml"


def test_this_cpu_runs_the_default_config_as_ddp_and_writes_it_into_the_config(tmp_path):
    cfg = load_config(DEFAULT, [f"logging.run_dir={tmp_path / 'run'}"])
    choice = settle_for_this_device(cfg)
    assert choice.strategy == "ddp" and cfg.parallel.strategy == "ddp" and "gloo on a CPU" in choice.reason
    assert settle_for_this_device(cfg) is None  # set now: nothing left to choose
    assert settle_for_this_device(load_config(DEFAULT, [f"logging.run_dir={tmp_path}"]), processes=1).strategy == "single"


def test_a_resume_keeps_the_strategy_its_run_directory_was_trained_with(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    trained = load_config(DEFAULT, [f"logging.run_dir={run_dir}", "parallel.strategy=fsdp"])
    (run_dir / "config.yaml").write_text(dump_config(trained))
    again = load_config(DEFAULT, [f"logging.run_dir={run_dir}"])
    choice = settle_for_this_device(again)
    assert again.parallel.strategy == "fsdp" and "was trained with" in choice.reason
    fresh = load_config(DEFAULT, [f"logging.run_dir={run_dir}", "checkpoint.resume=false"])
    assert settle_for_this_device(fresh).strategy == "ddp"  # not resuming: chosen for this machine
