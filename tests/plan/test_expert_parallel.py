"""Expert parallelism (`--ep`): an MoE's routed experts split over ep data-parallel ranks, their
states sharded over dp x cp / ep, tokens sent to them by all-to-all."""

import subprocess
import sys

import pytest

from flopwise.errors import UserError
from flopwise.plan.params import count_params
from flopwise.plan.planner import build_runspec, plan

MIXTRAL = dict(model="mixtral-8x7b", gpus=64, pp=4, stack="megatron-core", global_batch=256, seq_len=4096)


def test_expert_parameters_are_counted_apart():
    from flopwise.catalog.models import get_model

    model = get_model("mixtral-8x7b")
    pc = count_params(model)
    # 8 SwiGLU experts of 3 x 4096 x 14336 per block; the router and attention are not experts
    assert pc.experts_per_layer == 8 * 3 * 4096 * 14336
    assert pc.mlp_per_layer - pc.experts_per_layer == 4096 * 8  # the router
    assert count_params(get_model("llama2-7b")).experts_per_layer == 0


def test_each_rank_holds_one_ep_th_of_the_experts():
    base, split = (plan(build_runspec(**MIXTRAL, ep=ep)) for ep in (1, 8))
    pc = count_params(base.spec.model)
    busiest_layers = 8  # 32 blocks over 4 stages
    # bf16 weights: the experts of the stage's blocks shrink by 7/8 of their bytes
    dropped = busiest_layers * pc.experts_per_layer * 7 / 8 * 2
    assert base.memory.weights - split.memory.weights == pytest.approx(dropped, rel=1e-9)
    # the distributed optimizer already shards over dp: the experts' states over dp / ep, the same bytes
    assert split.memory.optimizer_states == pytest.approx(base.memory.optimizer_states, rel=1e-9)
    states = [m.weights + m.gradients + m.optimizer_states + m.master_weights for m in (base.memory, split.memory)]
    assert states[1] < 0.6 * states[0]
    assert split.memory.total_bytes < base.memory.total_bytes


def test_all_to_all_is_timed_and_crosses_nodes_only_past_one():
    inside = plan(build_runspec(**MIXTRAL, ep=8)).time
    assert inside.ep_exposed_seconds > 0
    assert plan(build_runspec(**MIXTRAL, ep=1)).time.ep_exposed_seconds == 0
    # tp 2 puts the 8 ep ranks 2 apart: they span two nodes and the off-node part rides the network
    across = plan(build_runspec(**{**MIXTRAL, "gpus": 128}, tp=2, ep=8, sequence_parallel=False)).time
    # the same 16 micro-batches of 4,096 tokens through 8 blocks on the busiest stage, whole tokens sent
    assert across.ep_exposed_seconds > 2 * inside.ep_exposed_seconds


def test_expert_gemms_are_fewer_and_larger_with_the_same_flops():
    one, eight = (plan(build_runspec(**MIXTRAL, ep=ep)) for ep in (1, 8))
    assert eight.flops.model_per_unit == one.flops.model_per_unit
    assert eight.time.gemm_seconds <= one.time.gemm_seconds


@pytest.mark.parametrize("kwargs, message", [
    (dict(model="llama2-7b", gpus=8, ep=2), "has no experts"),
    (dict(model="mixtral-8x7b", gpus=8, ep=3), "does not divide mixtral-8x7b's 8 experts"),
    # ep 8 exceeds dp x cp x tp = 4: not even folding the experts over the tp ranks makes room
    (dict(model="mixtral-8x7b", gpus=8, tp=4, pp=2, ep=8), "must divide the data-parallel ranks dp x cp = 1"),
])
def test_an_impossible_ep_is_one_line(kwargs, message):
    with pytest.raises(UserError, match=message):
        build_runspec(**kwargs)


def test_cli_plans_and_searches_with_ep():
    env = {"COLUMNS": "200", "PATH": ""}
    args = ["--model", "mixtral-8x7b", "--gpus", "64", "--ep", "8", "--stack", "nemo", "--seq-len", "4096",
            "--global-batch", "256"]
    out = subprocess.run([sys.executable, "-m", "flopwise", "plan", *args, "--pp", "4"], capture_output=True,
                         text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert "ep 8" in out.stdout and "EP all-to-all" in out.stdout
    assert "mixture-of-experts and expert parallelism never validated" in out.stdout
    found = subprocess.run([sys.executable, "-m", "flopwise", "plan", *args, "--search", "--top", "2", "--json"],
                           capture_output=True, text=True, env=env)
    assert found.returncode == 0, found.stderr
    import json

    layouts = json.loads(found.stdout)["ranked"]
    assert layouts and all(p["plan"]["layout"]["ep"] == 8 and (p["plan"]["layout"]["dp"] * p["plan"]["layout"]["cp"]) % 8 == 0
                           for p in layouts)
    wrong = subprocess.run([sys.executable, "-m", "flopwise", "plan", "--model", "llama2-7b", "--ep", "2", "--search"],
                           capture_output=True, text=True, env=env)
    assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1 and "no experts" in wrong.stderr


def test_token_shuffles_cost_memory_traffic_and_sorting_needs_several_local_experts():
    """Megatron-Core's dispatcher gathers each token's k copies into expert order and sums them
    back (permute / unpermute); with ep > 1 and more than one local expert it also sorts the
    received chunks by expert and back. A dense layer pays none of it."""
    from flopwise.catalog.hardware import get_hardware
    from flopwise.catalog.models import get_model
    from flopwise.plan.gemm import device_rates
    from flopwise.plan.ops import layer_times, moe_dispatch_bytes

    per_token, kernels = moe_dispatch_bytes(4096, 2, 2.0, sorts=False)
    assert (per_token, kernels) == ((2 * 2 + 2 + 1) * 4096 * 2.0, 2)
    sorted_bytes, _ = moe_dispatch_bytes(4096, 2, 2.0, sorts=True)
    assert sorted_bytes - per_token == 2 * 2 * 2 * 4096 * 2.0

    hw = get_hardware("h100-sxm")
    rates = device_rates(hw, "bf16", hw.peak_flops("bf16"))
    model = get_model("mixtral-8x7b")
    times = {ep: layer_times(model, 4096, 1, 1, False, True, False, "none", "bf16", rates, None, ep)
             for ep in (2, 8)}  # 4 local experts (sorted) against 1 (no sort)
    tokens = 4096
    extra = 2 * 2 * 2 * 4096 * 2.0 * tokens * 3 / rates.memory_bytes_per_s  # forward + 2x backward
    extra += (2 + 1.5 * 2) * rates.curve.kernel_seconds  # two more kernels forward, 1.5x that backward
    assert times[2].memory_bound - times[8].memory_bound == pytest.approx(extra, rel=0.05)


# --------------------------------------------------------------------------- expert tensor parallelism

QWEN3_235B = dict(model="qwen3-235b-a22b", stack="nemo", gpus=256, tp=2, pp=8, ep=32, virtual_stages=4,
                  micro_batch=1, global_batch=2048, seq_len=4096)


def test_nemo_qwen3_235b_layout_folds_its_experts_over_the_tensor_parallel_ranks():
    """NeMo's H100 recipe (tp 2, pp 8, ep 32, etp 1 on 256 GPUs) has dp x cp = 16 < ep: the only
    layout that runs is Megatron-Core's MoE parallel folding, and the plan says so."""
    spec = build_runspec(**QWEN3_235B)
    assert (spec.layout.ep, spec.layout.expert_tp, spec.layout.expert_shard_group) == (32, 1, 1)
    assert any(d.startswith("etp 1: --ep 32 spans the tensor-parallel ranks") for d in spec.cluster.extra["defaults"])
    result = plan(spec)
    assert result.fits and result.time.ep_exposed_seconds > 0
    assert spec.layout == build_runspec(**QWEN3_235B, etp=1).layout  # stated or inferred, the same layout
    # the recipe recomputes nothing, and it ran: folded, a rank keeps only its own sequence shard's
    # routed token copies (the tp group's, unfolded, would not fit)
    as_run = plan(build_runspec(**QWEN3_235B, recompute="none"))
    assert as_run.fits and as_run.spec.layout.recompute == "none"


def test_folded_experts_hold_whole_experts_with_the_same_flops():
    """Mixtral 8x7B, tp 2, ep 8 on 64 GPUs runs either way: with etp 1 a rank holds its 1/8 of the
    experts whole instead of half of each, and runs them on the tokens of both tp ranks."""
    layout = dict(MIXTRAL, tp=2, pp=1, ep=8)
    split, folded = (plan(build_runspec(**layout, etp=etp)) for etp in (2, 1))
    pc = count_params(split.spec.model)
    extra = pc.n_layers * pc.experts_per_layer / 8 * (1 - 1 / 2) * 2  # bf16 bytes of the other halves
    assert folded.memory.weights - split.memory.weights == pytest.approx(extra, rel=1e-9)
    assert folded.time.mfu == pytest.approx(split.time.mfu, rel=0.15)  # same FLOPs, other GEMM shapes
    assert folded.time.gemm_seconds != split.time.gemm_seconds


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(model="mixtral-8x7b", gpus=64, tp=2, ep=8, etp=3), "--etp 3 must divide --tp 2"),
    (dict(model="llama2-7b", gpus=8, tp=2, etp=1), "--etp 1: llama2-7b has no experts"),
    (dict(model="mixtral-8x7b", gpus=16, tp=2, pp=4, ep=8, etp=2), "--ep 8 must divide the data-parallel ranks"),
    (dict(model="mixtral-8x7b", gpus=16, tp=8, ep=8, etp=4), "--ep 8 x --etp 4 must divide dp x cp x tp = 16"),
])
def test_an_expert_layout_no_run_could_have_is_one_line(kwargs, message):
    with pytest.raises(UserError, match=message) as err:
        build_runspec(**kwargs)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("layout", [
    dict(tp=1, pp=16, ep=64, recompute="full"),  # the report's own split (§3.2: PP 16, EP 64 over 8 nodes, no TP)
    dict(tp=2, pp=16, ep=32, recompute="every:2", sequence_parallel=True),
])
def test_deepseek_v3_plans_on_1024_h100s(layout):
    """DeepSeek-V3 (671B, 37B active) trains on 1024 H100s when its blocks' activations are mostly
    recomputed: the routed experts spread over the ep ranks leave ~2-4 GiB of weights per device.
    MFU sits well below a dense model's: the all-to-alls are planned with none of the overlap the
    report's DualPipe gets."""
    result = plan(build_runspec(model="deepseek-v3", hardware="h100-sxm", gpus=1024, seq_len=4096,
                                global_batch=4096, micro_batch=1, stack="megatron-core", **layout))
    assert result.memory.may_fit and result.memory.total_bytes < 80e9
    assert 0.10 < result.time.mfu < 0.60
    assert result.params.total == 671_026_404_352
    assert result.time.ep_exposed_seconds > 0
    assert "mixture-of-experts and expert parallelism never validated" in result.band.reasons


@pytest.mark.parametrize(("model", "gpus", "ep"), [("llama4-scout", 256, 16), ("llama4-maverick", 512, 128)])
def test_nemo_llama4_layouts_plan_and_fit(model, gpus, ep):
    """NeMo's H100 Llama 4 recipes (tp 4, ep 16 / 128, etp 4, micro-batch 1, global batch 1,024,
    seq 8,192): Scout's every block MoE, Maverick's dense and MoE blocks alternating."""
    result = plan(build_runspec(model=model, stack="nemo", gpus=gpus, tp=4, ep=ep, etp=4, micro_batch=1,
                                global_batch=1024, seq_len=8192, precision="bf16", recompute="none"))
    assert result.fits and result.spec.layout.expert_tp == 4
    assert 0.2 < result.time.mfu < 0.6
