"""config/resolve.py: launcher, planner and trainer read one ResolvedRun and agree on what a config runs.

For every training config in configs/ (fine-tuning recipes included) and a grid of overrides:
the processes the launcher starts (in-process, or torchrun's `--nproc-per-node` on every node),
the layout the planner plans (`plan --config` and `plan.json` share `planned_config`) and the
values a trainer rank resolves for the world it joined are the same processes, mesh, grad
accumulation and precision; a config one of them refuses, the others refuse too. A config that
leaves `parallel.strategy` unset is first settled the way each of them settles it (the
launcher for its device, `plan --config` for `--hardware`), on a device where a whole replica
fits and on one where it does not.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from flopwise.catalog.hardware import get_hardware
from flopwise.config.loading import load_config
from flopwise.config.resolve import resolve_run
from flopwise.errors import UserError
from flopwise.plan.default_strategy import memory_only_hardware, settle_strategy
from flopwise.plan.from_config import planned_config

ROOT = Path(__file__).resolve().parents[2]
TRAINING_CONFIGS = sorted(p for p in (ROOT / "configs").rglob("*.yaml") if not p.name.startswith("compress_"))
GRID = [
    [f"parallel.strategy={strategy}", f"parallel.nproc_per_node={nproc}", f"parallel.nnodes={nodes}", *extra]
    for strategy, nproc, nodes, extra in itertools.product(
        ("null", "single", "ddp", "fsdp", "deepspeed", "pipeline"), (1, 2, 4), (1, 2),
        ([], ["parallel.tp=2"], ["parallel.dp_replicate=2"], ["training.global_batch_size=64"],
         ["parallel.pipeline_microbatches=2", "training.micro_batch_size=2"], ["precision.mode=fp16"],
         ["parallel.pp=2"]),
    )
]
H100 = get_hardware("h100-sxm")
DEVICES = {"roomy": 2.0**40, "tight": 2.0**20}  # bytes per process: a whole replica fits / does not


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """A pretrained model folder as the fine-tuning recipes name one: its config.json is all they read here."""
    folder = tmp_path_factory.mktemp("pretrained")
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256,
        "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
        "vocab_size": 1024, "max_position_embeddings": 4096, "tie_word_embeddings": False}))
    return folder


def settled(cfg, memory_bytes: float, monkeypatch):
    """`cfg` with `parallel.strategy` chosen by the launcher on a CPU with `memory_bytes` per process,
    after checking that `plan --config` chooses the same for that device."""
    from flopwise.train.launch import strategy_choice

    device = memory_only_hardware("cpu", memory_bytes, "test CPU")
    monkeypatch.setattr(strategy_choice, "this_device", lambda cfg, per_node: (device, "cpu"))
    launched, planned = cfg.model_copy(deep=True), cfg.model_copy(deep=True)
    strategy_choice.settle_for_this_device(launched)  # what `flopwise train` does before anything else
    settle_strategy(planned, device, "cpu")  # what `flopwise plan --config --hardware` does
    assert launched.parallel.strategy == planned.parallel.strategy is not None
    return launched


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
    # the planner's word for pure 16-bit training (no fp32 master copy) is `<dtype>-true`
    assert planned.workload.precision.removesuffix("-true") == run.precision.compute_dtype
    assert planned.workload.precision.endswith("-true") == run.precision.pure
    if cfg.parallel.strategy == "single":
        assert run.processes == 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("path", TRAINING_CONFIGS, ids=lambda p: p.relative_to(ROOT / "configs").as_posix())
def test_every_shipped_config_resolves_alike_for_launcher_planner_and_trainer(path, device, hf_folder,
                                                                              monkeypatch):
    cfg = load_config(path, [f"model.pretrained={hf_folder}"] if "finetune" in path.parts else [])
    agree(settled(cfg, DEVICES[device], monkeypatch))


def test_the_shipped_configs_include_the_fine_tuning_recipes_and_an_unset_strategy():
    names = {p.relative_to(ROOT / "configs").as_posix() for p in TRAINING_CONFIGS}
    assert "default.yaml" in names and {"finetune/small-full.yaml", "finetune/chat-lora.yaml"} <= names
    assert load_config(ROOT / "configs" / "default.yaml", []).parallel.strategy is None


def test_an_unset_strategy_is_settled_by_the_device_before_anyone_resolves_it(monkeypatch):
    default = load_config(ROOT / "configs" / "default.yaml", [])
    assert settled(default, DEVICES["roomy"], monkeypatch).parallel.strategy == "ddp"
    assert settled(default, DEVICES["tight"], monkeypatch).parallel.strategy == "fsdp"
    staged = load_config(None, ["parallel.pp=2", "parallel.nproc_per_node=2", "parallel.pipeline_microbatches=4"])
    run = resolve_run(settled(staged, DEVICES["roomy"], monkeypatch))
    assert (run.mesh.pp, run.micro_batches_per_pass) == (2, 4)  # planned and run as the pipeline it becomes


def test_a_grid_of_overrides_resolves_alike_or_is_refused_by_all(monkeypatch):
    agreed = refused = 0
    for overrides in GRID:
        try:
            cfg = load_config(None, overrides)
        except UserError:
            continue  # the schema refuses it before anyone resolves it
        from flopwise.train.parallel.parallelize import check_strategy

        if cfg.parallel.strategy is None:
            cfg = settled(cfg, DEVICES["roomy"], monkeypatch)
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
