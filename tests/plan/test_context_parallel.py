"""Context parallelism in the planner: each sequence split over cp ranks, K/V passed round a ring."""

import json
import subprocess
import sys

import pytest

from flopwise.errors import UserError
from flopwise.plan.planner import build_runspec, plan
from flopwise.plan.search import search_layouts

LLAMA70 = dict(model="llama3-70b", gpus=64, tp=8, pp=2, seq_len=8192, sequence_parallel=True,
               stack="megatron-core", micro_batch=1, global_batch=128, zero=1, recompute="none")


def test_cp_splits_activations_and_shards_optimizer_states_over_dp_times_cp():
    one, two = plan(build_runspec(**LLAMA70)), plan(build_runspec(cp=2, **LLAMA70))
    assert (one.spec.layout.dp, two.spec.layout.dp) == (4, 2) and two.spec.layout.devices == 64
    # the in-flight micro-batches are the same (pp 2); each holds half the tokens
    assert two.memory.inflight_layers == one.memory.inflight_layers
    assert two.memory.activations == pytest.approx(one.memory.activations / 2, rel=0.01)
    # the cp ranks of a replica hold the same weights: the distributed optimizer shards over dp × cp
    assert two.memory.optimizer_states == pytest.approx(one.memory.optimizer_states)
    assert two.memory.weights == pytest.approx(one.memory.weights)


def test_cp_keeps_the_work_and_hides_a_short_ring_behind_attention():
    one, two = plan(build_runspec(**LLAMA70)), plan(build_runspec(cp=2, **LLAMA70))
    assert two.time.tokens_per_step == one.time.tokens_per_step  # whole sequences per step
    assert two.flops.model_per_unit == one.flops.model_per_unit
    # a rank's queries attend over the whole sequence: the attention core is not cut by cp²
    per_layer_mb = lambda p: p.time.attention_seconds / p.spec.layout.grad_accum  # noqa: E731
    assert per_layer_mb(two) == pytest.approx(per_layer_mb(one) / 2, rel=0.25)
    assert two.time.cp_exposed_seconds == 0.0  # 8 KV heads: a 2 MB chunk against 4,096 query rows
    assert two.time.tokens_per_second_per_device == pytest.approx(one.time.tokens_per_second_per_device, rel=0.10)
    assert two.band.extrapolates and "context parallelism never validated" in two.band.reasons
    assert not one.band.reasons or "context parallelism" not in " ".join(one.band.reasons)


def test_a_long_ring_over_the_network_comes_out_comm_bound():
    """256 tokens per rank of a 32-head (no GQA) 7B model, cp 16 across two nodes: the K/V chunks
    take longer to pass than the attention they overlap."""
    p = plan(build_runspec(model="llama2-7b", gpus=16, cp=16, seq_len=4096, micro_batch=1, global_batch=4, zero=1,
                           stack="megatron-core"))
    assert p.time.cp_exposed_seconds > p.time.attention_seconds
    assert p.time.mfu < 0.5 * plan(build_runspec(model="llama2-7b", gpus=16, seq_len=4096, micro_batch=1,
                                                 global_batch=64, zero=1, stack="megatron-core")).time.mfu


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(seq_len=8190), "2 × cp chunks"),
    (dict(gpus=60), "tp × pp × cp"),
    (dict(flash_attention=False), "needs flash attention"),
])
def test_bad_cp_layouts_are_one_line(kwargs, fragment):
    with pytest.raises(UserError) as err:
        plan(build_runspec(**{**LLAMA70, "cp": 2, **kwargs}))
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_search_keeps_the_asked_cp_and_prunes_exactly():
    spec = build_runspec(cp=2, **LLAMA70)
    result = search_layouts(spec, 64, top=3)
    assert result.ranked and all(r.spec.layout.cp == 2 and r.spec.layout.devices == 64 for r in result.ranked)
    # the lower bound that prunes the search times a rank's cp-th of the sequence, as the plan does
    exhaustive = search_layouts(spec, 64, top=3, exhaustive=True)
    assert [p.spec.layout for p in exhaustive.ranked] == [p.spec.layout for p in result.ranked]


def test_cli_cp_flag_reaches_the_json():
    out = subprocess.run([sys.executable, "-m", "flopwise", "plan", "--json", "--model", "llama3-70b", "--gpus", "64",
                          "--tp", "8", "--pp", "2", "--cp", "2", "--seq-len", "8192", "--sequence-parallel"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["layout"]["cp"] == 2 and data["layout"]["dp"] == 2


def test_cli_search_keeps_cp_and_counts_it_in_the_devices():
    out = subprocess.run([sys.executable, "-m", "flopwise", "plan", "--search", "--json", "--model", "llama3-70b",
                          "--gpus", "64", "--cp", "2", "--seq-len", "8192", "--top", "2"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    layouts = [entry["plan"]["layout"] for entry in data["ranked"]]
    assert layouts and all(lay["cp"] == 2 and lay["dp"] * lay["tp"] * lay["pp"] * 2 == 64 for lay in layouts)
