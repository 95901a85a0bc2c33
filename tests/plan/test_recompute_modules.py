"""Megatron-Core's per-module recompute and its recompute flags, planned as the launcher states them."""

import json
import subprocess
import sys

import pytest

from flopwise.errors import UserError
from flopwise.plan import memory as mem
from flopwise.plan import launcher_flags, recompute_modules
from flopwise.plan.planner import build_runspec, plan

DEEPSEEK = dict(model="deepseek-v3", hardware="h100-sxm", gpus=1024, tp=2, pp=16, ep=64, micro_batch=1,
                global_batch=8192, seq_len=4096, stack="megatron-core", precision="bf16")
"""NeMo's DeepSeek-V3 H100 pre-training layout (model_configs_h100.csv), recompute_modules mla_up_proj/mlp/moe."""


def planned(recompute, **kwargs):
    return plan(build_runspec(**{**DEEPSEEK, **kwargs, "recompute": recompute}))


def test_nemo_spelling_reads_as_one_policy():
    for typed in ("mla_up_proj/mlp/moe", "moe,mlp,mla_up_proj", "modules:mlp+moe+mla-up-proj"):
        assert build_runspec(**{**DEEPSEEK, "recompute": typed}).layout.recompute == "modules:mlp+moe+mla_up_proj"
    assert recompute_modules.spelled(frozenset({"core_attn"})) == "selective"


def test_each_module_keeps_less_and_costs_more_than_none():
    """Every module drops some saved tensors and runs some forward work again; all three of NeMo's
    DeepSeek-V3 recipe keep less than any one of them, and full recompute less still."""
    none = planned("none")
    kept, step = {}, {}
    for module in ("mlp", "moe", "mla_up_proj", "moe_act", "layernorm", "shared_experts"):
        p = planned(module)
        kept[module], step[module] = p.memory.activations, p.time.step_seconds
        assert kept[module] < none.memory.activations, module
        assert step[module] > none.time.step_seconds, module
    three = planned("mla_up_proj/mlp/moe")
    assert three.memory.activations < min(kept[m] for m in ("mlp", "moe", "mla_up_proj"))
    assert planned("full").memory.activations < three.memory.activations
    # the MoE layer dominates DeepSeek-V3's activations (its routed copies): moe drops the most
    assert kept["moe"] == min(kept.values())


def test_moe_recompute_runs_the_all_to_alls_again():
    """Megatron-Core checkpoints the whole MoE layer, dispatch and combine included
    (moe/moe_layer.py): one more forward pass of each, half again the two of a step."""
    none, moe = planned("none"), planned("moe")
    assert moe.time.ep_exposed_seconds == pytest.approx(1.5 * none.time.ep_exposed_seconds, rel=0.02)
    assert planned("mlp").time.ep_exposed_seconds == pytest.approx(none.time.ep_exposed_seconds)


def test_hardware_flops_count_the_rerun_matmuls():
    none, three = planned("none"), planned("mla_up_proj/mlp/moe")
    assert three.flops.model_per_unit == none.flops.model_per_unit
    extra = three.flops.hardware_per_unit - none.flops.hardware_per_unit
    # the active MLP of every block (8 routed + 1 shared expert of 2048, or the dense 18432: 3 matmuls
    # of h x 18432) and MLA's two up projections, 2 FLOPs per multiply-add
    mlp = 61 * 3 * 7168 * 18432
    up = 61 * (128 * (128 + 128) * 512 + 128 * 192 * 1536)
    assert extra == pytest.approx(2 * (mlp + up), rel=0.01)


def test_modules_on_a_dense_model():
    """mlp is every block's MLP; the MoE modules have nothing to act on, and MLA's up projection
    is refused as Megatron-Core refuses it without multi-latent attention."""
    dense = dict(model="llama3-8b", gpus=8, micro_batch=1, tp=1, pp=1, stack="megatron-core", seq_len=8192)
    none = plan(build_runspec(**dense, recompute="none"))
    mlp = plan(build_runspec(**dense, recompute="mlp"))
    assert mlp.memory.activations < none.memory.activations
    assert mlp.time.step_seconds > none.time.step_seconds
    moe_act = plan(build_runspec(**dense, recompute="moe_act"))
    assert moe_act.memory.activations == none.memory.activations
    with pytest.raises(UserError, match="mla_up_proj is for multi-latent attention"):
        build_runspec(**dense, recompute="mla_up_proj")


def test_terms_drop_exactly_the_module_tensors():
    """Under sequence parallelism the layernorm outputs are split over tp; the mlp's saved tensors
    always are."""
    from flopwise.catalog.models import get_model

    terms = mem.activation_terms(get_model("llama3-8b"), 4096, 1, flash_attention=True, dropout=False)
    none = mem.activation_bytes_per_layer(terms, 2, True, "none")
    assert none - mem.activation_bytes_per_layer(terms, 2, True, "modules:layernorm") == pytest.approx(
        terms.norm_outputs / 2)
    unsplit = mem.activation_bytes_per_layer(terms, 2, False, "none")
    assert unsplit - mem.activation_bytes_per_layer(terms, 2, False, "modules:layernorm") == pytest.approx(
        terms.norm_outputs)
    assert unsplit - mem.activation_bytes_per_layer(terms, 2, False, "modules:mlp") == pytest.approx(
        terms.mlp_saved / 2)


@pytest.mark.parametrize(("argv", "policy"), [
    (["--recompute-modules", "mla_up_proj", "mlp", "moe"], "modules:mla_up_proj+mlp+moe"),
    (["--recompute_modules", "mla_up_proj/mlp/moe"], "modules:mla_up_proj+mlp+moe"),
    (["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"], "full"),
    (["--recompute-granularity=full", "--recompute-method=block", "--recompute-num-layers=2"], "block-layers:2"),
    (["--recompute-layers", "3"], "block-layers:3"),
    (["--recompute-granularity", "selective"], "selective"),
])
def test_megatron_flags_become_one_recompute(argv, policy):
    assert launcher_flags.rewrite(["--tp", "2", *argv, "x.y=1"]) == ["--tp", "2", "x.y=1", "--recompute", policy]


def test_block_method_is_the_share_of_a_stage():
    """Megatron's block method recomputes N blocks of each pipeline stage (virtual chunk): 2 of the 8
    layers of a 32-layer model over pp 4 is a quarter of the blocks."""
    spec = build_runspec(model="llama3-8b", gpus=8, pp=4, micro_batch=1, recompute="block-layers:2")
    assert spec.layout.recompute == "blocks:0.25"
    with pytest.raises(UserError, match="more than the 8 layers of a pipeline stage"):
        build_runspec(model="llama3-8b", gpus=8, pp=4, micro_batch=1, recompute="block-layers:9")


def test_the_cli_reads_megatron_flags_on_both_paths():
    args = ["--model", "llama3-8b", "--gpus", "8", "--micro-batch", "1", "--seq", "8192", "--stack", "megatron-core"]

    def cli(*more):
        return subprocess.run([sys.executable, "-m", "flopwise", "plan", *args, *more], capture_output=True,
                              text=True, timeout=60)

    fast = cli("--json", "--recompute-modules", "mlp", "layernorm")
    assert fast.returncode == 0, fast.stderr
    assert json.loads(fast.stdout)["layout"]["recompute"] == "modules:mlp+layernorm"
    table = cli("--recompute-modules", "mlp", "layernorm")
    assert table.returncode == 0 and "recompute modules:mlp+layernorm" in table.stdout
    bad = cli("--recompute-modules", "attn_core")
    assert bad.returncode == 2 and bad.stderr.startswith("error: --recompute-modules: attn_core not among")
    both = cli("--recompute", "full", "--recompute-layers", "1")
    assert both.returncode == 2 and "not both" in both.stderr


def test_a_cnn_has_no_modules_to_recompute():
    with pytest.raises(UserError, match="resnet50|ResNet-50"):
        build_runspec(model="resnet50", recompute="mlp")


def test_a_lora_run_counts_the_rerun_base_matmuls():
    """A LoRA fine-tune under per-module recompute runs the frozen base's MLP forward again: its
    hardware FLOPs grow by that MLP's 2 FLOPs per weight per token."""
    lora = dict(model="llama3-8b", gpus=8, micro_batch=1, finetune="lora", stack="megatron-core", tokens="1B")
    none = plan(build_runspec(**lora, recompute="none")).flops
    mlp = plan(build_runspec(**lora, recompute="mlp")).flops
    assert mlp.hardware_per_unit - none.hardware_per_unit == pytest.approx(2 * 32 * 3 * 4096 * 14336, rel=0.001)


@pytest.mark.parametrize("argv", [["--recompute-modules"], ["--recompute-modules="], ["--recompute-layers", "--tp", "2"]])
def test_a_recompute_flag_without_its_value_says_so(argv):
    with pytest.raises(UserError, match="needs a value"):
        launcher_flags.rewrite(argv)


@pytest.mark.parametrize(("argv", "zero"), [
    (["--use-distributed-optimizer"], "1"), (["--use-torch-fsdp2"], "3"), (["--use-megatron-fsdp"], "3"),
    (["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads"], "2"),
    (["--use_mcore_fsdp", "true"], "3"), (["--use_mcore_fsdp=1"], "3"), (["--use-custom-fsdp"], "3"),
])
def test_sharding_flags_become_one_zero_stage(argv, zero):
    """Megatron-LM's --use-distributed-optimizer is ZeRO-1, its FSDPs (torch's, Megatron's) shard
    everything unless --data-parallel-sharding-strategy says less; NeMo's --use_mcore_fsdp takes a bool."""
    assert launcher_flags.rewrite(["--tp", "1", *argv]) == ["--tp", "1", "--zero", zero]


def test_sharding_flags_off_or_wrong():
    assert launcher_flags.rewrite(["--use_mcore_fsdp", "false", "--tp", "2"]) == ["--tp", "2"]
    with pytest.raises(UserError, match="--data-parallel-sharding-strategy must be one of"):
        launcher_flags.rewrite(["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "full"])
    with pytest.raises(UserError, match="not both"):
        launcher_flags.rewrite(["--zero", "2", "--use-torch-fsdp2"])


def test_a_megatron_command_line_plans_on_both_paths():
    """The flags as a Megatron-LM launch script writes them plan through `flopwise plan`, table and --json."""
    args = ["--model", "llama3-8b", "--num-gpus", "16", "--tensor-model-parallel-size", "2", "--micro-batch-size", "1",
            "--use-distributed-optimizer", "--recompute-granularity", "full", "--recompute-method", "uniform",
            "--stack", "megatron-core"]
    fast = subprocess.run([sys.executable, "-m", "flopwise", "plan", *args, "--json"], capture_output=True,
                          text=True, timeout=60)
    assert fast.returncode == 0, fast.stderr
    layout = json.loads(fast.stdout)["layout"]
    assert (layout["zero"], layout["recompute"], layout["tp"]) == (1, "full", 2)


def test_a_runspec_built_directly_is_checked_too():
    """The API path (a RunSpec with its recompute set, no CLI) refuses what the planner does not model."""
    import dataclasses

    spec = build_runspec(model="nemotron-h-8b")
    spec = dataclasses.replace(spec, layout=dataclasses.replace(spec.layout, recompute="modules:mlp"))
    with pytest.raises(UserError, match="hybrid Mamba stack"):
        plan(spec)
