"""plan/planner.py: whole plans against published runs, fit advice, validation and inputs."""

import dataclasses
import json
import math

import pytest

from flopwise.catalog.hardware import get_hardware
from flopwise.catalog.models import ModelSpec
from flopwise.errors import UserError
from flopwise.plan import step_comm as sc
from flopwise.plan.params import count_params
from flopwise.plan.planner import build_runspec, parse_count, plan
from flopwise.plan.spec import Cluster, Layout, RunSpec, Workload
from flopwise.plan.stage_memory import every_stage_memory
from flopwise.plan.timing import split_layers

GIB = 2**30

# MPT-7B as benchmarked by MosaicML llm-foundry (6.65B params, ALiBi, tied embeddings, no biases).
MPT_7B = ModelSpec(key="mpt-7b", name="MPT-7B", n_layers=32, hidden=4096, n_heads=32, ffn_hidden=16384,
                   vocab_size=50432, seq_len=2048, mlp="gelu", norm="layernorm", position="alibi",
                   tied_embeddings=True)


def test_default_example_plans_and_serialises():
    p = plan(build_runspec())
    # The ZeRO stage is now chosen (fastest that fits, ZeRO-1/2 first among equals), no longer a fixed 3.
    assert p.spec.model.key == "llama2-7b" and p.spec.layout.devices == 8 and p.spec.layout.zero_stage == 2
    assert p.spec.cluster.extra["defaults"][0].startswith("zero 2: fits with")
    assert p.spec.layout.global_batch_size * p.spec.workload.seq_len == 4 * 2**20
    assert p.fits and p.memory.total_bytes - p.memory.allocator_reserve <= p.memory.capacity_bytes
    # flopwise's trainer accumulates its 128 micro-steps with FSDP's gradient sync off: every rank
    # holds the whole model's gradients, unsharded and in fp32, until the last one reduce-scatters
    assert p.memory.gradients == pytest.approx(4 * p.params.total)
    assert 0 < p.time.mfu <= p.time.efficiency + 1e-12 <= 1 + 1e-12
    assert p.time.total_seconds == pytest.approx(2e12 / p.time.tokens_per_second)
    assert p.energy.kwh > 0 and p.cost.on_demand_usd > 0
    data = json.loads(json.dumps(p.to_dict(), allow_nan=False))
    for key in ("params", "flops", "memory", "comm", "time", "energy", "cost", "warnings", "advice", "inputs"):
        assert key in data
    # fp8 copies and the allocator's reserve are now part of the total (reserved memory).
    assert data["memory"]["total_bytes"] == pytest.approx(sum(
        data["memory"][k] for k in ("weights", "gradients", "optimizer_states", "master_weights",
                                   "activations", "logits", "comm_buffers", "fp8_buffers", "allocator_reserve")))


def test_mosaicml_mpt_7b_h100_throughput_within_10_percent():
    # llm-foundry benchmarks: 7B, 8 x H100-80GB, seq 2048, MBS 6, FSDP FULL_SHARD, bf16 -> 10,643 tokens/s/GPU.
    spec = RunSpec(MPT_7B, Layout(dp=8, micro_batch_size=6, grad_accum=1, zero_stage=3),
                   Workload(seq_len=2048, total_tokens=1e9), Cluster(get_hardware("h100-sxm")))
    p = plan(spec)
    assert p.fits
    assert p.time.tokens_per_second_per_device == pytest.approx(10_643, rel=0.10)


def test_llama1_65b_gpu_hours_within_15_percent():
    # Touvron et al. 2023: 1.4T tokens, 1,022,362 A100-80GB GPU-hours, ~380 tokens/s/GPU on 2048 GPUs.
    # Layout assumed: 8-way tensor + sequence parallel inside a node, ZeRO-1 (distributed optimizer),
    # micro-batch 4 (the largest that fits; with the operator model GEMM shapes depend on it, and
    # micro-batch 1 gives tp-8 GEMMs of 2048 x 1024 that run ~15 % slower).
    spec = build_runspec(model="llama-65b", hardware="a100-80gb", gpus=2048, tp=8, sequence_parallel=True,
                         zero=1, seq_len=2048, batch_tokens="4M", tokens="1.4T", micro_batch=4)
    p = plan(spec)
    assert p.fits
    assert p.time.device_hours == pytest.approx(1_022_362, rel=0.15)
    assert p.time.tokens_per_second_per_device == pytest.approx(380, rel=0.15)


def test_mfu_equals_efficiency_without_recompute_bubble_or_exposed_comm():
    p = plan(build_runspec(gpus=1, zero=0, model="gpt2-124m", seq_len=1024, global_batch=8, micro_batch=8))
    assert p.time.exposed_comm_seconds == 0 and p.time.bubble_fraction == 0
    assert p.time.mfu == pytest.approx(p.time.efficiency)
    full = plan(build_runspec(gpus=1, zero=0, model="gpt2-124m", seq_len=1024, global_batch=8, micro_batch=8,
                              recompute="full"))
    assert full.time.hfu == pytest.approx(full.time.efficiency)
    assert full.time.mfu < p.time.mfu


def test_pipeline_bubble():
    # The bubble comes from the schedule over the real stages: the last stage also runs the
    # head and loss, so the bubble sits a little below (p-1)/m and interleaving divides it by ~v.
    base = dict(model="llama2-13b", hardware="a100-80gb", gpus=32, tp=4, pp=4, seq_len=4096, global_batch=64)
    p = plan(build_runspec(**base))
    m = p.spec.layout.grad_accum
    assert 0.7 * 3 / m < p.time.bubble_fraction <= 3 / m
    q = plan(build_runspec(**base, schedule="interleaved", virtual_stages=2))
    assert q.time.bubble_fraction == pytest.approx(p.time.bubble_fraction / 2, rel=0.15)
    assert q.time.step_seconds < p.time.step_seconds
    g = plan(build_runspec(**base, schedule="gpipe"))
    assert g.memory.activations > p.memory.activations


def test_advice_is_computed_by_planning_the_alternatives():
    spec = build_runspec(model="llama2-13b", hardware="a100-80gb", gpus=8, zero=0, micro_batch=4, seq_len=4096)
    p = plan(spec)
    assert not p.fits
    assert p.advice[0].startswith("needs ") and "GiB" in p.advice[0]
    suggestions = [a for a in p.advice if a.startswith("would fit with")]
    assert suggestions
    # Re-plan one suggestion by hand: ZeRO-3 + full recompute + optimizer offload.
    alt = plan(dataclasses.replace(spec, layout=dataclasses.replace(spec.layout, zero_stage=3, recompute="full",
                                                                    offload="optimizer")))
    line = next(a for a in suggestions if "--zero 3 --recompute full --offload optimizer" in a)
    assert alt.fits and f"{alt.memory.total_bytes / GIB:.1f} GiB" in line
    assert plan(dataclasses.replace(spec, layout=dataclasses.replace(spec.layout, micro_batch_size=1))).fits is False


def test_zero_stages_shrink_model_states_as_the_paper_says():
    totals = []
    for zero in range(4):  # one micro-step per step: the ZeRO paper's accounting, no accumulation
        m = plan(build_runspec(model="llama2-7b", gpus=8, zero=zero, global_batch=8)).memory
        totals.append(m.weights + m.gradients + m.optimizer_states + m.master_weights)
    psi = plan(build_runspec()).params.total
    assert totals[0] == pytest.approx(16 * psi)
    assert totals[1] == pytest.approx(4 * psi + 12 * psi / 8)
    assert totals[2] == pytest.approx(2 * psi + 14 * psi / 8)
    assert totals[3] == pytest.approx(16 * psi / 8)
    # with accumulation under FSDP's no-sync (flopwise's trainer) the gradients are whole and fp32 again,
    # and another stack's trainer (torchtitan reduce-scatters every micro-batch) keeps the paper's figure
    accumulating = plan(build_runspec(model="llama2-7b", gpus=8, zero=3, global_batch=64)).memory
    assert accumulating.gradients == pytest.approx(4 * psi)
    titan = plan(build_runspec(model="llama2-7b", gpus=8, zero=3, global_batch=64, stack="torchtitan")).memory
    assert titan.gradients <= accumulating.gradients / 8  # sharded over the 8 ranks


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(gpus=8, dp=3), "dp × tp × pp"),
    (dict(gpus=8, tp=3), "not divisible"),
    (dict(gpus=6, tp=3, dp=2), "does not divide"),
    (dict(gpus=64, pp=64), "more than"),
    (dict(offload="params", zero=2), "--zero 3"),
    (dict(hardware="a100-80gb", precision="fp8"), "fp8"),
    (dict(recompute="sometimes"), "--recompute"),
    (dict(tokens="lots"), "--tokens"),
    (dict(efficiency=1.5), "--efficiency"),
])
def test_invalid_inputs_raise_one_line_user_errors(kwargs, fragment):
    with pytest.raises(UserError) as err:
        build_runspec(**kwargs)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_parse_count():
    assert parse_count("300B") == 300e9
    assert parse_count("1.4T") == pytest.approx(1.4e12)
    assert parse_count("2e12") == 2e12
    assert parse_count("4m") == 4e6
    with pytest.raises(UserError):
        parse_count("1.4X")


def test_layout_defaults_and_batch_rounding():
    spec = build_runspec(gpus=16)
    assert (spec.layout.dp, spec.layout.tp, spec.layout.pp) == (16, 1, 1)
    spec = build_runspec(gpus=16, tp=2, global_batch=100, micro_batch=2)
    assert spec.layout.dp == 8 and spec.layout.global_batch_size == 112  # rounded up to dp*mbs
    assert any("not a multiple" in w for w in plan(spec).warnings)


def test_calibration_from_a_run_directory(tmp_path):
    run = tmp_path / "run1"
    run.mkdir()
    (run / "predicted_vs_measured.json").write_text(json.dumps({"measured": {"mfu": 0.3, "hardware": "cpu"}}))
    p = plan(build_runspec(calibrate=str(run)))
    assert p.time.efficiency == 0.3 and p.time.efficiency_confidence == "measured"
    assert any("measured on cpu" in w for w in p.warnings)
    (run / "predicted_vs_measured.json").write_text("{not json")
    with pytest.raises(UserError):
        build_runspec(calibrate=str(run))
    with pytest.raises(UserError):
        build_runspec(calibrate=str(tmp_path / "missing"))


def test_cnn_plans_per_sample():
    spec = build_runspec(model="resnet50", hardware="a100-80gb", gpus=8, zero=0, global_batch=256, tokens="90M",
                         precision="bf16")
    p = plan(spec)
    assert p.flops.unit == "sample" and p.time.tokens_per_step == 256
    assert p.flops.model_total == pytest.approx(3 * spec.model.flops_per_sample * 90e6)


def test_hardware_without_price_gives_null_cost():
    spec = build_runspec(hardware="rtx4090", model="gpt2-124m", gpus=1, seq_len=1024, global_batch=8)
    unpriced = dataclasses.replace(spec.cluster.hardware, prices=())
    p = plan(dataclasses.replace(spec, cluster=dataclasses.replace(spec.cluster, hardware=unpriced)))
    assert p.cost.on_demand_usd is None and p.cost.spot_usd is None and "--price-per-hour" in p.cost.note
    priced = plan(build_runspec(hardware="rtx4090", model="gpt2-124m", gpus=1, seq_len=1024, global_batch=8,
                                price_per_hour=0.5))
    assert priced.cost.on_demand_usd == pytest.approx(0.5 * priced.time.device_hours)


TINYLLAMA_1B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
                "intermediate_size": 5632, "num_attention_heads": 32, "num_hidden_layers": 22,
                "num_key_value_heads": 4, "vocab_size": 32000, "max_position_embeddings": 2048,
                "tie_word_embeddings": False, "hidden_act": "silu"}


@pytest.mark.parametrize("micro_batch", [1, 4, 8])
def test_a_1b_model_on_16_h100_pure_dp_does_not_default_to_zero_3(tmp_path, micro_batch):
    # ZeRO-3 re-gathers weights each micro-batch across two nodes; a 1.1B model fits without it.
    (tmp_path / "config.json").write_text(json.dumps(TINYLLAMA_1B))
    spec = build_runspec(model=str(tmp_path / "config.json"), gpus=16, seq_len=2048, batch_tokens="2M",
                         micro_batch=micro_batch, tokens="3T")
    assert spec.layout.zero_stage in (1, 2)
    (reason,) = spec.cluster.extra["defaults"]
    assert reason.startswith(f"zero {spec.layout.zero_stage}: fits with") and "zero 3" in reason


def test_a_default_zero_stage_leaves_room_for_the_memory_forecasts_error(tmp_path):
    """At micro-batch 16 ZeRO-2 is the fastest that fits, but by less than the memory forecast's own
    error (±10 %): the planner's default is the stage that fits with that room, and it says why."""
    from flopwise.plan.band import memory_band

    (tmp_path / "config.json").write_text(json.dumps(TINYLLAMA_1B))
    spec = build_runspec(model=str(tmp_path / "config.json"), gpus=16, seq_len=2048, batch_tokens="2M",
                         micro_batch=16, tokens="3T")
    result = plan(spec)
    assert spec.layout.zero_stage == 3
    assert result.memory.allocated_bytes <= (1 - memory_band()) * result.memory.capacity_bytes
    (reason,) = spec.cluster.extra["defaults"]
    assert "zero 2 fits with" in reason and "inside the memory forecast's" in reason
    stated = plan(build_runspec(model=str(tmp_path / "config.json"), gpus=16, seq_len=2048, batch_tokens="2M",
                                micro_batch=16, tokens="3T", zero=2))
    assert stated.memory.fits and stated.time.step_seconds < result.time.step_seconds  # what was passed over


def test_the_default_zero_stage_is_the_fastest_that_fits():
    from flopwise.plan.planner import ZERO_STAGES, _evaluate

    spec = build_runspec(model="llama2-13b", gpus=16)
    chosen = plan(spec)
    for stage in ZERO_STAGES["fsdp"]:
        alt = _evaluate(dataclasses.replace(spec, layout=dataclasses.replace(spec.layout, zero_stage=stage)))
        if alt.fits:
            assert chosen.time.step_seconds <= alt.time.step_seconds * 1.01


def test_a_given_zero_stage_is_kept_and_not_explained():
    spec = build_runspec(gpus=16, zero=3)
    assert spec.layout.zero_stage == 3 and "defaults" not in spec.cluster.extra


def test_megatron_offers_only_its_distributed_optimizer():
    spec = build_runspec(model="llama2-70b", gpus=64, tp=8, framework="megatron")
    assert spec.layout.zero_stage in (0, 1)


def test_tp_and_pp_are_chosen_when_nothing_fits_unsplit():
    spec = build_runspec(model="llama2-70b", gpus=64)
    assert spec.layout.tp * spec.layout.pp > 1 and plan(spec).fits
    assert any(line.startswith(f"tp {spec.layout.tp}, pp {spec.layout.pp}:") for line in spec.cluster.extra["defaults"])
    kept = build_runspec(model="llama2-70b", gpus=64, tp=1)  # a given split is kept, fitting or not
    assert (kept.layout.tp, kept.layout.pp) == (1, 1)


@pytest.mark.parametrize("hardware", ["h800", "a800", "h20", "b200", "gb200"])
def test_the_china_market_and_blackwell_parts_plan(hardware):
    p = plan(build_runspec(model="llama3-8b", hardware=hardware, gpus=8, tp=2, zero=2))
    assert p.fits and 0.0 < p.time.step_seconds < float("inf") and 0.0 < p.time.mfu < 1.0
    assert p.spec.cluster.hardware.key == get_hardware(hardware).key
    json.dumps(p.to_dict())


def test_b200_is_faster_than_h100_on_the_same_layout():
    """2.3x the dense bf16 peak and 2.4x the memory bandwidth: the same layout's step is shorter."""
    layout = dict(model="llama3-8b", gpus=8, tp=2, zero=2, micro_batch=1, global_batch=512)
    h100 = plan(build_runspec(hardware="h100-sxm", **layout))
    b200 = plan(build_runspec(hardware="b200", **layout))
    assert b200.spec.layout == h100.spec.layout
    assert b200.time.step_seconds < h100.time.step_seconds / 1.5


def test_the_nvl72_rack_keeps_a_72_gpu_data_parallel_group_on_nvlink():
    """GB200 NVL72: NVLink reaches the whole 72-GPU rack (scale_up.domain), past the 4-GPU compute
    tray; B200's NVLink ends at the 8-GPU node, so the same group crosses the network."""
    layout = dict(model="llama3-8b", gpus=72, tp=8)
    gb200 = plan(build_runspec(hardware="gb200", **layout))
    b200 = plan(build_runspec(hardware="b200", **layout))
    assert gb200.comm.dp_link == gb200.comm.tp_link == "scale-up"
    assert b200.comm.dp_link == "scale-out"
    assert gb200.comm.dp_seconds < b200.comm.dp_seconds / 5


NEMO_DEEPSEEK_V3_SFT = dict(model="deepseek-v3", hardware="h100-sxm", gpus=992, tp=1, pp=31, virtual_stages=2,
                            schedule="interleaved", ep=8, micro_batch=1, global_batch=3968, seq_len=4096,
                            recompute="full", stack="nemo")
"""NeMo's recommended H100 layout for DeepSeek-V3 SFT (model_configs_h100.csv at NeMo 8cfedd7; its
finetune_deepseek_v3.py recomputes full and sets account_for_loss_in_pipeline_split): 61 layers, 62 chunks."""


def test_nemo_deepseek_v3_sft_layout_plans_with_the_loss_in_a_layers_slot():
    spec = build_runspec(**NEMO_DEEPSEEK_V3_SFT)
    p = plan(spec)
    assert math.isfinite(p.time.step_seconds) and p.time.step_seconds > 0
    assert math.isfinite(p.memory.total_bytes) and p.fits
    assert p.time.stage_layers == ",".join(["1+1"] * 30 + ["1+0"])  # the last chunk: the output layer and loss
    assert any("account_for_loss_in_pipeline_split" in note for note in p.to_dict()["defaults"])
    # each stage's memory counts the blocks its chunks hold: device 0 the embedding, dense block 0 and
    # MoE block 31; device 30 block 30, the final norm and the head
    pc, split = count_params(spec.model), split_layers(61, 31, 2, False, True)
    stages = every_stage_memory(spec)
    assert [s.layers for s in stages] == [2] * 30 + [1]
    for s in stages:
        assert s.params == pytest.approx(sc.device_params(pc, split, s.stage, False, ep=8))
    assert stages[p.memory.worst_stage].layers == 2
    # the step is timed on its busiest device, two layers (and the embedding): twice the GEMM time of a
    # layout whose busiest device runs one layer
    one = dataclasses.replace(spec, layout=dataclasses.replace(spec.layout, pp=61, virtual_stages=1,
                                                               pipeline_schedule="1f1b"))
    per_micro_batch = p.time.gemm_seconds / spec.layout.grad_accum
    assert per_micro_batch == pytest.approx(2 * plan(one).time.gemm_seconds / spec.layout.grad_accum)


LOSS_SLOT, BOTH_SLOTS = "account_for_loss_in_pipeline_split)", "account_for_embedding_in_pipeline_split and"


@pytest.mark.parametrize("layout, slots, stage_layers", [
    (dict(gpus=33, pp=11, virtual_stages=3), LOSS_SLOT, "1+1+1," * 10 + "1+1+0"),
    (dict(gpus=34, pp=17, virtual_stages=2), BOTH_SLOTS, "0+1," + "1+1," * 15 + "1+0"),
    (dict(gpus=33, pp=33), LOSS_SLOT, "1," * 32 + "0"),  # one stage per chunk alike
    (dict(gpus=34, pp=34), BOTH_SLOTS, "0," + "1," * 32 + "0"),
])
def test_a_dense_model_with_one_or_two_chunks_more_than_layers_plans_under_megatron_core(layout, slots, stage_layers):
    spec = build_runspec(model="llama3-8b", hardware="h100-sxm", stack="megatron-core", global_batch=64,
                         seq_len=4096, **layout)
    p = plan(spec)
    assert math.isfinite(p.time.step_seconds) and math.isfinite(p.memory.total_bytes)
    assert p.time.stage_layers == stage_layers
    assert any(slots in note and "Megatron-Core" in note for note in p.to_dict()["defaults"])


@pytest.mark.parametrize("stack, layout, fragment", [
    ("torchtitan", dict(gpus=33, pp=11, virtual_stages=3), "(11 × 3) is more than 32 layers"),
    ("torchtitan", dict(gpus=34, pp=17, virtual_stages=2), "(17 × 2) is more than 32 layers"),
    ("flopwise", dict(gpus=33, pp=33), "--pp 33 is more than llama3-8b's 32 layers"),
    ("megatron-core", dict(gpus=35, pp=35), "its embedding and loss (which megatron-core counts as a layer each)"),
    ("megatron-core", dict(gpus=36, pp=12, virtual_stages=3), "(12 × 3) is more than 32 layers and its embedding"),
])
def test_more_chunks_than_layers_is_refused_in_one_line_where_the_stack_cannot_fill_them(stack, layout, fragment):
    with pytest.raises(UserError) as err:
        build_runspec(model="llama3-8b", hardware="h100-sxm", stack=stack, global_batch=64, seq_len=4096, **layout)
    assert fragment in str(err.value) and "\n" not in str(err.value)
