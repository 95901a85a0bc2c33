"""The stack registry: every agreed name resolves, aliases resolve, unknown names are one line."""

import pytest

from flopwise.errors import UserError
from flopwise.plan.spec import RunSpec
from flopwise.plan.stacks import FP8_RECIPES, STACK_NAMES, get_stack


def test_agreed_names_and_aliases():
    assert STACK_NAMES[0] == "flopwise"
    assert set(STACK_NAMES) == {"flopwise", "megatron-core", "nemo", "megatron-lm", "deepspeed",
                                "megatron-deepspeed", "composer", "torchtitan", "flash-attn", "jax", "torchtune",
                                "litgpt"}
    for alias in ("mcore", "transformer-engine"):
        assert get_stack(alias) is get_stack("megatron-core")
    assert get_stack("megatron-bridge") is get_stack("nemo")
    assert RunSpec.__dataclass_fields__["stack"].default == "flopwise"


@pytest.mark.parametrize(("spelled", "name"), [
    ("NeMo", "nemo"), ("Megatron Bridge", "nemo"), ("MosaicML", "composer"),
    ("LLM-Foundry", "composer"), ("flash_attn", "flash-attn"), ("flash-attention", "flash-attn"),
    ("GPT-NeoX", "megatron-deepspeed"), ("TorchTitan", "torchtitan"), (" deepspeed ", "deepspeed"),
    ("Lit-GPT", "litgpt"), ("Lightning-AI/litgpt", "litgpt")])
def test_a_stack_as_its_source_spells_it_resolves(spelled, name):
    assert get_stack(spelled).name == name
    # and the plan records the canonical name, which the conventions are looked up by
    assert build_runspec(model="llama2-7b", hardware="h100-sxm", gpus=8, stack=spelled).stack == name


def test_every_stack_is_complete_and_cites_sources():
    for name in STACK_NAMES:
        stack = get_stack(name)
        assert stack.name == name
        assert stack.framework in ("fsdp", "megatron", "deepspeed")
        assert stack.fp8_recipe in FP8_RECIPES
        assert stack.grad_bytes in (2.0, 4.0) and stack.fp8_gemm_input_bytes in (1.0, 2.0)
        assert 0.0 <= stack.allocator_reserve <= 0.2
        assert stack.sources and all(source.strip() for source in stack.sources)


def test_unknown_stack_is_one_line():
    with pytest.raises(UserError) as err:
        get_stack("paxml")
    assert "\n" not in str(err.value) and "megatron-core" in str(err.value)


# --------------------------------------------------------------------------- memory under a stack

from flopwise.plan.planner import build_runspec, plan  # noqa: E402

GIB = 2**30


def _plan(**kw):
    return plan(build_runspec(**kw))


def test_llama2_7b_fp8_on_8_h100_fits_under_megatron_core_and_says_how():
    """A run that really ran (Llama 2 7B fp8, 8 H100, ZeRO-1, seq 4096) is judged to fit under
    Megatron-Core's conventions; under the generic megatron ones (fp32 main_grad, 2-byte fp8
    activations, 10 % slack) the same layout is over capacity."""
    layout = dict(model="llama2-7b", hardware="h100-sxm", gpus=8, precision="fp8", seq_len=4096, micro_batch=1,
                  global_batch=128, zero=1)
    generic = _plan(framework="megatron", **layout)
    mcore = _plan(stack="megatron-core", **layout)
    assert not generic.fits
    assert mcore.fits and mcore.spec.layout.framework == "megatron"
    assert mcore.memory.fits_with == ()  # NeMo's fp8 recipes keep bf16 main grads: no option needed
    assert mcore.memory.gradients == pytest.approx(mcore.memory.weights)  # bf16 main_grad: 2 bytes/param
    assert mcore.memory.allocated_bytes < generic.memory.allocated_bytes - 10 * GIB
    assert mcore.to_dict()["fits_with"] == []


def test_torchtitan_layout_fits_with_torch_compile_and_says_so():
    """torchtitan turns on torch.compile in its large configs: a layout whose eager activations overflow
    (Llama 2 7B, 8 H100, FSDP, seq 4096, micro-batch 3) fits when the blocks are compiled, the plan
    names the option, and its time is not charged a recompute; `--compile` plans the same bytes."""
    layout = dict(model="llama2-7b", hardware="h100-sxm", gpus=8, seq_len=4096, micro_batch=3, global_batch=48,
                  zero=3, recompute="none")
    titan = _plan(stack="torchtitan", **layout)
    assert titan.fits and titan.memory.fits_with == ("torch-compile",)
    assert titan.spec.layout.recompute == "none"
    compiled = _plan(stack="torchtitan", compiled=True, **layout)
    assert compiled.fits and compiled.memory.fits_with == ()
    assert compiled.memory.activations == pytest.approx(titan.memory.activations)
    assert _plan(stack="flopwise", **layout).memory.activations > 1.2 * compiled.memory.activations


def test_llama31_405b_published_layout_fits_with_the_stacks_recompute():
    """Llama 3.1 405B at its published layout (tp 8, pp 16, 8,192 H100, seq 8192, batch 2,048,
    interleaved) is not discarded. At its micro-batch of 1, as Megatron-Core would hold it, it is within
    the memory forecast's band of an H100's 79.6 GiB: kept tight, without recompute, as the paper ran it.
    At micro-batch 2, far over, Megatron-Core's memory options plus block recompute fit, and the plan
    is timed with that recompute."""
    layout = dict(model="llama3.1-405b", hardware="h100-sxm", gpus=8192, tp=8, pp=16, seq_len=8192,
                  global_batch=2048, zero=1, sequence_parallel=True, schedule="interleaved", stack="megatron-core")
    published = _plan(micro_batch=1, **layout)
    assert published.memory.may_fit and published.spec.layout.recompute == "none"
    result = _plan(micro_batch=2, **layout)
    assert result.fits
    assert result.memory.fits_with[-1].startswith("recompute ")
    assert result.spec.layout.recompute != "none"
    assert result.flops.hardware_per_unit > result.flops.model_per_unit  # the recompute is paid in time


def test_a_layout_planned_as_given_keeps_its_recompute_and_its_memory_verdict():
    """`plan_layout` times the layout a source states (Llama 3.1 405B ran without activation
    checkpointing, Llama Team 2024 sec. 3.3.2): no recompute added, the memory verdict as counted,
    where `plan` adds the stack's block recompute to make it fit (at micro-batch 2, far over)."""
    from flopwise.plan.planner import plan_layout, plan_memory

    spec = build_runspec(model="llama3.1-405b", hardware="h100-sxm", gpus=8192, tp=8, pp=16, seq_len=8192,
                         micro_batch=2, global_batch=2048, zero=1, sequence_parallel=True, schedule="interleaved",
                         stack="megatron-core")
    given, laddered = plan_layout(spec), plan(spec)
    assert given.spec.layout.recompute == "none" and not given.fits
    assert given.flops.hardware_per_unit == given.flops.model_per_unit
    assert laddered.fits and laddered.spec.layout.recompute != "none"
    assert given.time.step_seconds < laddered.time.step_seconds
    assert not plan_memory(spec, stack_recompute=False).fits and plan_memory(spec).fits


def test_megatron_pr482_peak_memory_within_10_percent():
    """memory_points: Llama-2-7B, DP 8 x PP 2, micro-batch 2, seq 4096, bf16, ZeRO-1 on A100-80GB
    (Megatron-LM PR #482): 69.1 GB measured peak (Megatron reports MiB-based GB)."""
    result = _plan(model="llama2-7b", hardware="a100-80gb", gpus=16, tp=1, pp=2, zero=1, micro_batch=2, seq_len=4096,
                   global_batch=2048, stack="megatron-lm")
    assert result.fits
    assert result.memory.total_bytes / GIB == pytest.approx(69.1, rel=0.10)


def test_flopwise_stack_is_the_framework_conventions_unchanged():
    """The default stack plans exactly as before stacks existed (what a run's plan.json uses)."""
    layout = dict(model="llama2-7b", hardware="h100-sxm", gpus=8, precision="fp8", seq_len=4096, zero=1)
    assert _plan(framework="megatron", **layout).memory.total_bytes == \
        _plan(framework="megatron", stack="flopwise", **layout).memory.total_bytes
    assert _plan(framework="megatron", **layout).memory.fits_with == ()


# --------------------------------------------------------------------------- kernel rates under a stack


def test_fp8_recipe_and_attention_kernel_change_the_step():
    """rowwise-scaled fp8 GEMMs are slower than per-tensor ones (pytorch#147971), so the same
    layout takes longer; Megatron-Core's cuDNN attention and faster kernels (`stack_speed`) make its
    fp8 step shorter than the flopwise stack's (FA2 attention)."""
    from flopwise.plan.gemm import curve_for, stack_curve
    from flopwise.catalog.hardware import get_hardware

    layout = dict(model="llama2-7b", hardware="h100-sxm", gpus=8, precision="fp8", seq_len=4096, zero=1)
    tensorwise = _plan(stack="torchtitan", fp8_recipe="tensorwise", **layout).time.step_seconds
    rowwise = _plan(stack="torchtitan", fp8_recipe="rowwise", **layout).time.step_seconds
    assert rowwise > tensorwise * 1.02
    assert _plan(stack="megatron-core", **layout).time.step_seconds < _plan(**layout).time.step_seconds
    hopper = curve_for(get_hardware("h100-sxm"))
    assert stack_curve(hopper, "cudnn", None).attention_fraction[0] > hopper.attention_fraction[0] * 1.5
    ampere = curve_for(get_hardware("a100-80gb"))
    assert stack_curve(ampere, "fa3", None) is ampere  # no FlashAttention-3 on Ampere


def test_unknown_fp8_recipe_is_one_line():
    with pytest.raises(UserError) as err:
        build_runspec(model="llama2-7b", precision="fp8", fp8_recipe="nvfp4")
    assert "\n" not in str(err.value) and "rowwise" in str(err.value)


def test_blockwise_fp8_is_slower_than_rowwise_and_plans_under_nemos_name():
    """TE's Float8BlockScaling (NeMo's `ss`) applies per-block scales as row-wise scaling does and
    fixes split accumulation for the forward GEMM too: a little slower than row-wise."""
    layout = dict(model="llama2-7b", hardware="h100-sxm", gpus=8, precision="fp8", seq_len=4096, zero=1,
                  stack="nemo")
    rowwise = _plan(fp8_recipe="rowwise", **layout).time.step_seconds
    blockwise = _plan(fp8_recipe="ss", **layout)
    assert blockwise.spec.cluster.extra["fp8_recipe"] == "blockwise"
    assert rowwise < blockwise.time.step_seconds < rowwise * 1.02


def test_fp8_recipe_names_stacks_use_are_the_same_recipes():
    """NeMo's `current` (TE Float8CurrentScaling) is per-tensor scaling; its `hybrid` the format of delayed."""
    for alias, recipe in (("current", "tensorwise"), ("hybrid", "delayed"), ("Rowwise", "rowwise")):
        spec = build_runspec(model="llama2-7b", precision="fp8", stack="nemo", fp8_recipe=alias)
        assert spec.cluster.extra["fp8_recipe"] == recipe
    same = (plan(build_runspec(model="llama2-7b", precision="fp8", stack="nemo", fp8_recipe=r)).time.step_seconds
            for r in ("current", "tensorwise"))
    assert len(set(same)) == 1


# --------------------------------------------------------------------------- pure bf16


def test_bf16_true_is_8_bytes_per_param_and_states_its_trade_off():
    """Pure bf16 (torchtune / litgpt's fine-tuning default): 2 + 2 + 4 bytes/param with AdamW,
    no master copy; the plan says what it costs in precision."""
    layout = dict(model="llama2-7b", hardware="h100-sxm", gpus=1, seq_len=2048, zero=0)
    mixed = _plan(precision="bf16", **layout)
    pure = _plan(precision="bf16-true", **layout)
    params = mixed.params.total
    assert pure.memory.master_weights == 0.0
    assert (pure.memory.weights + pure.memory.gradients + pure.memory.optimizer_states) / params == pytest.approx(8.0)
    assert (mixed.memory.weights + mixed.memory.gradients + mixed.memory.optimizer_states
            + mixed.memory.master_weights) / params == pytest.approx(16.0)
    assert pure.fits and not mixed.fits  # 7B: 56 GB of states fit on 80 GB, 112 GB do not
    assert any("master copy" in w for w in pure.warnings)
    assert pure.time.peak_flops == mixed.time.peak_flops  # the matmuls still run in bf16


# --------------------------------------------------------------------------- search and compare inherit the stack


def test_search_under_a_stack_keeps_the_published_layout():
    """`plan --search --stack megatron-core`: every layout it tries carries the stack, and the
    layout the published Llama 2 7B fp8 run used (dp 8, micro-batch 1, no TP/PP, no recompute)
    is among those that fit (bf16 gradient reduce), where the generic megatron conventions reject it."""
    from flopwise.plan.planner import plan_memory
    from flopwise.plan.search import search_layouts

    job = dict(model="llama2-7b", hardware="h100-sxm", gpus=8, precision="fp8", seq_len=4096, global_batch=128,
               micro_batch=1, zero=1)
    published = build_runspec(stack="megatron-core", **job)
    assert plan_memory(published).fits
    assert not plan_memory(build_runspec(framework="megatron", **job)).fits
    result = search_layouts(published, 8, top=3)
    assert result.ranked and all(p.spec.stack == "megatron-core" for p in result.ranked)
    assert all(p.spec.layout.framework == "megatron" for p in result.ranked)
    assert all(p.spec.layout.zero_stage <= 1 and p.spec.layout.offload == "none" for p in result.ranked)


def test_compare_passes_the_stack_through():
    from flopwise.plan.compare import compare_devices

    result = compare_devices("llama2-7b", "1B", ["h100-sxm"], gpus=8, seq_len=4096, stack="megatron-core")
    chosen = result.verdicts[0].chosen
    assert chosen is not None and chosen.plan.spec.stack == "megatron-core"


def test_megatron_core_defaults_to_its_distributed_optimizer():
    spec = build_runspec(model="llama2-7b", hardware="h100-sxm", gpus=8, stack="megatron-core")
    assert spec.layout.zero_stage == 1 and spec.layout.framework == "megatron"
    assert any("distributed optimizer" in d for d in spec.cluster.extra["defaults"])
    big = build_runspec(model="llama3-70b", hardware="h100-sxm", gpus=64, stack="megatron-core")
    assert big.layout.tp * big.layout.pp > 1  # the automatic split still runs when nothing fits unsplit


def test_a_runspec_naming_an_undescribed_stack_plans_as_flopwise():
    """RunSpecs built directly (the validation harness) may name a stack with no module: the
    planner falls back to the framework conventions rather than failing."""
    import dataclasses

    from flopwise.plan.planner import plan_memory

    spec = build_runspec(model="llama2-7b", hardware="h100-sxm", gpus=8, zero=1)
    assert plan_memory(dataclasses.replace(spec, stack="paxml")).total_bytes == plan_memory(spec).total_bytes
    assert plan(dataclasses.replace(spec, stack="paxml")).fits


def test_deepspeed_zero3_gathers_one_module_not_a_block(tmp_path):
    """Megatron-LM Table 2's 530B ZeRO-3 run (640 A100-80GB, micro-batch 4, full recompute) ran:
    DeepSpeed fetches one module at a time, so its gather buffer is the largest Linear's 16-bit
    weight and gradient (4 bytes/param), not a whole 5B-parameter block's."""
    import json

    from flopwise.plan.planner import plan_memory

    config = tmp_path / "config.json"  # Narayanan et al. 2021 Table 2's 530B: 105 layers, h 20480, 128 heads
    config.write_text(json.dumps({"model_type": "gpt2", "n_embd": 20480, "n_layer": 105, "n_head": 128,
                                  "vocab_size": 51200, "n_positions": 2048}))
    job = dict(model=str(config), hardware="a100-80gb", gpus=640, micro_batch=4, global_batch=2560,
               seq_len=2048, precision="fp16", zero=3, recompute="full")
    generic = plan_memory(build_runspec(framework="deepspeed", **job))
    stack = plan_memory(build_runspec(stack="deepspeed", **job))
    h = 20480
    assert stack.comm_buffers == pytest.approx(4.0 * h * 4 * h)  # the 4h x h MLP Linear
    assert generic.comm_buffers > 2.9 * stack.comm_buffers
    # counted as a whole block, the gathers would take ~14 GiB more (both fit an 80 GB card's 80 GiB)
    assert stack.fits and generic.total_bytes - stack.total_bytes > 10 * 2**30


def test_plan_memory_applies_the_stacks_recompute_as_plan_does():
    from flopwise.plan.planner import plan_memory

    spec = build_runspec(model="llama3.1-405b", hardware="h100-sxm", gpus=8192, tp=8, pp=16, seq_len=8192,
                         micro_batch=1, global_batch=2048, zero=1, sequence_parallel=True, schedule="interleaved",
                         stack="torchtitan")
    memory = plan_memory(spec)
    assert memory.fits and memory.fits_with[-1].startswith("recompute ")
    assert plan(spec).memory.fits_with == memory.fits_with


def test_palm_layout_fits_under_jax_gspmd(tmp_path):
    """PaLM 540B (6,144 TPU v4, 12-way model x 256-way fully sharded data parallel per pod,
    micro-batch 4, rematerialisation): GSPMD shards the saved activations over the model axis,
    so the published layout fits; without that sharding the remat inputs alone overflow 32 GiB."""
    import json

    from flopwise.plan.planner import plan_memory

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 18432, "intermediate_size": 73728,
                                  "num_hidden_layers": 118, "num_attention_heads": 48, "num_key_value_heads": 1,
                                  "head_dim": 256, "vocab_size": 256000, "max_position_embeddings": 2048,
                                  "tie_word_embeddings": True}))
    job = dict(model=str(config), hardware="tpu-v4", gpus=6144, tp=12, micro_batch=4, global_batch=2048,
               seq_len=2048, zero=3, recompute="full")
    assert plan_memory(build_runspec(stack="jax", **job)).fits
    assert not plan_memory(build_runspec(**job)).fits


def test_deepspeed_bf16_optimizer_keeps_full_fp32_gradients():
    """bf16 at ZeRO-1 under DeepSpeed runs BF16_Optimizer: bf16 .grad plus a full-size fp32
    accumulation buffer (6 bytes/param), no separate fp32 partition; ZeRO-2 keeps its own scheme."""
    job = dict(model="llama2-7b", hardware="a100-80gb", gpus=8, precision="bf16", seq_len=2048)
    one = plan(build_runspec(stack="megatron-deepspeed", zero=1, **job)).memory
    assert one.gradients == pytest.approx(3.0 * one.weights)
    two = plan(build_runspec(stack="deepspeed", zero=2, **job)).memory
    assert two.gradients < one.gradients / 3


def test_bloom_memory_under_megatron_deepspeed_of_its_time():
    """BLOOM-176B (384 A100-80GB, TP 4 x PP 12 x DP 8, ZeRO-1, bf16, micro-batch 2, full recompute):
    'one copy of the model takes 48 GPUs (using 60 GB of memory on each GPU)'. The 2022
    BF16_Optimizer keeps a whole fp32 master and fp32 gradients beside the bf16 ones; the busiest
    (first) stage's allocated peak lands on the published 60 GB, the reserved total 10 % above."""
    from flopwise.plan.planner import plan_memory

    memory = plan_memory(build_runspec(
        model="bloom-176b", hardware="a100-80gb", gpus=384, tp=4, pp=12, zero=1, micro_batch=2, global_batch=2048,
        seq_len=2048, precision="bf16", recompute="full", framework="megatron", stack="megatron-deepspeed",
        flash_attention=False, allocator_reserve=0.10))
    assert memory.fits
    assert memory.master_weights == pytest.approx(2.0 * memory.weights)  # fp32, whole, on every rank
    assert memory.allocated_bytes / 1e9 == pytest.approx(60.0, rel=0.05)


def test_stacks_whose_recipes_run_sequence_parallelism_plan_it_with_tp():
    """NeMo / Megatron-Bridge and torchtitan shard with tp: a user stating only tp gets SP, and
    with it the smaller activations and sends; --no-sequence-parallel turns it off."""
    from flopwise.plan.options import parse_json_plan_args

    for stack in ("megatron-core", "nemo", "torchtitan"):
        assert build_runspec(model="llama3-70b", gpus=64, tp=8, stack=stack).layout.sequence_parallel
        assert not build_runspec(model="llama3-70b", gpus=64, tp=1, stack=stack).layout.sequence_parallel
    for stack in ("flopwise", "megatron-lm", "megatron-deepspeed"):
        assert not build_runspec(model="llama3-70b", gpus=64, tp=8, stack=stack).layout.sequence_parallel
    on = build_runspec(model="llama3-70b", gpus=64, tp=8, pp=2, stack="nemo")
    off = build_runspec(model="llama3-70b", gpus=64, tp=8, pp=2, stack="nemo", sequence_parallel=False)
    assert not off.layout.sequence_parallel
    assert plan(on).memory.activations < plan(off).memory.activations
    values = parse_json_plan_args(["--tp", "8", "--no-sequence-parallel", "--json"])
    assert values is not None and values["sequence_parallel"] is False
    assert parse_json_plan_args(["--sequence-parallel", "--json"])["sequence_parallel"] is True
    assert parse_json_plan_args(["--json"])["sequence_parallel"] is None


def test_virtual_stages_alone_select_the_interleaved_schedule():
    """Megatron's --virtual-pipeline-model-parallel-size alone selects its interleaved 1F1B."""
    spec = build_runspec(model="llama3-70b", gpus=64, tp=8, pp=4, virtual_stages=5, stack="megatron-core")
    assert spec.layout.pipeline_schedule == "interleaved" and spec.layout.virtual_stages == 5
    with pytest.raises(UserError, match="--virtual-stages 5 needs --schedule interleaved"):
        build_runspec(model="llama3-70b", gpus=64, tp=8, pp=4, virtual_stages=5, schedule="gpipe")


def test_megatron_core_hides_an_interleaved_pipelines_sends_but_not_its_fill():
    """overlap_p2p_comm (on for interleaved schedules in Megatron-LM's arguments.py): only the
    fill and drain wait on the wire; the same layout under Megatron-LM 2021 waits on every send."""
    import dataclasses

    spec = build_runspec(model="llama3-70b", gpus=256, tp=8, pp=8, virtual_stages=5, global_batch=256,
                         stack="megatron-core")
    core = plan(spec).time
    lm = plan(dataclasses.replace(spec, stack="megatron-lm")).time
    assert 0 < core.pp_exposed_seconds < lm.pp_exposed_seconds / 10
    flat = plan(build_runspec(model="llama3-70b", gpus=256, tp=8, pp=8, global_batch=256, stack="megatron-core"))
    assert flat.time.pp_exposed_seconds > 5 * core.pp_exposed_seconds  # 1F1B without interleaving: no overlap


def test_fp8_plan_states_mfu_over_both_peaks():
    """An fp8 plan's MFU over the fp8 peak (Composer's denominator) and over the 16-bit one
    (torchtitan's): the same FLOPs per second, so the two differ by the peaks' ratio (2 on H100);
    a bf16 plan has one MFU and no second figure."""
    from flopwise.catalog.hardware import get_hardware

    layout = dict(model="llama2-7b", hardware="h100-sxm", gpus=8, seq_len=4096, zero=1, stack="torchtitan")
    fp8 = _plan(precision="fp8", **layout).time
    h100 = get_hardware("h100-sxm")
    ratio = h100.peak_flops("fp8") / h100.peak_flops("bf16")
    assert ratio == pytest.approx(2.0, rel=0.01)
    assert fp8.mfu_16bit_peak == pytest.approx(fp8.mfu * ratio, rel=1e-9)
    assert fp8.tokens_per_second_per_device * 6 * 6.5e9 / h100.peak_flops("bf16") < fp8.mfu_16bit_peak
    assert _plan(precision="bf16", **layout).time.mfu_16bit_peak is None


def test_each_stack_times_its_own_loss_kernel():
    """The loss over a 128K vocabulary moves what each implementation's code moves per logit: one
    pass (flash-attn's Triton kernel) < torch.compile < Megatron's jit-fused < eager PyTorch <
    Megatron's unfused path; torchtitan compiles its loss under --compile."""
    from flopwise.catalog.hardware import get_hardware
    from flopwise.catalog.models import get_model
    from flopwise.plan import ops
    from flopwise.plan.gemm import device_rates
    from flopwise.plan.planner import build_runspec
    from flopwise.plan.stacks.base import CROSS_ENTROPY_KERNELS
    from flopwise.plan.timing import stack_cross_entropy

    for name in STACK_NAMES:
        assert get_stack(name).cross_entropy in CROSS_ENTROPY_KERNELS
    assert set(ops.CROSS_ENTROPY_BYTES_PER_LOGIT) == set(CROSS_ENTROPY_KERNELS)
    hw, model = get_hardware("h100-sxm"), get_model("llama3-8b")
    rates = device_rates(hw, "bf16", hw.peak_flops("bf16"))
    heads = [ops.end_times(model, 8192, 1, 1, False, "bf16", rates, kind).head
             for kind in ("single-pass", "compiled", "megatron-fused", "eager", "megatron")]
    assert heads == sorted(heads) and len(set(heads)) == len(heads)
    logits = 8192 * model.vocab_size
    extra = (ops.CROSS_ENTROPY_BYTES_PER_LOGIT["eager"][0] - ops.CROSS_ENTROPY_BYTES_PER_LOGIT["single-pass"][0])
    assert heads[3] - heads[0] >= logits * extra / rates.memory_bytes_per_s  # at least the extra bytes' time
    assert stack_cross_entropy(build_runspec(stack="torchtitan", compiled=True)) == "compiled"
    assert stack_cross_entropy(build_runspec(stack="torchtitan")) == "eager"
    assert stack_cross_entropy(build_runspec(stack="flopwise", compiled=True)) == "eager"  # blocks only
    assert stack_cross_entropy(build_runspec(stack="composer")) == "single-pass"


def test_selective_recompute_means_what_the_stack_calls_selective():
    """torchtitan's "selective" activation checkpointing is per-op (its Llama 3 configs): a torchtitan
    plan asked for "selective" plans "op" and says so, and fits where Megatron's attention-core
    recompute (which saves nothing under flash attention) does not; Megatron-Core keeps its own."""
    from flopwise.plan.search import search_layouts

    job = dict(model="llama3-8b", gpus=128, zero=3, micro_batch=2, seq_len=8192, global_batch=256, precision="fp8")
    titan = _plan(stack="torchtitan", recompute="selective", **job)
    assert titan.spec.layout.recompute == "op"
    assert any("selective activation checkpointing" in d for d in titan.spec.cluster.extra["defaults"])
    assert titan.memory.verdict == "fits"
    megatron_style = plan(build_runspec(stack="flopwise", recompute="selective", **job))
    assert megatron_style.spec.layout.recompute == "selective" and megatron_style.memory.verdict == "does not fit"
    assert _plan(stack="megatron-core", recompute="selective", model="llama2-7b", gpus=8).spec.layout.recompute \
        == "selective"
    ranked = search_layouts(build_runspec(stack="torchtitan", model="llama3-8b", gpus=1, seq_len=8192,
                                          global_batch=16, precision="fp8"), 8, top=20).ranked
    assert ranked and all(p.spec.layout.recompute != "selective" for p in ranked)


def test_fp8_gemms_gain_less_at_short_k_and_the_head_stays_16_bit():
    """An fp8 GEMM's main loop runs twice as fast per K step but its tiles' fixed cost does not:
    at K = 1,024 (a row-parallel projection of h 8,192 over tp 8) fp8 gains less over bf16 than at
    K = 8,192. The LM head of an fp8 run is timed as a bf16 GEMM (every stack keeps it out of fp8)."""
    from flopwise.catalog.hardware import get_hardware
    from flopwise.plan.gemm import FP8_KERNEL_FACTOR_HOPPER, device_rates
    from flopwise.plan.ops import end_times

    hw = get_hardware("h100-sxm")
    bf16 = device_rates(hw, "bf16", hw.peak_flops("bf16"))
    fp8 = device_rates(hw, "fp8", hw.peak_flops("fp8"))

    def gain(k):
        return bf16.gemm_seconds(16384, 8192, k) / fp8.gemm_seconds(16384, 8192, k, dtype_bytes=1.0)

    assert gain(1024) < gain(8192) * 0.93
    assert 1.7 < gain(8192) < 2.0 * FP8_KERNEL_FACTOR_HOPPER
    assert fp8.sixteen_bit().peak == hw.peak_flops("bf16") and bf16.sixteen_bit() is bf16
    model = _plan(model="llama3-8b", hardware="h100-sxm", gpus=8, precision="bf16").spec.model
    head_fp8 = end_times(model, 8192, 1, 1, False, "fp8", fp8).head
    head_bf16 = end_times(model, 8192, 1, 1, False, "bf16", bf16).head
    assert head_fp8 == pytest.approx(head_bf16, rel=0.02)  # not twice as fast


def test_fp8_kernel_factor_is_what_the_kernel_benchmarks_give():
    """FP8_KERNEL_FACTOR_HOPPER is derived, not fitted: `benchmarks/fp8_kernel_factor.py` from the
    H200 micro-benchmark JSON (fast accumulation forward, split accumulation backward)."""
    import importlib.util
    from pathlib import Path

    from flopwise.plan.gemm import FP8_K_LOOP, FP8_KERNEL_FACTOR_HOPPER, curve_for
    from flopwise.catalog.hardware import get_hardware

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "fp8_kernel_factor.py"
    spec = importlib.util.spec_from_file_location("fp8_kernel_factor", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    derived = module.derive()
    assert FP8_KERNEL_FACTOR_HOPPER == pytest.approx(derived["training_factor"], abs=0.0015)
    assert derived["fast_accumulation_median"] == pytest.approx(derived["fbgemm_h100_fast_accumulation_median"], abs=0.01)
    assert module.K0_HOPPER == curve_for(get_hardware("h100-sxm")).k0 and FP8_K_LOOP == 2.0


def test_mxfp8_off_blackwell_is_planned_with_a_warning():
    """MXFP8's block scales need Blackwell tensor cores: on an H100 the plan says so; on a B200 not."""
    hopper = plan(build_runspec(model="llama3-8b", hardware="h100-sxm", gpus=8, precision="mxfp8"))
    blackwell = plan(build_runspec(model="llama3-8b", hardware="b200", gpus=8, precision="mxfp8"))
    assert any("MXFP8" in w and "Blackwell" in w for w in hopper.warnings)
    assert not any("MXFP8" in w for w in blackwell.warnings)


def test_an_fp8_recipe_on_a_16_bit_plan_is_named_as_ignored():
    """--fp8-recipe without --precision fp8 changes nothing: the plan says so rather than staying silent;
    with fp8 (stated either way) no such warning."""
    ignored = plan(build_runspec(model="llama3-8b", hardware="h100-sxm", gpus=8, fp8_recipe="rowwise"))
    assert any("--fp8-recipe rowwise" in w and "ignores it" in w for w in ignored.warnings)
    for stated in ({"precision": "fp8", "fp8_recipe": "rowwise"}, {"precision": "fp8-rowwise"}):
        assert not any("--fp8-recipe" in w for w in plan(build_runspec(
            model="llama3-8b", hardware="h100-sxm", gpus=8, **stated)).warnings)


@pytest.mark.parametrize(("typed", "name"), [
    ("FlashAttention", "flash-attn"), ("Dao-AILab/flash-attention", "flash-attn"), ("NeMo 2.0", "nemo"),
    ("NVIDIA/NeMo", "nemo"), ("mosaicml/llm-foundry", "composer"), ("Megatron Core", "megatron-core"),
    ("MegatronLM", "megatron-lm"), ("TorchTitan", "torchtitan")])
def test_a_stack_as_its_source_prints_it(typed, name):
    """Separators, a version and the repository's owner do not matter; an unknown name still refuses."""
    from flopwise.plan.stacks import get_stack

    assert get_stack(typed).name == name


def test_an_unknown_stack_still_refuses():
    from flopwise.errors import UserError
    from flopwise.plan.stacks import get_stack

    with pytest.raises(UserError, match="--stack 'nanogpt' is not one of"):
        get_stack("nanogpt")


@pytest.mark.parametrize(("stack", "precision", "options", "expected"), [
    ("megatron-core", "bf16", (), 4.0),  # Megatron-LM arguments.py forces fp32 accumulation and reduction for bf16
    ("megatron-core", "fp8", (), 2.0),  # NeMo's fp8 performance recipes: grad_reduce_in_fp32=False
    ("megatron-core", "bf16", ("bf16-grad-reduce",), 2.0),
    ("megatron-lm", "fp16", (), 2.0),  # fp16 keeps a 16-bit main_grad unless asked
    ("torchtitan", "bf16", (), 4.0),  # MixedPrecisionPolicy(reduce_dtype=fp32)
    ("flopwise", "bf16", (), 4.0),  # the trainer's FSDP2 policy reduces in fp32 too
    ("flash-attn", "bf16", (), 4.0),  # Lightning AMP: fp32 parameters, so fp32 gradients
    ("composer", "bf16", (), 2.0),  # fsdp_config mixed_precision PURE
    ("composer", "fp32", (), 4.0), ("torchtitan", "bf16-true", (), 2.0)])
def test_each_stack_reduces_gradients_in_its_own_dtype(stack, precision, options, expected):
    from flopwise.plan.stacks.conventions import gradient_reduce_bytes

    assert gradient_reduce_bytes(get_stack(stack), precision, options) == expected


def test_the_data_parallel_reduction_moves_the_stacks_gradient_bytes():
    """Megatron-Core at bf16 reduce-scatters fp32 gradients and all-gathers bf16 weights: 1.5x the bytes of
    a bf16 reduction; a plan that fits only with the bf16 gradient buffer is timed with its bf16 reduction."""
    layout = dict(model="gpt3-1.3b", hardware="h100-sxm", gpus=64, micro_batch=4, global_batch=256, zero=1,
                  precision="bf16", stack="megatron-core")
    fp32, bf16 = _plan(**layout), _plan(**layout, grad_reduce="bf16")
    assert fp32.comm.dp_bytes == pytest.approx(1.5 * bf16.comm.dp_bytes)
    assert fp32.time.step_seconds > bf16.time.step_seconds
    assert bf16.memory.gradients == pytest.approx(fp32.memory.gradients / 2)
    tight = dict(model="llama2-7b", hardware="h100-sxm", gpus=8, precision="bf16", seq_len=4096, micro_batch=2,
                 global_batch=64, zero=1, stack="megatron-core")
    laddered = _plan(**tight)
    assert laddered.memory.fits_with == ("bf16-grad-reduce",)
    assert laddered.comm.dp_bytes == pytest.approx(_plan(**tight, grad_reduce="bf16").comm.dp_bytes)
    assert _plan(**tight, grad_reduce="fp32").memory.fits_with != ("bf16-grad-reduce",)
    with pytest.raises(UserError, match="--grad-reduce"):
        _plan(**tight, grad_reduce="fp8")


def test_nvidia_performance_recipes_reduce_bf16_gradients_at_every_precision():
    """`nemo` is Megatron-Core as NeMo's scripts/performance and Megatron-Bridge's perf_recipes run it:
    grad_reduce_in_fp32=False for bf16 and fp8 alike, so the main_grad buffer and the DP reduction are
    bf16; Megatron-LM's own bf16 default stays fp32. Everything else is Megatron-Core's."""
    import dataclasses

    from flopwise.plan.stacks.conventions import conventions, gradient_reduce_bytes, option_ladder

    nemo, mcore = get_stack("nemo"), get_stack("megatron-core")
    assert [gradient_reduce_bytes(nemo, p) for p in ("bf16", "fp8")] == [2.0, 2.0]
    assert [gradient_reduce_bytes(mcore, p) for p in ("bf16", "fp8")] == [4.0, 2.0]
    assert gradient_reduce_bytes(nemo, "fp32") == 4.0  # an fp32 run reduces fp32 whatever the recipe
    assert conventions(nemo, "bf16").grad_bytes == 2.0 and conventions(nemo, "bf16", grad_reduce="fp32").grad_bytes == 4.0
    assert all("bf16-grad-reduce" not in options for options in option_ladder(nemo, "bf16"))
    same = {f.name for f in dataclasses.fields(mcore)} - {"name", "title", "grad_bytes", "reduce_bytes",
                                                          "fp8_reduce_bytes", "memory_options", "sources"}
    assert all(getattr(nemo, f) == getattr(mcore, f) for f in same)
    kwargs = dict(model="llama3-70b", hardware="h100-sxm", gpus=64, tp=4, pp=4, micro_batch=1, global_batch=128,
                  seq_len=4096, precision="bf16")
    recipe, core = (plan(build_runspec(**kwargs, stack=s)) for s in ("nemo", "megatron-core"))
    assert recipe.comm.dp_bytes == pytest.approx(core.comm.dp_bytes * 4 / 6)  # bf16 RS + bf16 AG, not fp32 RS + bf16 AG
    assert recipe.time.step_seconds < core.time.step_seconds
    stated = plan(build_runspec(**kwargs, stack="nemo", grad_reduce="fp32"))
    assert stated.memory.total_bytes == core.memory.total_bytes
    assert stated.time.step_seconds == pytest.approx(core.time.step_seconds)


def test_flash_attn_gpt_activations_match_its_configs_own_measurement():
    """flash-attention's training/configs/experiment/owt/gpt2xl-flash.yaml notes, on A100 40GB with
    mlp_checkpoint_lvl=1 (the GELU output recomputed): batch 4 "mem 37GB", batch 8 "mem 46GB": 9 GB for
    4 x 1,024 more tokens over 48 blocks, 28.6 bytes per token per unit of hidden size (30.7 if GiB). The
    stack's conventions (dropout masks, the fp32 residual each fused dropout-add-LayerNorm saves) plan
    38 bytes at level 0; less the 8 of the fp16 4h GELU output that level 1 drops, within 8 % of it
    (without either convention: 32 at level 0, 24 at level 1, 16 % under)."""
    from flopwise.plan.planner import plan_memory

    job = dict(model="gpt2-1.5b", hardware="a100-40gb", gpus=8, seq_len=1024, global_batch=512, zero=1,
               precision="fp16", recompute="none", stack="flash-attn")
    per = {}
    for dropout in (None, False):
        four, eight = (plan_memory(build_runspec(micro_batch=mb, dropout=dropout, **job)) for mb in (4, 8))
        per[dropout] = (eight.activations - four.activations) / (4 * 1024 * 48 * 1600)
    assert per[None] - 8.0 == pytest.approx(28.6, rel=0.08) and per[None] - 8.0 == pytest.approx(30.7, rel=0.08)
    assert per[None] == pytest.approx(38.0, abs=0.5)
    assert per[False] == pytest.approx(36.0, abs=0.5)  # the fp32 residual still there: 32 + 2 x 2


@pytest.mark.parametrize("name", [n for n in STACK_NAMES if not get_stack(n).fp8_training])
def test_a_stack_without_fp8_training_refuses_an_fp8_plan_in_one_line(name):
    with pytest.raises(UserError) as err:
        build_runspec(model="llama2-7b", hardware="h100-sxm", gpus=8, stack=name, precision="fp8")
    assert "no fp8 training recipe" in str(err.value) and "\n" not in str(err.value)
