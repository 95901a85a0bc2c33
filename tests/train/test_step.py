"""step.py: the one train_step, and the hooks around it (real torch, a tiny model, one process)."""

from __future__ import annotations

import torch

from flopwise.train.data.prepare import prepare_data
from flopwise.train.loop import build_state
from flopwise.train.step import StepHooks, train_step
from flopwise.train.parallel.strategy_torch import TorchStrategy
from tests.train.test_loop import corpus, single_env, tiny_cfg  # noqa: F401  (fixtures)


def _state(corpus, tmp_path, *extra):
    cfg = tiny_cfg(corpus, tmp_path, *extra)
    env = single_env(cfg)
    return build_state(cfg, env, prepare_data(cfg.data)), env


def test_meters_and_injections_are_hooks_that_leave_the_numbers_alone(corpus, tmp_path):
    calls = []
    measured, env = _state(corpus, tmp_path)
    plain, _ = _state(corpus, tmp_path)
    assert isinstance(measured.strategy, TorchStrategy)
    try:
        hooks = StepHooks(measure=True, before_final_forward=(lambda: calls.append(measured.step),))
        with_meters = [train_step(measured, env, 2, hooks) for _ in range(2)]
        without = [train_step(plain, env, 2, StepHooks(measure=False)) for _ in range(2)]
    finally:
        measured.train_loader.close()
        plain.train_loader.close()
    assert calls == [0, 1]  # once per optimizer step, before its last forward
    assert [r.loss for r in with_meters] == [r.loss for r in without]
    for a, b in zip(measured.built.module.parameters(), plain.built.module.parameters()):
        assert torch.equal(a, b)
    assert with_meters[-1].memory.saved_activations > 0 and with_meters[-1].memory.optimizer > 0
    assert without[-1].memory is None  # not measured: no figures, rather than zeros
    assert without[-1].sync_wait_seconds is None  # one process: nothing to wait for
    assert measured.step == plain.step == 2


def test_one_timing_covers_the_whole_step(corpus, tmp_path):
    state, env = _state(corpus, tmp_path)
    try:
        result = train_step(state, env, 3)
    finally:
        state.train_loader.close()
    parts = result.data_seconds + result.compute_seconds + result.optimizer_seconds
    assert 0 < parts <= result.step_seconds
    assert result.lr == state.optimizer.param_groups[0]["initial_lr"] * 1 / 2  # warm-up step 1 of 2
