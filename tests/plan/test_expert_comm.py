"""MoE token dispatch and combine (`plan/expert_comm.py`): Megatron-Core's all-to-all and DeepEP
dispatchers, node-limited routing, the shared expert overlapped with the transfers, and the
`--moe-dispatcher` choice with the stack's default."""

import dataclasses
import itertools
import json
import os
import subprocess
import sys

import pytest

from flopwise.catalog.hardware import get_hardware
from flopwise.errors import UserError
from flopwise.plan import comm as cm
from flopwise.plan import expert_comm as ec
from flopwise.plan.planner import build_runspec, plan
from flopwise.plan.spec import local_seq_len
from flopwise.plan.timing import OVERLAP_SLOWDOWN, split_layers

# NeMo's H100 layouts (scripts/performance/recommended_model_configs/model_configs_h100.csv, layouts only)
DEEPSEEK_V3 = dict(model="deepseek-v3", hardware="h100-sxm", stack="nemo", gpus=1024, tp=2, pp=16, ep=64, etp=1,
                   micro_batch=1, global_batch=8192, seq_len=4096)
LLAMA4_SCOUT = dict(model="llama4-scout", hardware="h100-sxm", stack="nemo", gpus=256, tp=4, ep=16, etp=4,
                    micro_batch=1, global_batch=1024, seq_len=8192)


def _without_overlap(spec):
    return dataclasses.replace(spec, layout=dataclasses.replace(spec.layout, moe_shared_expert_overlap=False))


def _passes(spec, dispatcher):
    lay = dataclasses.replace(spec.layout, moe_dispatcher=dispatcher)
    hw = spec.cluster.hardware
    links = cm.links_for(hw, hw.devices_per_node)
    return ec.token_passes(lay, links, spec.model, local_seq_len(spec) * lay.micro_batch_size, 2.0)


# --------------------------------------------------------------------------- shared-expert overlap

@pytest.mark.parametrize("layout", [LLAMA4_SCOUT, dict(DEEPSEEK_V3, moe_dispatcher="alltoall")])
def test_shared_expert_overlap_hides_part_of_the_all_to_all_and_no_more(layout):
    """Megatron-Core's moe_shared_expert_overlap runs the shared expert's fc1 beside the dispatch and
    its fc2 beside the combine (and their backwards beside the gradients' transfers): less EP time is
    exposed, never below zero, never more hidden than the shared expert computes, and what hides slows
    compute as any overlapped collective does."""
    spec = build_runspec(**layout)
    assert spec.layout.moe_shared_expert_overlap and spec.layout.moe_dispatcher == "alltoall"
    on, off = plan(spec), plan(_without_overlap(spec))
    assert 0.0 <= on.time.ep_exposed_seconds < off.time.ep_exposed_seconds
    hidden = off.time.ep_exposed_seconds - on.time.ep_exposed_seconds
    # the shared expert's own GEMMs on the busiest stage: forward (and a recomputed one), backward
    from flopwise.plan import ops
    from flopwise.plan.gemm import device_rates

    hw, lay = spec.cluster.hardware, spec.layout
    rates = device_rates(hw, "bf16", hw.peak_flops("bf16"))
    layer = ops.layer_times(spec.model, local_seq_len(spec), lay.micro_batch_size, lay.tp, lay.sequence_parallel,
                            True, False, on.spec.layout.recompute, "bf16", rates, None, lay.ep, lay.expert_tp)
    rerun = ops.full_recompute_share(on.spec.layout.recompute)
    shared = (1 + rerun) * (layer.shared_up[0] + layer.shared_down[0]) + sum(layer.shared_up[1:]) \
        + sum(layer.shared_down[1:])
    v = lay.virtual_stages if lay.pipeline_schedule == "interleaved" else 1
    layers_busiest = max(sum(chunks) for chunks in split_layers(spec.model.n_layers, lay.pp, v))
    assert 0.0 < hidden <= lay.grad_accum * layers_busiest * shared * (1 + 1e-9)
    # the same compute: the step sheds the hidden seconds less the contention they add (under a pipeline,
    # the other stages' shorter layers shorten the bubble too)
    saved = off.time.step_seconds - on.time.step_seconds
    if lay.pp == 1:
        assert saved == pytest.approx((1 - OVERLAP_SLOWDOWN) * hidden, rel=1e-9)
    else:
        assert (1 - OVERLAP_SLOWDOWN) * hidden < saved < hidden


def test_shared_expert_hidden_is_bounded_by_both_sides():
    """The overlap hides min(transfer, shared GEMM) per pair: never negative, never more than either."""
    layer = type("Layer", (), {"shared_up": (2.0, 1.5, 1.5), "shared_down": (1.0, 0.75, 0.75)})
    for d, c in ((0.1, 0.1), (10.0, 10.0), (1.2, 0.6)):
        passes = ec.TokenPasses(d, c, 0.0, 0.0)
        for rerun in (0.0, 1.0):
            hidden = ec.shared_expert_hidden(layer, passes, rerun)
            wire = (2 + rerun) * (d + c)
            shared = (1 + rerun) * (2.0 + 1.0) + 3.0 + 1.5
            assert 0.0 <= hidden <= min(wire, shared) * (1 + 1e-12)
    assert ec.shared_expert_hidden(layer, ec.TokenPasses(10.0, 10.0, 0, 0), 0.0) == 2.0 + 1.0 + 1.5 + 3.0
    assert ec.shared_expert_hidden(layer, ec.TokenPasses(0.1, 0.1, 0, 0), 0.0) == pytest.approx(0.4)


def test_models_without_a_shared_expert_hide_nothing():
    mixtral = build_runspec(model="mixtral-8x7b", gpus=64, pp=4, ep=8, stack="nemo", global_batch=256, seq_len=4096)
    assert not mixtral.layout.moe_shared_expert_overlap
    forced = dataclasses.replace(mixtral, layout=dataclasses.replace(mixtral.layout, moe_shared_expert_overlap=True))
    assert plan(forced).time.step_seconds == plan(mixtral).time.step_seconds


# --------------------------------------------------------------------------- DeepEP

def test_deepep_sends_fewer_inter_node_bytes_for_deepseek_v3_at_ep64_on_8_nodes():
    """All-to-all sends each of a token's 8 copies apart, 7/8 of them off the node; DeepEP sends it
    once per destination node, at most 4 of the 8 (node-limited routing), 3.6 expected, 7/8 of those
    other nodes. Past the bytes DeepEP's RDMA runs at its benchmarked rate."""
    spec = build_runspec(**DEEPSEEK_V3)
    assert cm.group_shape(64, 1, 8) == (8, 8)
    a2a, deepep = _passes(spec, "alltoall"), _passes(spec, "deepep")
    token_bytes = 4096 / 2 * 7168 * 2.0  # a rank's sequence-parallel shard of the 4,096 tokens, bf16
    assert a2a.net_bytes == pytest.approx(token_bytes * 8 * 56 / 64)
    nodes = ec.expected_destinations(256, 8, 8, 8, 4)
    assert 3.5 < nodes < 4
    assert deepep.net_bytes == pytest.approx(token_bytes * nodes * 7 / 8)
    assert deepep.net_bytes < 0.5 * a2a.net_bytes
    assert deepep.dispatch_seconds < a2a.dispatch_seconds and deepep.combine_seconds < a2a.combine_seconds
    timed = {d: plan(build_runspec(**DEEPSEEK_V3, moe_dispatcher=d)).time for d in ("alltoall", "deepep")}
    assert timed["deepep"].ep_exposed_seconds < timed["alltoall"].ep_exposed_seconds
    assert timed["deepep"].step_seconds < timed["alltoall"].step_seconds


def test_deepep_rates_come_from_its_readme_benchmark():
    """The H800 benchmark counts a node's (a rank's) own share among the bytes: what leaves is
    (1 - 1/nodes) of the RDMA figure and 7/8 of the NVLink one, taken against the link's maximum the
    README states and applied to the same kind of link here (an H100's CX7 NIC is the H800's)."""
    hw = get_hardware("h100-sxm")
    links = cm.links_for(hw, 8)
    nvl_d, nvl_c, rdma_d, rdma_c = ec.deepep_rates(links, 8)
    assert nvl_d == pytest.approx(153 * 7 / 8 / 160 * links.node_bps)
    assert nvl_c == pytest.approx(158 * 7 / 8 / 160 * links.node_bps)
    assert rdma_d == pytest.approx(51e9 * 7 / 8) and rdma_c == pytest.approx(50e9 * 7 / 8)
    assert ec.deepep_rates(links, 4)[2] == pytest.approx(58e9 * 3 / 4)
    assert ec.deepep_rates(links, 32)[2] == rdma_d  # beyond the benchmark: its largest row
    assert ec.deepep_rates(links, 3)[2] == pytest.approx(43e9 / 2)


def _enumerated(experts, k, containers, groups, chosen):
    """The expectation by enumerating every group choice and every k-subset of its experts."""
    per_group, per_container = experts // groups, experts // containers
    total = count = 0
    for picked in itertools.combinations(range(groups), chosen):
        pool = [x for g in picked for x in range(g * per_group, (g + 1) * per_group)]
        for experts_drawn in itertools.combinations(pool, k):
            total += len({x // per_container for x in experts_drawn})
            count += 1
    return total / count


@pytest.mark.parametrize(("experts", "k", "containers", "groups", "chosen"), [
    (16, 3, 8, 4, 2),  # containers inside groups
    (16, 3, 2, 4, 2),  # several groups in a container
    (16, 3, 4, 4, 2),
    (16, 4, 8, 1, 1),  # no group limit
    (12, 2, 3, 6, 3),
])
def test_expected_destinations_matches_enumeration(experts, k, containers, groups, chosen):
    assert ec.expected_destinations(experts, k, containers, groups, chosen) == pytest.approx(
        _enumerated(experts, k, containers, groups, chosen), rel=1e-12)


def test_node_limited_routing_caps_the_nodes_a_token_reaches():
    """DeepSeek-V3 (n_group 8, topk_group 4): on 8 nodes, one group each, a token reaches at most 4;
    on 16 nodes (two per group) at most 8; without the limit its 8 experts would spread wider."""
    from flopwise.catalog.models import get_model

    model = get_model("deepseek-v3")
    assert (model.expert_groups, model.expert_groups_per_token) == (8, 4)
    limited = ec.expected_destinations(256, 8, 8, 8, 4)
    free = ec.expected_destinations(256, 8, 8)
    assert limited <= 4 < free
    on_16 = ec.expected_destinations(256, 8, 16, 8, 4)
    assert on_16 <= 8 and on_16 < ec.expected_destinations(256, 8, 16)
    assert ec.expected_destinations(256, 8, 4, 8, 4) <= 4
    # and the plan sends fewer bytes with the limit than without it
    spec = build_runspec(**DEEPSEEK_V3, moe_dispatcher="deepep")
    unlimited = dataclasses.replace(spec, model=dataclasses.replace(spec.model, expert_groups=0,
                                                                     expert_groups_per_token=0))
    assert _passes(spec, "deepep").net_bytes < _passes(unlimited, "deepep").net_bytes


# --------------------------------------------------------------------------- the choice and its default

def test_megatron_core_dispatches_deepseek_with_deepep_on_hopper_as_nemo_does():
    """NeMo's DeepSeek recipes add DeepEPCallback: DeepEP on compute capability 8 and 9, the shared
    expert not overlapped; its other MoE configs keep all-to-all, overlapping the shared expert."""
    spec = build_runspec(**DEEPSEEK_V3)
    assert (spec.layout.moe_dispatcher, spec.layout.moe_shared_expert_overlap) == ("deepep", False)
    assert any(d.startswith("moe dispatcher deepep") for d in spec.cluster.extra["defaults"])
    assert build_runspec(**{**DEEPSEEK_V3, "hardware": "a100-80gb"}).layout.moe_dispatcher == "deepep"
    assert build_runspec(**{**DEEPSEEK_V3, "hardware": "mi300x"}).layout.moe_dispatcher == "alltoall"
    flopwise = build_runspec(**{**DEEPSEEK_V3, "stack": "flopwise"}).layout
    assert (flopwise.moe_dispatcher, flopwise.moe_shared_expert_overlap) == ("alltoall", False)
    scout = build_runspec(**LLAMA4_SCOUT).layout
    assert (scout.moe_dispatcher, scout.moe_shared_expert_overlap) == ("alltoall", True)
    qwen = build_runspec(model="qwen3-30b-a3b", stack="nemo", gpus=16, pp=2, ep=8, etp=1).layout
    assert (qwen.moe_dispatcher, qwen.moe_shared_expert_overlap) == ("alltoall", False)  # no shared expert
    stated = build_runspec(**DEEPSEEK_V3, moe_dispatcher="alltoall").layout
    assert (stated.moe_dispatcher, stated.moe_shared_expert_overlap) == ("alltoall", True)


@pytest.mark.parametrize(("typed", "name"), [
    ("DeepEP", "deepep"), ("deep_ep", "deepep"), ("FLEX", "deepep"), ("All-to-All", "alltoall"),
    ("alltoall", "alltoall"), ("A2A", "alltoall")])
def test_moe_dispatcher_in_any_case(typed, name):
    assert build_runspec(**DEEPSEEK_V3, moe_dispatcher=typed).layout.moe_dispatcher == name


def test_an_unknown_moe_dispatcher_is_one_line():
    with pytest.raises(UserError) as err:
        build_runspec(**DEEPSEEK_V3, moe_dispatcher="allgather")
    assert "\n" not in str(err.value) and "alltoall, deepep" in str(err.value)
    out = subprocess.run([sys.executable, "-m", "flopwise", "plan", "--model", "mixtral-8x7b", "--gpus", "16",
                          "--ep", "8", "--moe-dispatcher", "nccl", "--json"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert out.stderr.startswith("error: --moe-dispatcher 'nccl' is not one of: alltoall, deepep")


def test_cli_names_the_dispatcher():
    args = ["--model", "deepseek-v3", "--stack", "nemo", "--gpus", "1024", "--tp", "2", "--pp", "16", "--ep", "64",
            "--etp", "1", "--gbs", "8192", "--seq-len", "4096"]
    out = subprocess.run([sys.executable, "-m", "flopwise", "plan", *args, "--json"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["layout"]["moe_dispatcher"] == "deepep" and data["inputs"]["layout"]["moe_dispatcher"] == "deepep"
    table = subprocess.run([sys.executable, "-m", "flopwise", "plan", *args, "--moe-dispatcher", "All-to-All"],
                           capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})
    assert table.returncode == 0, table.stderr
    assert "EP all-to-all" in table.stdout and "shared expert overlapped" in table.stdout


def test_a_dense_model_plans_the_same_whatever_the_dispatcher():
    """The dispatcher and the shared-expert overlap touch nothing but an MoE's expert parallelism."""
    base = build_runspec(model="llama3-70b", gpus=64, tp=4, pp=4, stack="nemo", seq_len=8192, global_batch=128)
    assert (base.layout.moe_dispatcher, base.layout.moe_shared_expert_overlap) == ("alltoall", False)
    other = build_runspec(model="llama3-70b", gpus=64, tp=4, pp=4, stack="nemo", seq_len=8192, global_batch=128,
                          moe_dispatcher="deepep")
    forced = dataclasses.replace(other, layout=dataclasses.replace(other.layout, moe_shared_expert_overlap=True))
    steps = {plan(s).time.step_seconds for s in (base, other, forced)}
    assert len(steps) == 1
    assert plan(base).time.ep_exposed_seconds == 0.0


def test_search_keeps_the_dispatcher_on_every_layout():
    from flopwise.plan.search import search_layouts, with_expert_parallel

    spec = with_expert_parallel(build_runspec(model="deepseek-v2-lite", stack="nemo", gpus=16, seq_len=4096,
                                              global_batch=256), 8)
    assert spec.layout.moe_dispatcher == "deepep"  # NeMo's deepseek_v2_lite.py recipe adds DeepEPCallback too
    ranked = search_layouts(spec, 16, top=2).ranked
    assert ranked and all(p.spec.layout.moe_dispatcher == "deepep" and p.spec.layout.ep == 8 for p in ranked)
