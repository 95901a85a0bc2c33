"""plan/from_config.py: the one bridge from a training config to a RunSpec.

`flopwise plan --config` and the trainer's `plan.json` come from the same function; the
slow test below checks that on a real run of `configs/default.yaml`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flopwise.catalog.hardware import get_hardware
from flopwise.errors import UserError
from flopwise.config.resolve import batch_layout, processes_of, resolve_run
from flopwise.plan.from_config import notes_for, runspec_from_config
from flopwise.config.precision import precision_of
from flopwise.config.loading import load_config

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "configs" / "default.yaml"
H100 = get_hardware("h100-sxm")


def _spec(*overrides: str, world_size: int | None = None, hardware=H100, **kwargs):
    cfg = load_config(DEFAULT, list(overrides))
    return runspec_from_config(cfg, resolve_run(cfg, processes=world_size), hardware, **kwargs)


def test_the_default_config_is_two_processes_of_the_builtin_decoder():
    spec = _spec()
    assert spec.model.key == "builtin-llama" and spec.model.n_layers == 4 and spec.model.hidden == 192
    assert spec.model.vocab_size == 4096 and spec.workload.seq_len == 128
    assert (spec.layout.dp, spec.layout.pp, spec.layout.micro_batch_size, spec.layout.grad_accum) == (2, 1, 8, 1)
    assert spec.workload.total_tokens == 150 * 16 * 128
    assert spec.workload.precision == "fp32" and spec.workload.optimizer == "adamw"


def test_fsdp_and_every_k_checkpointing_are_planned_as_what_they_are():
    spec = _spec("parallel.strategy=fsdp", "training.gradient_checkpointing=2")
    assert spec.layout.framework == "fsdp" and spec.layout.zero_stage == 3  # FSDP2 full sharding
    assert spec.layout.recompute == "every:2"
    assert _spec("training.gradient_checkpointing=true").layout.recompute == "full"
    assert _spec().layout.recompute == "none"
    assert _spec("parallel.strategy=deepspeed").layout.framework == "deepspeed"
    # the planner counts what every-2 recompute re-runs: between none and every block
    from flopwise.plan.planner import plan

    hw = get_hardware("h100-sxm")
    times = [plan(_spec(f"training.gradient_checkpointing={k}", hardware=hw)).time for k in ("false", "2", "true")]
    assert times[0].step_seconds < times[1].step_seconds < times[2].step_seconds
    notes = " ".join(notes_for(load_config(DEFAULT, ["training.gradient_checkpointing=2"])))
    assert "every 2 blocks" not in notes and "ZeRO-3" not in notes


def test_training_compile_is_planned_with_the_compiled_saves():
    """`training.compile` reaches the layout, and the llama blocks' activations shrink to what
    inductor's partitioner saves (tests/plan/test_memory.py measures it); GPT-2 blocks do not change."""
    from flopwise.plan.planner import plan

    eager, compiled = (plan(_spec(f"training.compile={c}")) for c in ("false", "true"))
    assert compiled.spec.layout.compiled and not eager.spec.layout.compiled
    assert compiled.memory.activations < 0.9 * eager.memory.activations
    gpt2 = [plan(_spec("model.kind=gpt2", f"training.compile={c}")).memory.activations for c in ("false", "true")]
    assert gpt2[0] == gpt2[1]


def test_strategies_map_to_layouts():
    single = _spec("parallel.strategy=single", "parallel.nproc_per_node=1")
    assert single.layout.devices == 1 and single.layout.zero_stage == 0
    ddp = _spec("parallel.strategy=ddp", "parallel.nproc_per_node=4", "training.global_batch_size=64")
    assert (ddp.layout.dp, ddp.layout.zero_stage, ddp.layout.grad_accum) == (4, 0, 2)
    ds = _spec("parallel.strategy=deepspeed", "parallel.zero_stage=2", "parallel.offload=optimizer")
    assert (ds.layout.zero_stage, ds.layout.offload) == (2, "optimizer")
    pipe = _spec("parallel.strategy=pipeline", "parallel.pipeline_microbatches=4", "parallel.pipeline_schedule=gpipe")
    assert (pipe.layout.dp, pipe.layout.pp, pipe.layout.grad_accum) == (1, 2, 4)
    assert pipe.layout.pipeline_schedule == "gpipe" and pipe.layout.global_batch_size == 32
    assert _spec(world_size=8).layout.dp == 8
    assert _spec(vocab_size=1000).model.vocab_size == 1000


def test_precision_is_typed_once():
    assert precision_of("bf16-params") == precision_of("bf16-params")
    p = precision_of("fp16-params")
    assert (p.compute_dtype, p.param_dtype, p.loss_scaling) == ("fp16", "fp16", True)
    p = precision_of("bf16")
    assert (p.compute_dtype, p.param_dtype, p.loss_scaling) == ("bf16", "fp32", False)
    with pytest.raises(UserError, match="precision.mode='int4' is not one of"):
        precision_of("int4")
    assert _spec("precision.mode=bf16-params").workload.precision == "bf16"
    # pure bf16 keeps no fp32 master copy: planned as bf16-true, not as mixed bf16
    assert _spec("precision.mode=bf16-true").workload.precision == "bf16-true"


def test_batch_layout_refuses_a_global_batch_that_is_not_whole_passes():
    cfg = load_config(DEFAULT, ["training.global_batch_size=20"])
    with pytest.raises(UserError, match="training.global_batch_size: 20 is not a multiple"):
        batch_layout(cfg.training, processes_of(cfg.parallel))


def test_the_bridge_imports_no_torch():
    code = (
        "import sys\n"
        "from flopwise.catalog.hardware import get_hardware\n"
        "from flopwise.config.loading import load_config\n"
        "from flopwise.config.resolve import resolve_run\n"
        "from flopwise.plan.from_config import runspec_from_config\n"
        "from flopwise.plan.planner import plan\n"
        f"cfg = load_config({str(DEFAULT)!r}, [])\n"
        "plan(runspec_from_config(cfg, resolve_run(cfg), get_hardware('h100-sxm')))\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_plan_config_errors_are_one_line(tmp_path):
    result = _flopwise("plan", "--config", str(DEFAULT), "--dp", "4", cwd=tmp_path)
    assert result.returncode == 2 and "drop --dp" in result.stderr and "Traceback" not in result.stderr
    result = _flopwise("plan", "training.max_steps=3", cwd=tmp_path)
    assert result.returncode == 2 and "need --config" in result.stderr


def _flopwise(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID")}
    env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.run([sys.executable, "-m", "flopwise", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900)


def _hardware_free(plan: dict) -> dict:
    """The parts of a plan that do not depend on the device: inputs, parameters, FLOPs, memory by component."""
    inputs = {k: v for k, v in plan["inputs"].items() if k not in ("hardware", "cluster")}
    memory = {k: v for k, v in plan["memory"].items() if "capacity" not in k and k != "device_bytes"}
    return {"inputs": inputs, "params": plan["params"], "flops": plan["flops"], "memory": memory}


@pytest.mark.slow
@pytest.mark.distributed
def test_plan_config_predicts_what_train_writes_to_plan_json(tmp_path):
    overrides = ["training.max_steps=2", "training.eval_batches=1", "logging.progress=false",
                 f"logging.run_dir={tmp_path / 'run'}"]
    trained = _flopwise("train", str(DEFAULT), *overrides, cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    written = json.loads((tmp_path / "run" / "plan.json").read_text())

    planned = _flopwise("plan", "--config", str(DEFAULT), *overrides, "--json", cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr
    # The run's device is this CPU, with a measured peak; the plan's is the catalog default.
    # Everything that does not depend on the device is the same prediction.
    assert _hardware_free(json.loads(planned.stdout)) == _hardware_free(written)
    # parallel.strategy is unset: both chose DDP (a whole replica fits), said why, and the run recorded it
    assert "parallel.strategy: ddp (chosen: 2 processes" in trained.stdout
    assert "parallel.strategy: ddp (chosen: 2 processes" in planned.stderr
    assert written["inputs"]["layout"]["zero_stage"] == 0
    assert load_config(tmp_path / "run" / "config.yaml").parallel.strategy == "ddp"


def test_mesh_keys_become_the_planned_layout():
    tp = _spec("parallel.nproc_per_node=4", "parallel.tp=2", "parallel.sequence_parallel=true").layout
    assert (tp.dp, tp.tp, tp.sequence_parallel, tp.devices) == (2, 2, True, 4)
    hsdp = _spec("parallel.nproc_per_node=4", "parallel.dp_replicate=2").layout
    assert (hsdp.dp, hsdp.dp_replicate, hsdp.shard_group) == (4, 2, 2)
    assert _spec("parallel.strategy=fsdp", "parallel.offload=optimizer").layout.offload == "params"  # FSDP2 offloads all three together
    pipe = _spec("parallel.strategy=pipeline", "parallel.pipeline_schedule=looped-bfs",
                 "parallel.pipeline_virtual_stages=2").layout
    assert (pipe.pp, pipe.pipeline_schedule, pipe.virtual_stages, pipe.interleaved_variant) == (
        2, "interleaved", 2, "looped-bfs")


def test_plan_config_plans_a_pretrained_models_precision_for_the_named_gpu(tmp_path):
    """`precision.mode` unset on a pretrained model: the trainer computes in bf16 on a GPU that has it,
    so `plan --config --hardware rtx4090` plans bf16 and says so, whatever machine the planner runs on;
    a stated mode wins."""
    folder = tmp_path / "llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 688,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 512,
        "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}))
    (tmp_path / "text.jsonl").write_text('{"text": "hello"}\n')
    config = tmp_path / "lora.yaml"
    config.write_text(f"model:\n  kind: hf\n  pretrained: {folder}\ndata:\n  hf_dataset:\n    path: {tmp_path / 'text.jsonl'}\n"
                      "    text_field: text\nfinetune:\n  method: lora\n  rank: 8\n")
    planned = _flopwise("plan", "--config", str(config), "--hardware", "rtx4090", "--json", cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr
    assert json.loads(planned.stdout)["inputs"]["workload"]["precision"] == "bf16"
    assert "default: precision.mode=bf16: rtx4090" in planned.stderr
    stated = _flopwise("plan", "--config", str(config), "precision.mode=fp32", "--hardware", "rtx4090", "--json",
                       cwd=tmp_path)
    assert stated.returncode == 0, stated.stderr
    assert json.loads(stated.stdout)["inputs"]["workload"]["precision"] == "fp32"
    assert "precision.mode=bf16" not in stated.stderr
