"""A run the machine cannot build is one line before any process starts (no run directory either)."""

from __future__ import annotations

import pytest

from flopwise.errors import UserError
from flopwise.config.loading import load_config
from flopwise.config.resolve import resolve_run
from flopwise.train.launch.machine_fit import check_fits_this_machine, machine_memory_bytes, parameter_count
from flopwise.train.launch.start import launch


def test_a_model_too_large_for_this_machine_is_refused_before_anything_starts(tmp_path):
    total = machine_memory_bytes()
    if total is None:
        pytest.skip("the OS does not report its memory")
    layers = total // (4 * 4 * 4096 * 4096) + 1  # 4 bytes x (2h^2 + 2h*2h) per layer at h = 4096
    cfg = load_config(None, ["model.hidden=4096", "model.n_heads=32", f"model.n_layers={layers}",
                             "parallel.nproc_per_node=1", "parallel.strategy=single",
                             f"logging.run_dir={tmp_path / 'run'}"])
    with pytest.raises(UserError) as err:
        launch(cfg)
    assert "\n" not in str(err.value) and "more than its" in str(err.value)
    assert not (tmp_path / "run").exists()


def test_the_default_run_fits_and_the_count_is_the_built_models():
    cfg = load_config(None, [])
    check_fits_this_machine(cfg, resolve_run(cfg))
    from flopwise.train.model import build_model

    real = sum(p.numel() for p in build_model(cfg.model, cfg.data.vocab_size).parameters())
    assert parameter_count(cfg) == real


def test_more_processes_than_a_cpu_machine_can_host_are_refused(tmp_path):
    import os

    import torch

    if torch.cuda.is_available():
        pytest.skip("the process limit applies to machines without CUDA")
    too_many = 8 * (os.cpu_count() or 1) + 1
    cfg = load_config(None, [f"parallel.nproc_per_node={too_many}", f"logging.run_dir={tmp_path / 'run'}"])
    with pytest.raises(UserError, match=f"parallel.nproc_per_node: {too_many} processes"):
        launch(cfg)
    assert not (tmp_path / "run").exists()
