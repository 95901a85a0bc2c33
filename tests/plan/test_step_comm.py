"""plan/step_comm.py: the collectives of one step and the bytes each rank sends, exact on a small spec.

The spec is the tiny llama of benchmarks/mesh_memory.py (4 blocks, hidden 32, vocabulary 320,
seq 32, fp32), planned from a training config as the trainer plans it; every figure is the
ring-model formula written out, so a change in how often something is gathered shows here.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from flopwise.catalog.hardware import get_hardware
from flopwise.plan import step_comm as sc
from flopwise.config.resolve import resolve_run
from flopwise.plan.from_config import runspec_from_config
from flopwise.plan.params import count_params
from flopwise.plan.planner import plan
from flopwise.config.schema import ParallelConfig
from flopwise.config.loading import load_config

ROOT = Path(__file__).resolve().parents[2]
H100 = get_hardware("h100-sxm")
TINY = ("model.n_layers=4", "model.hidden=32", "model.n_heads=2", "data.vocab_size=320", "data.seq_len=32")
BLOCK = 16448  # parameters of one block: attention 4·32² + SwiGLU 3·32·96 + two norms 2·32
ENDS = 320 * 32  # the embedding, and the (untied) head


def _comm(*overrides: str):
    cfg = load_config(ROOT / "configs" / "default.yaml", [*TINY, *overrides])
    spec = runspec_from_config(cfg, resolve_run(cfg, processes=cfg.parallel.nproc_per_node), H100)
    return spec, plan(spec).comm


def test_the_tiny_spec_counts_as_written():
    spec, _ = _comm()
    pc = count_params(spec.model)
    assert pc.per_layer == BLOCK and pc.embedding == pc.output_head == ENDS and pc.final_norm == 32
    assert pc.total == 4 * BLOCK + 2 * ENDS + 32
    # below the trainer's unit threshold the embedding and head stay in FSDP2's root unit
    assert sc.fsdp_root_params(pc, 320, 32, tied=False) == 2 * ENDS + 32
    assert sc.FSDP_MIN_UNIT_PARAMS == ParallelConfig().fsdp_min_params


def test_fsdp_gathers_blocks_twice_and_the_root_once_per_micro_batch():
    spec, comm = _comm("parallel.nproc_per_node=4", "training.micro_batch_size=2")
    weights = 4.0 * count_params(spec.model).total
    root = 4.0 * (2 * ENDS + 32)
    assert comm.dp_bytes == pytest.approx(3 / 4 * (2 * weights - root) + 3 / 4 * weights)
    assert (comm.tp_bytes, comm.pp_bytes) == (0.0, 0.0)


def test_hsdp_gathers_over_the_shard_group_and_all_reduces_the_shard_across_replicas():
    spec, comm = _comm("parallel.nproc_per_node=4", "parallel.dp_replicate=2", "training.micro_batch_size=2")
    weights = 4.0 * count_params(spec.model).total
    root = 4.0 * (2 * ENDS + 32)
    gather, reduce_scatter, replicas = 1 / 2 * (2 * weights - root), 1 / 2 * weights, 2 * 1 / 2 * weights / 2
    assert comm.dp_bytes == pytest.approx(gather + reduce_scatter + replicas)


def test_pipeline_x_fsdp_gathers_a_stage_once_and_reduces_it_once_per_step():
    _, comm = _comm("parallel.strategy=pipeline", "parallel.nproc_per_node=4", "parallel.pp=2",
                    "training.micro_batch_size=1")
    last_stage = 4.0 * (2 * BLOCK + ENDS + 32)  # the head and final norm outweigh the embedding
    assert comm.dp_bytes == pytest.approx(1 / 2 * last_stage + 1 / 2 * last_stage)
    gathers = sc.zero3_collectives("fsdp", 2, 8, 0.1)
    assert (gathers.forward_gathers, gathers.backward_gathers, gathers.reductions) == (1, 0, 1)


def test_tensor_parallel_counts_the_embedding_head_and_logits():
    message = 32 * 4 * 32 * 4.0  # seq x micro-batch x hidden, fp32
    logits = 32 * 4 * 320 * 4.0
    _, comm = _comm("parallel.nproc_per_node=4", "parallel.tp=2", "parallel.sequence_parallel=true",
                    "training.micro_batch_size=4")
    blocks = 4 * 4 * message / 2  # 2 all-gathers + 2 reduce-scatters each way per block, (n-1)/n = 1/2
    embedding = message + message / 2  # output all-reduce; the slice's backward all-gather
    head = message / 2 + message / 2 + logits / 2  # input all-gather, its gradient reduce-scattered; logits
    norms = 4.0 * (4 * 64 + 32)  # replicated norm weights' gradients, all-reduced
    assert comm.tp_bytes == pytest.approx(blocks * 2 + embedding + head + norms)


def test_pipeline_x_tp_counts_the_busiest_stage():
    message = 32 * 2 * 32 * 4.0
    _, comm = _comm("parallel.strategy=pipeline", "parallel.nproc_per_node=4", "parallel.tp=2",
                    "training.micro_batch_size=2")
    m = 4  # micro-batches of a pass
    last = m * (2 * 4 * message + message + 32 * 2 * 320 * 4.0 / 2)  # 2 blocks, head input grad, logits
    assert comm.tp_bytes == pytest.approx(last)
    assert comm.pp_bytes == pytest.approx(m * message / 1)  # each of two stages sends one way


@pytest.mark.parametrize(("pp", "virtual", "sends"), [(1, 1, 0), (2, 1, 1), (2, 2, 3), (4, 1, 2), (4, 2, 4)])
def test_the_busiest_device_sends_each_way_for_every_chunk_but_the_ends(pp, virtual, sends):
    assert sc.pipeline_sends(pp, virtual) == sends


def test_interleaved_pipeline_sends_three_messages_a_micro_batch_on_two_devices():
    message = 32 * 2 * 32 * 4.0
    _, comm = _comm("parallel.strategy=pipeline", "parallel.nproc_per_node=2", "parallel.pipeline_schedule=interleaved-1f1b",
                    "parallel.pipeline_virtual_stages=2", "training.micro_batch_size=2")
    assert comm.pp_bytes == pytest.approx(4 * 3 * message)


def test_deepspeed_zero3_gathers_everything_twice_and_reduces_every_micro_batch():
    gathers = sc.zero3_collectives("deepspeed", 1, 4, 0.5)
    assert (gathers.forward_gathers, gathers.backward_gathers, gathers.backward_share, gathers.reductions) == (4, 4, 1.0, 4)
    assert sc.zero3_bytes(gathers, 4, 1, 100.0, 100.0) == pytest.approx(8 * 75 + 4 * 75)


def test_deepspeed_gathers_each_parameter_tensor_and_prefetches_only_its_bucket():
    """DeepSpeed ZeRO-3 issues one all-gather per parameter tensor (a GPT block with biases and
    LayerNorms: 4 weights, 4 biases, 2 x 2 norm tensors); FSDP2 one per block. DeepSpeed's
    50M-parameter prefetch bucket hides a 1.8B-parameter layer's gather only in part."""
    from flopwise.catalog.models import load_models
    from flopwise.plan import step_comm as sc

    gpt3 = load_models()["gpt3-175b"]
    llama = load_models()["llama2-7b"]
    assert sc.layer_tensors(gpt3) == (12 if gpt3.attn_bias and gpt3.mlp_bias else 8)
    assert sc.layer_tensors(llama) == 6  # q/k/v fused, o, gate/up fused, down; two RMSNorm weights
    assert sc.zero3_messages_per_gather("deepspeed", gpt3) == sc.layer_tensors(gpt3)
    assert sc.zero3_messages_per_gather("fsdp", gpt3) == 1
    assert sc.prefetch_share("fsdp", 1.8e9) == 1.0
    assert sc.prefetch_share("deepspeed", 1.8e9) == pytest.approx(5e7 / 1.8e9)
    assert sc.prefetch_share("deepspeed", 1e7) == 1.0


def test_mla_blocks_hold_their_own_parameter_tensors():
    """DeepSpeed gathers one tensor at a time: DeepSeek-V3's block holds q_a, its norm, q_b, kv_a, its
    norm, kv_b and o, the MLP's two (fused) and two norms; without a query latent q_b and its norm go."""
    from flopwise.catalog.models import get_model

    v3 = get_model("deepseek-v3")
    assert sc.layer_tensors(v3) == 7 + 2 + 2
    assert sc.layer_tensors(dataclasses.replace(v3, q_lora_rank=0)) == 5 + 2 + 2
    assert sc.layer_tensors(dataclasses.replace(v3, attn_bias=True)) == 7 + 3 + 2 + 2  # q_a, kv_a, o biases


def test_a_pipeline_device_holds_its_own_blocks_dense_or_moe():
    """DeepSeek-V3 over 16 stages: the first device's three blocks are its dense ones; under expert
    parallelism a device keeps 1/ep of its MoE blocks' experts only."""
    from flopwise.catalog.models import get_model
    from flopwise.plan.timing import split_layers

    pc = count_params(get_model("deepseek-v3"))
    dense_block = pc.attention_per_layer + pc.norms_per_layer + pc.dense_mlp_per_layer
    split = split_layers(61, 16, 1)
    assert sc.device_params(pc, split, 0, False, ep=8) == pc.embedding + 3 * dense_block
    moe_block = pc.per_layer - pc.experts_elsewhere_per_layer(8)
    assert sc.device_params(pc, split, 1, False, ep=8) == pytest.approx(4 * moe_block)
    whole = sum(sc.device_params(pc, split, device, False) for device in range(16))
    assert whole == pc.total
    interleaved = split_layers(61, 4, 2)  # chunk 0 of device 0 holds blocks 0-6, the dense ones among them
    assert sum(sc.device_params(pc, interleaved, device, False) for device in range(4)) == pc.total
    assert sc.device_chunks(interleaved, 1) == [(7, 8), (39, 8)]  # chunks 1 and 5 of 8
