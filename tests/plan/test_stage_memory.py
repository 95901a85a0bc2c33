"""plan/stage_memory.py: per-stage memory with embedding and head where they really are."""

import dataclasses

import pytest

from flopwise.catalog.hardware import get_hardware
from flopwise.catalog.models import get_model
from flopwise.plan import stage_memory as sm
from flopwise.plan.params import count_params
from flopwise.plan.planner import build_runspec, plan
from flopwise.plan.spec import Cluster, Layout, RunSpec, Workload


def test_uneven_split_keeps_the_ends_light():
    assert sm.stage_layers(126, 16) == (7,) + (8,) * 14 + (7,)
    assert sm.stage_layers(80, 4) == (20, 20, 20, 20)
    assert sum(sm.stage_layers(61, 8)) == 61 and sm.stage_layers(61, 1) == (61,)


def test_inflight_micro_batches_by_schedule():
    # 1F1B warm-up depth p − i; interleaved first stage: Korthikanti's 1 + (p−1)/(p·v).
    assert [sm.inflight_chunks(i, 4, 8, "1f1b", 1) for i in range(4)] == [4, 3, 2, 1]
    assert sm.inflight_chunks(0, 4, 8, "interleaved", 2) == pytest.approx(4 * (1 + 3 / 8))
    assert sm.inflight_chunks(0, 4, 8, "gpipe", 1) == 8
    assert sm.inflight_chunks(0, 4, 2, "1f1b", 1) == 2  # fewer micro-batches than stages



def test_interleaved_variants_hold_what_torchs_schedules_hold():
    # peaks counted from torch's own action lists (Schedule{Interleaved1F1B,InterleavedZeroBubble}
    # ._calculate_single_rank_operations: forwards done less weight passes done), p=2 v=2 m=4
    assert [sm.inflight_chunks(i, 2, 4, "interleaved", 2) * 2 for i in range(2)] == [5, 3]
    assert sm.inflight_chunks(0, 4, 8, "interleaved", 2, "zero-bubble") * 2 == 8  # (v-1)·r + p, r = 4
    assert sm.inflight_chunks(0, 2, 4, "interleaved", 2, "zero-bubble") * 2 == 4
    assert sm.inflight_chunks(1, 2, 4, "interleaved", 2, "zero-bubble") * 2 == 4 + 4 / 2  # + the kept losses
    assert sm.inflight_chunks(0, 2, 4, "interleaved", 2, "looped-bfs") == 4  # every micro-batch, every chunk
    assert sm.held_loss_micro_batches(2, 4, "gpipe") == 4 == sm.held_loss_micro_batches(2, 4, "interleaved",
                                                                                           "looped-bfs")
    assert sm.held_loss_micro_batches(2, 4, "1f1b") == 1 == sm.held_loss_micro_batches(2, 4, "interleaved")


def _spec(model, pp, tp=8, framework="megatron", vocab_heavy=True):
    return RunSpec(get_model(model), Layout(dp=2, tp=tp, pp=pp, micro_batch_size=1, grad_accum=16, zero_stage=1,
                                            sequence_parallel=True, framework=framework),
                   Workload(seq_len=4096, total_tokens=1e9), Cluster(get_hardware("h100-sxm")))


def test_embedding_and_head_sit_on_the_first_and_last_stage_not_averaged():
    spec = _spec("llama3-70b", 4)
    pc = count_params(spec.model)
    memory = sm.estimate_memory(spec, pc, [])
    first, middle, last = memory.stages[0], memory.stages[1], memory.stages[-1]
    assert first.params - middle.params == pytest.approx((pc.embedding + pc.other) / 8)
    assert last.params - middle.params == pytest.approx((pc.output_head + pc.final_norm) / 8)
    assert sum(s.params for s in memory.stages) == pytest.approx(pc.total / 8)
    assert last.logits > 0 and first.logits == 0 == middle.logits
    # the first stage holds p micro-batches in flight: it is the busiest here, and is the device figure
    assert memory.worst_stage == 0 and memory.total_bytes == first.total_bytes
    assert first.inflight_layers == 20 * 4 and last.inflight_layers == 20


def test_pipeline_stage_json_lists_every_stage():
    data = plan(build_runspec(model="llama3-70b", gpus=64, tp=8, pp=4, sequence_parallel=True)).to_dict()
    stages = data["memory"]["stages"]
    assert [s["stage"] for s in stages] == [0, 1, 2, 3] and sum(s["layers"] for s in stages) == 80
    assert data["memory"]["worst_stage"] in range(4)
    assert max(s["total_bytes"] for s in stages) == data["memory"]["per_device_bytes"]["total"]


def test_fsdp_in_a_stage_holds_shards_and_a_gathered_copy_for_the_pass():
    base = _spec("llama3-8b", 2, tp=1, framework="fsdp")
    zero3 = RunSpec(base.model, Layout(dp=8, pp=2, grad_accum=8, zero_stage=3), base.workload, base.cluster)
    stage = sm.estimate_memory(zero3, count_params(zero3.model), []).stages[1]
    assert stage.weights == pytest.approx(stage.params * 2 / 8)  # bf16 shards stay resident
    # whole bf16 weights + unsharded gradients, upcast to fp32 to accumulate (FSDP2's reduce dtype)
    assert stage.comm_buffers == pytest.approx(stage.params * (2 + 4))


def test_tensor_parallel_without_fsdp_holds_the_whole_embedding_gradient():
    spec = RunSpec(get_model("llama3-8b"), Layout(dp=1, tp=2, pp=2, grad_accum=4),
                   Workload(seq_len=1024, precision="fp32"), Cluster(get_hardware("h100-sxm")))
    pc = count_params(spec.model)
    first, last = sm.estimate_memory(spec, pc, []).stages
    assert first.gradients - first.weights == pytest.approx(pc.embedding / 2 * 4)  # the other half, fp32
    assert last.gradients == pytest.approx(last.weights)


def test_allocator_reserve_is_on_top_of_allocated_and_does_not_decide_the_fit():
    spec = _spec("llama3-8b", 1, tp=1, framework="fsdp")
    memory = sm.estimate_memory(spec, count_params(spec.model), [])
    held = memory.weights + memory.master_weights + memory.optimizer_states
    assert held > 0
    # the slack is a share of what each step allocates and frees; the states held all run add none
    assert memory.allocator_reserve == pytest.approx(0.10 * (memory.allocated_bytes - held))
    assert memory.fits == (memory.allocated_bytes <= memory.capacity_bytes)


def test_a_larger_optimizer_adds_no_allocator_slack():
    adamw = _spec("llama3-8b", 1, tp=1, framework="fsdp")
    sgd = dataclasses.replace(adamw, workload=dataclasses.replace(adamw.workload, optimizer="sgd"))
    small, large = (sm.estimate_memory(s, count_params(s.model), []) for s in (sgd, adamw))
    assert large.optimizer_states > small.optimizer_states
    assert small.allocator_reserve == pytest.approx(large.allocator_reserve)


@pytest.mark.parametrize("model, pp, schedule, accum", [
    ("llama3.1-405b", 16, "1f1b", 32), ("llama3.1-405b", 16, "1f1b", 4), ("llama3-70b", 8, "interleaved", 16),
    ("llama3-70b", 5, "gpipe", 8), ("gpt3-175b", 12, "1f1b", 64), ("llama3-8b", 2, "1f1b", 8),
])
def test_the_busiest_stage_is_among_the_candidates(model, pp, schedule, accum):
    spec = RunSpec(get_model(model), Layout(dp=2, tp=8, pp=pp, grad_accum=accum, zero_stage=1, sequence_parallel=True,
                                            pipeline_schedule=schedule, virtual_stages=2 if schedule == "interleaved" else 1),
                   Workload(seq_len=4096), Cluster(get_hardware("h100-sxm")))
    pc = count_params(spec.model)
    every, few = sm.estimate_memory(spec, pc, []), sm.estimate_memory(spec, pc, [], every_stage=False)
    assert few.total_bytes == every.total_bytes and few.worst_stage == every.worst_stage
    assert len(every.stages) == pp and len(few.stages) <= 3


@pytest.mark.parametrize("layers, dense, candidates", [
    ((4, 4, 4, 4), None, (0, 3)), ((3, 4, 4, 4, 3), (3, 0, 0, 0, 0), (0, 1, 4)),
    ((4, 4, 4, 4), (4, 2, 0, 0), (0, 1, 2, 3)), ((4, 4, 4, 4, 4), (4, 0, 0, 0, 0), (0, 1, 4)),
    ((2, 2, 2, 2, 1), (1, 1, 1, 0, 0), (0, 1, 2, 3, 4)),  # interleaved: a dense block in each of three stages
])
def test_stages_holding_lighter_dense_blocks_and_the_first_past_them_are_candidates(layers, dense, candidates):
    assert sm.busiest_stage_candidates(layers, dense) == candidates


@pytest.mark.parametrize("pp, ep", [(16, 8), (8, 1), (4, 4)])
def test_deepseek_stages_hold_their_dense_blocks_and_the_busiest_is_a_candidate(pp, ep):
    """DeepSeek-V3's first three blocks hold a dense MLP (0.4B) in place of 256 experts (11.3B):
    the first stage holds that much less, and the busiest stage is still found among the few."""
    model = get_model("deepseek-v3")
    spec = RunSpec(model, Layout(dp=8, tp=1, pp=pp, ep=ep, grad_accum=32, zero_stage=1), Workload(seq_len=4096),
                   Cluster(get_hardware("h100-sxm")))
    pc = count_params(model)
    every, few = sm.estimate_memory(spec, pc, []), sm.estimate_memory(spec, pc, [], every_stage=False)
    assert few.total_bytes == every.total_bytes and few.worst_stage == every.worst_stage
    layers = sm.stage_layers(61, pp)
    moe_block = pc.per_layer - pc.experts_elsewhere_per_layer(ep)
    dense_block = pc.attention_per_layer + pc.norms_per_layer + pc.dense_mlp_per_layer
    first = pc.embedding + 3 * dense_block + (layers[0] - 3) * moe_block
    assert every.stages[0].params == pytest.approx(first)
    assert every.stages[1].params == pytest.approx(layers[1] * moe_block)


@pytest.mark.parametrize("pp, virtual, ep", [(16, 3, 1), (16, 3, 8), (8, 4, 8)])
def test_an_interleaved_stage_holds_the_blocks_of_its_own_chunks(pp, virtual, ep):
    """DeepSeek-V3 over 16 devices × 3 chunks: device 0 runs chunks 0, 16 and 32, one dense block and
    two MoE ones, not the first three (dense) blocks; its memory counts the parameters the step's
    time counts for it (`step_comm.device_params`), and the busiest stage is still among the few."""
    from flopwise.plan import step_comm as sc
    from flopwise.plan.timing import split_layers

    model = get_model("deepseek-v3")
    spec = RunSpec(model, Layout(dp=8, tp=1, pp=pp, ep=ep, grad_accum=32, zero_stage=1,
                                 pipeline_schedule="interleaved", virtual_stages=virtual),
                   Workload(seq_len=4096), Cluster(get_hardware("h100-sxm")))
    pc = count_params(model)
    split = split_layers(61, pp, virtual)
    every, few = sm.estimate_memory(spec, pc, []), sm.estimate_memory(spec, pc, [], every_stage=False)
    for stage in every.stages:
        assert stage.layers == sum(split[stage.stage])
        assert stage.params == pytest.approx(sc.device_params(pc, split, stage.stage, model.tied_embeddings, ep))
    assert few.total_bytes == every.total_bytes and few.worst_stage == every.worst_stage


def test_a_stage_may_hold_the_embedding_or_the_head_alone():
    """Megatron-Core with two stages more than layers (account_for_embedding/loss_in_pipeline_split):
    the first stage holds the embedding and no block, the last the final norm, head and logits; block 0
    sits on stage 1 without the embedding."""
    spec = build_runspec(model="llama3-8b", hardware="h100-sxm", gpus=34, pp=34, stack="megatron-core",
                         global_batch=64, seq_len=4096)
    pc = count_params(spec.model)
    stages = sm.every_stage_memory(spec)
    assert [s.layers for s in stages] == [0] + [1] * 32 + [0]
    assert stages[0].params == pc.embedding + pc.other and stages[0].activations > 0  # the token ids
    assert stages[1].params == pc.per_layer and stages[1].logits == 0
    assert stages[-1].params == pc.final_norm + pc.output_head and stages[-1].logits > 0
    assert stages[-1].inflight_layers == 0
    assert sum(s.params for s in stages) == pc.total
    few = sm.estimate_memory(spec, pc, [], every_stage=False)
    assert few.total_bytes == max(s.total_bytes for s in stages)
