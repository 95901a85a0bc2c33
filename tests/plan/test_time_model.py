"""The operator-level time model: GEMM curves, operators, recompute, pipelines, DP schedules, profiles."""

import dataclasses
import math

import pytest

from flopwise.catalog.hardware import load_hardware
from flopwise.catalog.models import get_model
from flopwise.plan import ops
from flopwise.plan.gemm import curve_for, device_rates, gemm_fraction
from flopwise.plan.planner import build_runspec, plan
from flopwise.plan.search import above_published, search_layouts
from flopwise.plan import stage_memory, timing
from flopwise.plan.timing import end_slots, split_layers


def test_gemm_curve_reaches_the_micro_benchmark_at_its_shape_and_drops_for_awkward_shapes():
    a100 = curve_for(load_hardware()["a100-80gb"])
    m, n, k = a100.mamf_shape
    assert gemm_fraction(a100, m, n, k) == pytest.approx(a100.mamf_fraction * a100.sustained)
    big = gemm_fraction(a100, 8192, 8192, 8192)
    assert gemm_fraction(a100, 8192, 8192, 64) < 0.6 * big  # small K: the tile's fixed cost dominates
    assert gemm_fraction(a100, 8192, 8192 + 1, 8192) < big  # one column too many: a padded tile column
    assert gemm_fraction(a100, 128, 128, 8192) < 0.05  # one tile: 1 of 108 SMs busy


@pytest.mark.parametrize(("key", "family"), [("h800", "hopper"), ("h20", "hopper"), ("h200", "hopper"),
                                           ("a800-80gb", "ampere"), ("b200", "blackwell"), ("gb200", "blackwell")])
def test_each_part_takes_its_familys_gemm_curve(key, family):
    """H800 and H20 are GH100 with links or rate cut, A800 an A100 with NVLink cut; Blackwell's GEMM
    ceiling is its own MAMF (B200 77.6 %, GB200 72.9 % of the dense bf16 peak), its sustained factor
    Hopper's."""
    curve = curve_for(load_hardware()[key])
    assert curve.family == family
    if family == "blackwell":
        m, n, k = curve.mamf_shape
        assert gemm_fraction(dataclasses.replace(curve, sustained=1.0), m, n, k) == pytest.approx(
            {"b200": 0.776, "gb200": 0.729}[key], rel=1e-6)
        assert curve.sustained == curve_for(load_hardware()["h100-sxm"]).sustained


def test_recompute_adds_exactly_the_rerun_operators():
    spec = build_runspec(model="llama2-7b", hardware="h100-sxm", gpus=8)
    hw, lay, work = spec.cluster.hardware, spec.layout, spec.workload
    rates = device_rates(hw, "bf16", hw.peak_flops("bf16"))

    def times(recompute):
        return ops.layer_times(spec.model, work.seq_len, lay.micro_batch_size, 1, False, True, False, recompute,
                               "bf16", rates)

    none, selective, full = times("none"), times("selective"), times("full")
    assert none.recompute == 0
    assert full.recompute == pytest.approx(none.forward)
    assert 0 < selective.recompute < full.recompute
    assert full.total == pytest.approx(none.total + none.forward)


def test_memory_bound_operators_cost_more_on_a_slower_memory():
    spec = build_runspec(model="gpt2-124m", hardware="h100-sxm", gpus=1, seq_len=1024, global_batch=8, micro_batch=8)
    slow = dataclasses.replace(spec.cluster.hardware, memory_bandwidth_gbs=500.0)
    fast, slowed = plan(spec), plan(dataclasses.replace(spec, cluster=dataclasses.replace(spec.cluster, hardware=slow)))
    assert slowed.time.memory_bound_seconds > 5 * fast.time.memory_bound_seconds
    assert slowed.time.gemm_seconds >= fast.time.gemm_seconds  # small GEMMs hit the roofline's memory side too


def test_uneven_interleaved_pipeline_is_planned_and_stated():
    split = split_layers(126, 16, 2)
    assert sum(map(sum, split)) == 126
    assert split[0][0] <= split[1][0] and split[-1][-1] <= split[1][-1]  # end chunks carry embedding / head
    p = plan(build_runspec(model="llama3.1-405b", hardware="h100-sxm", gpus=2048, tp=8, pp=16, zero=1,
                           schedule="interleaved", virtual_stages=2, sequence_parallel=True, seq_len=8192,
                           global_batch=2048))
    one_f_one_b = plan(build_runspec(model="llama3.1-405b", hardware="h100-sxm", gpus=2048, tp=8, pp=16, zero=1,
                                     sequence_parallel=True, seq_len=8192, global_batch=2048))
    assert p.time.stage_layers.count(",") == 15 and "+" in p.time.stage_layers
    assert p.time.bubble_fraction < one_f_one_b.time.bubble_fraction


def _split_before_the_ends_took_slots(n_layers, pp, virtual):
    """`split_layers` as it was before an end could take a layer's slot (the reference: a layout with
    a layer for every chunk must split as before)."""
    chunks = pp * virtual
    base, extra = divmod(n_layers, chunks)
    counts = [base] * chunks
    order = list(range(1, chunks - 1)) + [chunks - 1, 0] if chunks > 2 else list(range(chunks))[::-1]
    for c in order[:extra]:
        counts[c] += 1
    return tuple(tuple(counts[c] for c in range(dev, chunks, pp)) for dev in range(pp))


def test_a_layout_with_a_layer_for_every_chunk_splits_as_before_under_every_stack():
    for n in range(1, 130):
        for pp in range(1, 33):
            for v in range(1, 5):
                if pp * v <= n:
                    assert split_layers(n, pp, v) == _split_before_the_ends_took_slots(n, pp, v)
                    assert end_slots(n, pp, v, "megatron-core") == (False, False)


@pytest.mark.parametrize("layout", [dict(gpus=64, tp=4, pp=8, virtual_stages=2),
                                    dict(gpus=64, tp=4, pp=4, virtual_stages=5), dict(gpus=128, tp=4, pp=32)])
def test_a_layout_with_a_layer_for_every_chunk_plans_as_before(monkeypatch, layout):
    spec = build_runspec(model="llama3-70b", hardware="h100-sxm", stack="megatron-core", global_batch=128,
                         seq_len=8192, **layout)
    now = plan(spec)

    def before(s):
        v = s.layout.virtual_stages if s.layout.pipeline_schedule == "interleaved" else 1
        return _split_before_the_ends_took_slots(s.model.n_layers, s.layout.pp, v)

    monkeypatch.setattr(timing, "pipeline_split", before)
    monkeypatch.setattr(stage_memory, "pipeline_split", before)
    old = plan(spec)
    assert now.time.step_seconds == old.time.step_seconds and now.memory.total_bytes == old.memory.total_bytes
    assert not any("account_for" in note for note in spec.cluster.extra.get("defaults", ()))


def test_megatron_counts_the_loss_then_the_embedding_as_a_layer_when_chunks_outnumber_layers():
    # NeMo's DeepSeek-V3 SFT: 61 layers in 31 × 2 chunks, the loss alone in the last (account_for_loss)
    assert end_slots(61, 31, 2, "megatron-core") == (False, True)
    split = split_layers(61, 31, 2, False, True)
    assert split[0] == (1, 1) and split[-1] == (1, 0) and set(split[1:-1]) == {(1, 1)}
    # two chunks more: the embedding alone in the first as well; one stage per chunk alike
    assert end_slots(32, 17, 2, "megatron-core") == (True, True) == end_slots(32, 34, 1, "megatron-lm")
    assert split_layers(32, 17, 2, True, True)[0] == (0, 1) and split_layers(32, 34, 1, True, True)[-1] == (0,)
    # three more, or a stack that does not count them: no slot (the planner refuses the layout)
    assert end_slots(32, 35, 1, "megatron-core") == (False, False) == end_slots(61, 31, 2, "torchtitan")
    # where Megatron-Core's own rule applies ((L + ends) divisible by p·v), the same split: 126 layers and
    # both ends over 16 stages are 8 slots each, the ends' stages 7 layers (transformer_block.get_num_layers_to_build)
    assert split_layers(126, 16, 1, True, True) == ((7,),) + ((8,),) * 14 + ((7,),)
    assert split_layers(126, 8, 8, True, True)[0][0] == 1 and split_layers(126, 8, 8, True, True)[-1][-1] == 1


def test_zero3_regathers_cost_only_what_compute_does_not_hide():
    # short micro-batches: each forward is shorter than the weight all-gather across two nodes
    short = dict(model="llama2-7b", hardware="h100-sxm", gpus=16, seq_len=512, global_batch=256, micro_batch=1)
    zero1, zero3 = plan(build_runspec(zero=1, **short)), plan(build_runspec(zero=3, **short))
    assert zero3.comm.dp_bytes > 5 * zero1.comm.dp_bytes
    assert zero3.time.dp_exposed_seconds > zero1.time.dp_exposed_seconds
    assert zero1.time.step_seconds < zero3.time.step_seconds
    # long micro-batches hide the prefetched gathers behind compute
    long = dict(short, seq_len=4096, micro_batch=4)
    zero3_long = plan(build_runspec(zero=3, **long))
    assert zero3_long.time.exposed_comm_share < 0.05


def test_zero3_reduces_every_micro_batch_only_under_deepspeed():
    spec = build_runspec(model="llama2-7b", hardware="a100-80gb", gpus=32, zero=3, seq_len=2048, global_batch=256,
                         micro_batch=1)
    deepspeed = dataclasses.replace(spec, layout=dataclasses.replace(spec.layout, framework="deepspeed"))
    assert plan(deepspeed).comm.dp_bytes > plan(spec).comm.dp_bytes


def test_tp_comm_overlap_hides_tensor_parallel_traffic():
    common = dict(model="llama2-70b", hardware="h100-sxm", gpus=64, tp=8, pp=2, zero=1, sequence_parallel=True)
    plain, overlapped = plan(build_runspec(**common)), plan(build_runspec(tp_comm_overlap=True, **common))
    assert overlapped.time.tp_exposed_seconds < plain.time.tp_exposed_seconds
    assert overlapped.time.step_seconds < plain.time.step_seconds


class MeasuredProfile:
    """A measured device profile as `flopwise calibrate` writes it (the DeviceProfile interface)."""

    memory_bandwidth_bytes_per_s = 1e12

    def gemm_flops_per_s(self, m, n, k, dtype):
        return 100e12 if dtype == "bf16" else None

    def peak_flops(self, dtype):
        return 120e12


def test_a_measured_profile_replaces_the_curve():
    spec = build_runspec(model="gpt2-124m", hardware="a100-80gb", gpus=1, seq_len=1024, global_batch=8, micro_batch=8)
    base, profiled = plan(spec), plan(spec, profile=MeasuredProfile())
    assert profiled.time.efficiency_confidence == "measured"
    assert profiled.time.gemm_seconds > base.time.gemm_seconds  # 100 TFLOP/s is below the A100 curve


def test_search_marks_mfu_above_the_best_published_run():
    spec = build_runspec(model="gpt3-1.3b", hardware="a100-80gb", gpus=1, global_batch=512, seq_len=2048,
                         tokens="26B")
    result = search_layouts(spec, 64, top=3)
    data = result.to_dict()
    assert data["best_published_mfu"]["mfu"] == pytest.approx(0.6423)
    for entry, p in zip(data["ranked"], result.ranked):
        assert entry["above_best_published_mfu"] == above_published(p) == (p.time.mfu > 0.6423)
        assert 0 <= entry["exposed_comm_share"] < 1


def test_every_kth_block_recompute_reruns_that_share_of_forwards():
    spec = build_runspec(model="llama2-7b", hardware="h100-sxm", gpus=8)
    hw, lay, work = spec.cluster.hardware, spec.layout, spec.workload
    rates = device_rates(hw, "bf16", hw.peak_flops("bf16"))
    none, every4 = (ops.layer_times(spec.model, work.seq_len, lay.micro_batch_size, 1, False, True, False, rc, "bf16",
                                    rates) for rc in ("none", "every-4"))
    assert ops.full_recompute_share("every-4") == 0.25 and ops.full_recompute_share("none") == 0
    assert every4.recompute == pytest.approx(none.forward / 4)


def test_a_recomputed_share_of_blocks_adds_that_share_of_a_third_of_the_training_flops():
    """`blocks:F` re-runs F of every block's forward: HFU/MFU = 1 + F/3 (how PaLM's stated HFU 57.8 %
    and MFU 46.2 % are planned), and the layer's recompute time is F of its forward, on a stack whose
    recompute re-runs whole blocks (torchtitan's FullAC; flopwise's early stop skips the down projections)."""
    spec = build_runspec(model="llama2-7b", hardware="h100-sxm", gpus=8, recompute="blocks:0.75", stack="torchtitan")
    result = plan(spec)
    assert result.flops.hardware_per_unit / result.flops.model_per_unit == pytest.approx(1 + 0.75 / 3)
    assert result.time.hfu / result.time.mfu == pytest.approx(1 + 0.75 / 3)
    hw, lay, work = spec.cluster.hardware, spec.layout, spec.workload
    rates = device_rates(hw, "bf16", hw.peak_flops("bf16"))
    none, share = (ops.layer_times(spec.model, work.seq_len, lay.micro_batch_size, 1, False, True, False, rc, "bf16",
                                   rates) for rc in ("none", "blocks:0.75"))
    assert share.recompute == pytest.approx(0.75 * none.forward)


def test_megatron_leaves_its_embedding_bucket_exposed_and_ddp_a_25_mb_bucket():
    """Megatron-Core's buckets are max(40M, 1M x dp) parameters and never split a parameter, so
    the last one reduced (and the first gathered) holds at least the embedding; PyTorch DDP's are 25 MB."""
    from flopwise.plan.timing import last_bucket_share

    params, embedding = 1.745e9, 131072 * 2048
    assert last_bucket_share("megatron", params, 4.0, 48, embedding) == pytest.approx(embedding / params)
    assert last_bucket_share("megatron", params, 4.0, 48, 0.0) == pytest.approx(48e6 / params)
    assert last_bucket_share("megatron", params, 4.0, 8, 0.0) == pytest.approx(40e6 / params)
    ddp_buckets = math.ceil(params * 4 / 2**20 / 25)
    assert last_bucket_share("fsdp", params, 4.0, 48, embedding) == pytest.approx(1 / ddp_buckets)
    assert last_bucket_share("megatron", 1e7, 4.0, 48, 0.0) == 1.0


def test_the_time_model_reduces_gradients_as_the_stack_says():
    """Megatron-LM 2021 all-reduces after the whole forward-backward (its stack: overlap_grad_reduce
    False): every second of the reduction is exposed; Megatron-Core overlaps it with the backward."""
    from flopwise.plan.timing import stack_dp_overlap

    assert stack_dp_overlap("megatron-lm") == (False, False)
    assert stack_dp_overlap("megatron-core") == (True, True)
    assert stack_dp_overlap("no-such-stack") == (True, True)
    layout = dict(model="llama2-7b", hardware="a100-80gb", gpus=32, zero=0, framework="megatron")
    lm, mcore = (plan(dataclasses.replace(build_runspec(**layout), stack=name)) for name in ("megatron-lm",
                                                                                           "megatron-core"))
    assert lm.time.dp_exposed_seconds == pytest.approx(lm.comm.dp_seconds)
    assert mcore.time.dp_exposed_seconds < 0.5 * mcore.comm.dp_seconds


def test_a_parallel_block_reduces_its_two_branches_once():
    """Sequential blocks reduce attention's and the MLP's outputs (forward) and inputs (backward):
    2 + 2. A parallel block adds the branches and reduces once forward (GPT-NeoX `gpt_j_residual`,
    PaLM); backward, one input gradient per norm (NeoX-20B's two untied norms, PaLM's one)."""
    from flopwise.plan.timing import tp_collectives_per_layer

    sequential = _gpt175b()
    neox = dataclasses.replace(sequential, parallel_block=True)
    palm = dataclasses.replace(sequential, parallel_block=True, norms_per_layer=1)
    assert tp_collectives_per_layer(sequential) == (2, 2)
    assert tp_collectives_per_layer(neox) == (1, 2)
    assert tp_collectives_per_layer(palm) == (1, 1)
    layout = dict(hardware="a100-80gb", gpus=8, tp=8, seq_len=2048, global_batch=8)
    seq_plan, par_plan = (plan(dataclasses.replace(build_runspec(model="llama2-7b", **layout),
                                                   model=dataclasses.replace(get_model("llama2-7b"), parallel_block=p,
                                                                             norms_per_layer=1 if p else 2)))
                          for p in (False, True))
    assert par_plan.comm.tp_bytes < 0.6 * seq_plan.comm.tp_bytes
    assert par_plan.time.tp_exposed_seconds < seq_plan.time.tp_exposed_seconds


def _gpt175b():
    from flopwise.catalog.models import ModelSpec

    return ModelSpec(key="gpt-175b", name="GPT 175B", n_layers=96, hidden=12288, n_heads=96, ffn_hidden=4 * 12288,
                     vocab_size=51200, seq_len=2048, max_positions=2048, mlp="gelu", norm="layernorm",
                     position="learned", tied_embeddings=True, attn_bias=True, mlp_bias=True)


def test_zero3_at_one_sequence_per_gpu_is_comm_bound_and_ptd_is_not():
    """Narayanan et al. 2021 Table 2: 175B on 1,536 A100, ZeRO-3 (DeepSpeed, micro-batch 1)
    ran at 44 TFLOP/s against PTD's 141: its gathers across nodes dominate the step. The plan
    must say so: exposed data-parallel time above the compute, where PTD's is negligible."""
    from flopwise.catalog.hardware import get_hardware
    from flopwise.plan.planner import plan
    from flopwise.plan.spec import Cluster, Layout, RunSpec, Workload

    work = Workload(precision="fp16", optimizer="adamw", seq_len=2048, total_tokens=1e9)
    cluster = Cluster(hardware=get_hardware("a100-80gb"))
    zero3 = plan(RunSpec(_gpt175b(), Layout(dp=1536, micro_batch_size=1, zero_stage=3, recompute="full",
                                            flash_attention=False, framework="deepspeed"), work, cluster,
                         stack="deepspeed")).time
    ptd = plan(RunSpec(_gpt175b(), Layout(dp=16, tp=8, pp=12, micro_batch_size=1, grad_accum=96, recompute="full",
                                          flash_attention=False, framework="megatron"), work, cluster,
                       stack="megatron-lm")).time
    assert zero3.dp_exposed_seconds > zero3.compute_seconds
    assert ptd.dp_exposed_seconds < 0.05 * ptd.step_seconds
    assert zero3.tokens_per_second < 0.5 * ptd.tokens_per_second  # published: 44 / 141
    # more sequences per GPU give prefetch compute to hide behind: the share exposed falls
    four = plan(RunSpec(_gpt175b(), Layout(dp=384, micro_batch_size=4, zero_stage=3, recompute="full",
                                           flash_attention=False, framework="deepspeed"), work, cluster,
                        stack="deepspeed")).time
    assert four.exposed_comm_share < 0.5 * zero3.exposed_comm_share


def test_mla_projections_split_as_megatron_core_splits_them():
    """q_a and kv_a are replicated over tensor parallelism: each rank runs them whole, on its
    sequence shard under sequence parallelism and on every token without; q_b and kv_b are
    column-parallel, o row-parallel (T = 4096 tokens, tp 2)."""
    v3 = get_model("deepseek-v3")
    h, a, T = 7168, 128, 4096
    with_sp = ops.attention_gemms(v3, T, 2, True)
    assert sorted(with_sp) == sorted([
        (T // 2, 1536, h, 1.0), (T // 2, 512 + 64, h, 1.0),  # q_a, kv_a
        (T, a * 192 // 2, 1536, 1.0), (T, a * (128 + 128) // 2, 512, 1.0),  # q_b, kv_b
        (T, h, a * 128 // 2, 1.0)])  # o
    without = ops.attention_gemms(v3, T, 2, False)
    assert {m for m, n, k, _ in without if k == h} == {T}
    no_query_latent = ops.attention_gemms(dataclasses.replace(v3, q_lora_rank=0), T, 2, True)
    assert (T, a * 192 // 2, h, 1.0) in no_query_latent and len(no_query_latent) == 4


def test_mla_attention_core_runs_query_key_and_value_widths():
    """Under a flat efficiency the attention core's time is its FLOPs: Q·Kᵀ over d_qk and A·V over
    d_v, so DeepSeek-V3's (192, 128) costs (192 + 128) / (192 + 192) of value heads as wide as
    the query's."""
    hw = load_hardware()["h100-sxm"]
    rates = device_rates(hw, "bf16", hw.peak_flops("bf16"), efficiency=0.5)
    v3 = get_model("deepseek-v3")
    wide_values = dataclasses.replace(v3, v_head_dim=192)
    core = [ops.layer_times(spec, 4096, 1, 1, False, True, False, "none", "bf16", rates).attention
            for spec in (v3, wide_values)]
    assert core[0] / core[1] == pytest.approx((192 + 128) / (192 + 192))
