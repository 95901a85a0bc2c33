"""A run typed in NeMo's or a table's own words: underscored flags, the GA column, NeMo's names."""

import json
import subprocess
import sys

import pytest

from flopwise.errors import UserError
from flopwise.plan.launcher_flags import dashed
from flopwise.plan.planner import build_runspec


def test_underscored_plan_flags_are_dashed_and_others_left():
    argv = ["--micro_batch_size", "1", "--tensor_parallel_size=2", "--compute_dtype", "fp8", "--not_a_flag", "x_y=1"]
    assert dashed(argv) == ["--micro-batch-size", "1", "--tensor-parallel-size=2", "--compute-dtype", "fp8",
                            "--not_a_flag", "x_y=1"]


def test_grad_accum_sets_the_global_batch_or_must_agree_with_it():
    spec = build_runspec(model="llama3-8b", gpus=16, tp=2, micro_batch=2, grad_accum=4)
    assert (spec.layout.dp, spec.layout.grad_accum, spec.layout.global_batch_size) == (8, 4, 64)
    assert build_runspec(model="llama3-8b", gpus=16, tp=2, micro_batch=2, grad_accum=4, global_batch=64) == spec
    with pytest.raises(UserError, match="= 64 sequences per step, but the global batch is 65"):
        build_runspec(model="llama3-8b", gpus=16, tp=2, micro_batch=2, grad_accum=4, global_batch=65)
    with pytest.raises(UserError, match="--grad-accum must be >= 1"):
        build_runspec(model="llama3-8b", grad_accum=0)


def test_a_nemo_command_line_plans_as_typed():
    """NeMo's scripts/performance flags (underscored, --gpu for the chip, --compute_dtype with --fp8_recipe)
    and a table's GA column plan the same layout as flopwise's own names, on both CLI paths."""
    nemo = ["--model", "llama3-70b", "--gpu", "h100", "--num_gpus", "64", "--tensor_parallel_size", "4",
            "--pipeline_parallel_size", "4", "--context_parallel_size", "2", "--virtual_pipeline_parallel_size", "5",
            "--micro_batch_size", "1", "--ga", "64", "--compute_dtype", "fp8", "--fp8_recipe", "cs", "--stack", "nemo",
            "--seq", "8192"]
    own = ["--model", "llama3-70b", "--hardware", "h100-sxm", "--gpus", "64", "--tp", "4", "--pp", "4", "--cp", "2",
           "--vp", "5", "--mbs", "1", "--gbs", "128", "--precision", "fp8", "--fp8-recipe", "tensorwise",
           "--stack", "nemo", "--seq", "8192"]

    def plan(args, *more):
        out = subprocess.run([sys.executable, "-m", "flopwise", "plan", *args, *more], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    assert json.loads(plan(nemo, "--json"))["layout"] == json.loads(plan(own, "--json"))["layout"]
    assert plan(nemo).splitlines()[:3] == plan(own).splitlines()[:3]


def test_search_refuses_grad_accum_in_one_line():
    out = subprocess.run([sys.executable, "-m", "flopwise", "plan", "--model", "llama3-8b", "--ga", "2", "--search"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.startswith("error: --search chooses the micro-batch")


@pytest.mark.parametrize(("argv", "expected"), [
    (["--sharding-strategy", "FULL_SHARD", "--activation-checkpointing", "true"],
     ["--recompute", "full", "--zero", "3"]),
    (["--fsdp_config_shard_strategy", "SHARD_GRAD_OP", "--fsdp_config_activation_checkpointing", "false"],
     ["--recompute", "none", "--zero", "2"]),
    (["--sharding_strategy=NO_SHARD"], ["--zero", "0"]),
])
def test_llm_foundry_fsdp_config_as_typed(argv, expected):
    """MosaicML's table columns (Sharding Strategy, Activation Checkpointing) and llm-foundry's
    submit_benchmarks.py flags read as --zero and --recompute."""
    from flopwise.plan.launcher_flags import rewrite

    assert rewrite(["--gpus", "8", *argv]) == ["--gpus", "8", *expected]


def test_hsdp_and_nonsense_refuse_in_one_line():
    from flopwise.plan.launcher_flags import rewrite

    with pytest.raises(UserError, match="HSDP's replica groups are planned from a train config"):
        rewrite(["--sharding-strategy", "HYBRID_SHARD"])
    with pytest.raises(UserError, match="must be true or false"):
        rewrite(["--activation-checkpointing", "maybe"])
    with pytest.raises(UserError, match="say the same thing twice"):
        rewrite(["--activation-checkpointing", "true", "--recompute-granularity", "full"])


@pytest.mark.parametrize(("argv", "precision"), [
    (["--bf16"], "bf16"), (["--fp16"], "fp16"), (["--bf16", "--fp8-format", "hybrid"], "fp8"),
    (["--fp8_format=e4m3"], "fp8"), (["--bf16=false"], None),
])
def test_megatron_precision_switches(argv, precision):
    from flopwise.plan.launcher_flags import rewrite

    assert rewrite(["--tp", "2", *argv]) == ["--tp", "2"] + (["--precision", precision] if precision else [])


def test_precision_switches_that_contradict_refuse():
    from flopwise.plan.launcher_flags import rewrite

    for argv, message in ((["--bf16", "--fp16"], "both given"), (["--fp8-format", "e5m2"], "e4m3 or hybrid"),
                          (["--fp16", "--fp8-format", "hybrid"], "not planned"),
                          (["--precision", "fp8", "--bf16"], "not both")):
        with pytest.raises(UserError, match=message):
            rewrite(argv)


def test_deepspeed_and_hf_batch_names():
    """DeepSpeed's config keys and HF Trainer's argument, as flags: the same layout as flopwise's names."""
    typed = build_runspec(model="llama3-8b", gpus=8, micro_batch=2, global_batch=64, zero=2)
    out = subprocess.run([sys.executable, "-m", "flopwise", "plan", "--model", "llama3-8b", "--gpus", "8",
                          "--train_micro_batch_size_per_gpu", "2", "--train-batch-size", "64", "--zero-stage", "2",
                          "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    layout = json.loads(out.stdout)["layout"]
    assert (layout["micro_batch"], layout["grad_accum"], layout["zero"]) == (
        typed.layout.micro_batch_size, typed.layout.grad_accum, typed.layout.zero_stage)
