"""config/resolve.py: launcher, planner and trainer read one ResolvedRun and agree on what a config runs.

For every training config in configs/ and a grid of overrides: the processes the launcher
starts (in-process, or torchrun's `--nproc-per-node` on every node), the layout the planner
plans (`plan --config` and `plan.json` share `planned_config`) and the values a trainer rank
resolves for the world it joined are the same processes, mesh, grad accumulation and
precision; a config one of them refuses, the others refuse too.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest

from flopwise.catalog.hardware import get_hardware
from flopwise.config.loading import load_config
from flopwise.config.resolve import resolve_run
from flopwise.errors import UserError
from flopwise.plan.from_config import planned_config

ROOT = Path(__file__).resolve().parents[2]
TRAINING_CONFIGS = sorted(p for p in (ROOT / "configs").glob("*.yaml") if not p.name.startswith("compress_"))
GRID = [
    [f"parallel.strategy={strategy}", f"parallel.nproc_per_node={nproc}", f"parallel.nnodes={nodes}", *extra]
    for strategy, nproc, nodes, extra in itertools.product(
        ("single", "ddp", "fsdp", "deepspeed", "pipeline"), (1, 2, 4), (1, 2),
        ([], ["parallel.tp=2"], ["parallel.dp_replicate=2"], ["training.global_batch_size=64"],
         ["parallel.pipeline_microbatches=2", "training.micro_batch_size=2"], ["precision.mode=fp16"]),
    )
]
H100 = get_hardware("h100-sxm")


def launcher_processes(cfg, run) -> int:
    """What `flopwise train` starts: one process in place, else torchrun's --nproc-per-node on each node."""
    from flopwise.train.launch.start import torchrun_args

    if run.processes == 1:
        return 1
    nproc = int(next(a for a in torchrun_args(cfg, Path("run.yaml")) if a.startswith("--nproc-per-node="))
                .split("=")[1])
    return nproc * cfg.parallel.nnodes


def agree(cfg) -> None:
    run = resolve_run(cfg)
    planned = planned_config(cfg, run)
    lay = planned.layout
    trainer = resolve_run(cfg, processes=launcher_processes(cfg, run))  # what each rank resolves
    assert trainer == run
    assert launcher_processes(cfg, run) == run.processes == run.mesh.world_size
    assert (lay.pp, lay.dp, lay.tp, lay.dp_replicate) == (run.mesh.pp, run.mesh.dp, run.mesh.tp,
                                                          run.mesh.dp_replicate)
    assert lay.dp * lay.tp * lay.pp == run.processes
    assert lay.grad_accum == run.grad_accum * run.micro_batches_per_pass
    assert lay.global_batch_size == run.global_batch
    assert planned.workload.precision == run.precision.compute_dtype
    if cfg.parallel.strategy == "single":
        assert run.processes == 1


@pytest.mark.parametrize("path", TRAINING_CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_resolves_alike_for_launcher_planner_and_trainer(path):
    agree(load_config(path, []))


def test_a_grid_of_overrides_resolves_alike_or_is_refused_by_all():
    agreed = refused = 0
    for overrides in GRID:
        try:
            cfg = load_config(None, overrides)
        except UserError:
            continue  # the schema refuses it before anyone resolves it
        from flopwise.train.parallel.parallelize import check_strategy

        try:
            run = resolve_run(cfg)
        except UserError as err:
            refused += 1
            with pytest.raises(UserError):  # `plan --config` and the launcher refuse it too
                check_strategy(cfg.parallel)
                planned_config(cfg, resolve_run(cfg))
            assert "\n" not in str(err)
            continue
        check_strategy(cfg.parallel)
        agree(cfg)
        agreed += 1
        assert run.processes == (1 if cfg.parallel.strategy == "single"
                                 else cfg.parallel.nproc_per_node * cfg.parallel.nnodes)
    assert agreed > 50 and refused > 10  # the grid exercises both sides


def test_single_is_one_process_whatever_nproc_per_node_says():
    run = resolve_run(load_config(None, ["parallel.strategy=single"]))  # nproc_per_node stays at its default 2
    assert run.processes == run.processes_per_node == 1 and run.mesh.describe() == "single process"


def test_a_pipeline_pass_is_its_micro_batches():
    cfg = load_config(None, ["parallel.strategy=pipeline", "parallel.nproc_per_node=2",
                             "parallel.pipeline_microbatches=4", "training.micro_batch_size=2",
                             "training.global_batch_size=16"])
    run = resolve_run(cfg)
    assert (run.mesh.pp, run.mesh.dp, run.micro_batches_per_pass, run.grad_accum) == (2, 1, 4, 2)
    assert run.micro_batches_per_step == 8 and run.tokens_per_step == 16 * cfg.data.seq_len


def test_the_data_parallel_rank_skips_tensor_parallel_peers():
    run = resolve_run(load_config(None, ["parallel.nproc_per_node=4", "parallel.tp=2"]))
    assert [run.mesh.dp_rank_of(rank) for rank in range(4)] == [0, 0, 1, 1]


def test_the_config_package_imports_no_torch():
    code = ("import sys\nfrom flopwise.config.loading import load_config\nfrom flopwise.config.resolve import resolve_run\n"
            "resolve_run(load_config(None, []))\nassert 'torch' not in sys.modules, 'torch was imported'\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
