"""plan/comm.py: ring collective volumes, link choice and per-step traffic."""

import math

import pytest

from flopwise.plan.comm import estimate_comm, link_for_group, ring_all_gather_bytes, ring_all_reduce_bytes


def test_ring_volumes():
    assert ring_all_reduce_bytes(8, 1e9) == pytest.approx(2 * 7 / 8 * 1e9)
    assert ring_all_gather_bytes(8, 1e9) == pytest.approx(7 / 8 * 1e9)
    assert ring_all_reduce_bytes(1, 1e9) == 0


def _comm(**kw):
    args = dict(params_per_device=1e9, grad_bytes=2, weight_bytes=2, zero_stage=0, dp=8, tp=1, pp=1,
                micro_batches=1, layers_per_stage=32, activation_message_bytes=1e6, recompute="none",
                devices_per_node=8, scale_up_gbs=450.0, scale_out_gbs=50.0, link_efficiency=1.0)
    args.update(kw)
    return estimate_comm(**args)


def test_zero3_moves_three_times_the_parameters():
    # ZeRO paper section 7: DP/ZeRO-1/2 move 2 Psi, ZeRO-3 3 Psi (per step, one micro-batch).
    ddp, zero3 = _comm(zero_stage=0), _comm(zero_stage=3)
    assert zero3.dp_bytes / ddp.dp_bytes == pytest.approx(1.5)
    assert ddp.dp_bytes == pytest.approx(2 * 7 / 8 * 2e9)
    # ZeRO-3 re-gathers weights on every micro-batch; gradients are reduced once.
    assert _comm(zero_stage=3, micro_batches=4).dp_bytes == pytest.approx(7 / 8 * 2e9 * (2 * 4 + 1))


def test_links_follow_node_boundaries():
    assert link_for_group(8, 8) == "scale-up" and link_for_group(16, 8) == "scale-out"
    inside, across = _comm(dp=8), _comm(dp=16)
    assert inside.dp_link == "scale-up" and inside.dp_seconds == pytest.approx(inside.dp_bytes / 450e9)
    assert across.dp_link == "scale-out" and across.dp_seconds == pytest.approx(across.dp_bytes / 50e9)


def test_tensor_parallel_all_reduces_per_layer():
    c = _comm(dp=1, tp=4, micro_batches=2)
    # 4 all-reduces (2 fwd + 2 bwd) of s*b*h per layer per micro-batch (Megatron).
    assert c.tp_bytes == pytest.approx(4 * 2 * 3 / 4 * 1e6 * 32 * 2)
    assert _comm(dp=1, tp=4, recompute="full").tp_bytes == pytest.approx(6 * 2 * 3 / 4 * 1e6 * 32)


def test_pipeline_and_unknown_bandwidth():
    c = _comm(dp=1, pp=4, micro_batches=8)
    assert c.pp_bytes == pytest.approx(2 * 1e6 * 8)
    assert math.isinf(_comm(dp=16, scale_out_gbs=None).dp_seconds)
