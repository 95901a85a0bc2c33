"""Before step 1 the trainer prints the planner's forecast (step time, run time, memory per device,
whether it fits), and warns when a GPU-minded config runs on a CPU. A real one-process run."""

from __future__ import annotations

import re

from flopwise.config.loading import load_config
from flopwise.config.resolve import resolve_run
from flopwise.train.loop import run_training
from flopwise.train.parallel.distributed import init_distributed
from flopwise.train.run_forecast import forecast_line, gpu_config_on_cpu
from tests.train.test_loop import corpus, tiny_cfg  # noqa: F401


def test_a_run_prints_its_forecast_before_step_one(corpus, tmp_path, capsys):  # noqa: F811
    cfg = tiny_cfg(corpus, tmp_path, "training.max_steps=2", "training.eval_every=100", "training.eval_at_start=true")
    run_training(cfg, init_distributed(cfg.parallel))
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("forecast on "))
    assert re.search(r"step [\d.e-]+ s, run .+ \(2 steps\); memory [\d.,]+ of [\d.,]+ GiB per device: fits", line), line
    assert out.index("forecast on ") < out.index("step 0: val loss")  # before any step
    assert "no GPU found" not in out  # fp32, no nccl, a short run: nothing GPU-minded


def test_nothing_is_evaluated_before_step_one_unless_asked(corpus, tmp_path, capsys):  # noqa: F811
    cfg = tiny_cfg(corpus, tmp_path, "training.max_steps=2", "training.eval_every=100")
    result = run_training(cfg, init_distributed(cfg.parallel))
    out = capsys.readouterr().out
    assert "step 0: val loss" not in out and [step for step, _ in result.val_losses] == [2]  # the last step only


def test_no_plan_no_line_and_a_plan_that_does_not_fit_says_so():
    assert forecast_line(None, "x") is None
    from flopwise.plan.planner import build_runspec, plan

    full = plan(build_runspec(model="llama2-7b", hardware="rtx4090", gpus=1, tokens="1e8"))  # 16 B/param: no
    line = forecast_line(full, "RTX 4090")
    assert re.fullmatch(r"forecast on RTX 4090: step [\d.e+]+ s, run .+ \([\d,]+ steps\); memory [\d,.]+ of "
                        r"2[0-9]\.\d GiB per device: DOES NOT FIT(; expected error ±\d+ %)?", line), line
    assert not full.fits and full.memory.total_bytes > full.memory.capacity_bytes


def test_a_gpu_config_on_a_cpu_is_warned_about_and_not_on_a_gpu():
    cfg = load_config(None, ["precision.mode=bf16", "parallel.backend=nccl"])
    warning = gpu_config_on_cpu(cfg, resolve_run(cfg).precision, "cpu", 7200.0)
    assert warning.startswith("warning: no GPU found") and "parallel.backend=nccl" in warning
    assert "precision.mode=bf16" in warning and "a forecast of 2.0 h" in warning
    assert gpu_config_on_cpu(cfg, resolve_run(cfg).precision, "cuda", None) is None
    default = load_config(None, [])
    assert gpu_config_on_cpu(default, resolve_run(default).precision, "cpu", 60.0) is None
