"""meter_schedule.py: the steps the meters run on, and a sampled run's figures against an every-step run's."""

from __future__ import annotations

import json

import pytest

from flopwise.errors import UserError
from flopwise.config.loading import load_config
from flopwise.runrecord.run_dir import RunDir
from flopwise.train.loop import run_training
from flopwise.train.meter_schedule import STEPS_AT_START, MeterSchedule
from tests.train.test_loop import corpus, single_env, tiny_cfg  # noqa: F401  (fixtures)

MEMORY = ("memory_parameters_bytes", "memory_gradients_bytes", "memory_optimizer_bytes",
          "memory_saved_activations_bytes")


def metered(schedule: MeterSchedule) -> list[int]:
    return [step for step in range(schedule.first_step + 1, schedule.max_steps + 1) if schedule.due(step)]


def test_the_first_steps_then_every_nth_and_the_last():
    assert STEPS_AT_START == 5
    assert metered(MeterSchedule(first_step=0, every=10, max_steps=35)) == [1, 2, 3, 4, 5, 10, 20, 30, 35]
    # a resume from step 12 meters its own first steps again
    assert metered(MeterSchedule(first_step=12, every=10, max_steps=35)) == [13, 14, 15, 16, 17, 20, 30, 35]
    assert metered(MeterSchedule(first_step=0, every=1, max_steps=8)) == list(range(1, 9))
    assert metered(MeterSchedule(first_step=0, every=20, max_steps=3)) == [1, 2, 3]


def test_the_header_line_says_which_steps_and_why():
    line = MeterSchedule(first_step=0, every=20, max_steps=150).header_line()
    assert "every 20th" in line and "training.measure_every=20" in line and "cost" in line
    assert "every step" in MeterSchedule(first_step=0, every=1, max_steps=150).header_line()


def test_measure_every_is_a_positive_step_count():
    assert load_config(None, []).training.measure_every == 20
    with pytest.raises(UserError, match="measure_every"):
        load_config(None, ["training.measure_every=0"])


def _run(corpus, tmp_path, name, every):
    cfg = tiny_cfg(corpus, tmp_path, "training.max_steps=11", "training.eval_every=100",
                   f"training.measure_every={every}", f"logging.run_dir={tmp_path / name}")
    run_training(cfg, single_env(cfg))
    rows = [json.loads(line) for line in (tmp_path / name / "metrics.rank0.jsonl").read_text().splitlines()]
    return rows, json.loads(RunDir(tmp_path / name).comparison.read_text())


def test_a_sampled_run_measures_on_its_steps_and_records_the_every_step_figures(corpus, tmp_path, capsys):
    sampled, sampled_pvm = _run(corpus, tmp_path, "sampled", 4)
    assert "every 4th" in capsys.readouterr().out
    every, every_pvm = _run(corpus, tmp_path, "every", 1)
    assert [r["step"] for r in sampled] == [r["step"] for r in every] == list(range(1, 12))
    assert [r["step"] for r in sampled if all(k in r for k in MEMORY)] == [1, 2, 3, 4, 5, 8, 11]
    assert not any(k in r for r in sampled if r["step"] in (6, 7, 9, 10) for k in MEMORY)
    assert all(all(k in r for k in MEMORY) for r in every)
    assert sampled[0]["memory_saved_activations_bytes"] > 0
    for row in sampled:  # what a sampled step reads is what the every-step run read on that step
        if "memory_optimizer_bytes" in row:
            assert {k: row[k] for k in MEMORY} == {k: every[row["step"] - 1][k] for k in MEMORY}
    # the saved-tensor peak is the same on every step of a fixed-shape run
    assert len({r["memory_saved_activations_bytes"] for r in every}) == 1
    assert sampled_pvm["measured"]["memory_bytes"] == every_pvm["measured"]["memory_bytes"]
    assert sampled_pvm["predicted"]["memory_bytes"] == every_pvm["predicted"]["memory_bytes"]


def test_a_resumed_run_meters_its_own_first_steps_again(corpus, tmp_path):
    def train(steps):
        cfg = tiny_cfg(corpus, tmp_path, f"training.max_steps={steps}", "training.eval_every=100",
                       "training.measure_every=10")
        run_training(cfg, single_env(cfg))

    train(6)  # a fresh run: steps 1-6, checkpoint at the end
    train(14)  # resumed from step 6 (training.max_steps may change on a resume)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.rank0.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 15))
    assert [r["step"] for r in rows if all(k in r for k in MEMORY)] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 14]
    assert len({r["memory_saved_activations_bytes"] for r in rows if "memory_saved_activations_bytes" in r}) == 1
