"""A full recompute under PyTorch's non-reentrant checkpoint stops once every tensor the block's backward
needs is rebuilt (`torch.utils.checkpoint`'s early stop, on by default): a dense block's down projection,
whose output nothing in the backward needs, is not run again. Measured on the trainer's own decoder (it
checkpoints with use_reentrant=False); the planner charges composer's and flopwise's recompute so and
torchtitan's (early_stop=False) and Megatron's (reentrant) with the whole forward."""

import pytest

from flopwise.plan import ops
from flopwise.plan.planner import build_runspec, plan


def _gemms(model, tokens, checkpoint_every: int) -> tuple[int, int]:
    """(forward, backward) GEMM calls (mm / addmm) of one step of the trainer's decoder on the CPU."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from flopwise.train.techniques.activation_checkpointing import apply_activation_checkpointing

    apply_activation_checkpointing(model, checkpoint_every)

    class Count(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm):
                Count.calls += 1
            return func(*args, **(kwargs or {}))

    with Count():
        loss = model(tokens).float().sum()
    forward, Count.calls = Count.calls, 0
    with Count():
        loss.backward()
    return forward, Count.calls


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_the_trainers_recompute_skips_each_blocks_down_projection(kind):
    torch = pytest.importorskip("torch")
    from flopwise.config.schema import ModelConfig
    from flopwise.train.model import build_model

    torch.manual_seed(0)
    vocab, seq, layers = 96, 32, 3
    cfg = ModelConfig(kind=kind, n_layers=layers, hidden=64, n_heads=4, max_seq_len=seq)
    tokens = torch.randint(0, vocab, (2, seq))
    forward, plain = _gemms(build_model(cfg, vocab), tokens, 0)
    forward_ckpt, recomputing = _gemms(build_model(cfg, vocab), tokens, 1)
    per_block = (forward - 1) // layers  # the head is the one GEMM outside the blocks
    assert forward == forward_ckpt == per_block * layers + 1
    assert recomputing - plain == layers * (per_block - 1)  # every block GEMM again but the down projection


def test_the_planner_charges_a_recompute_as_its_stack_runs_it():
    """The same layer and recompute: composer's (early stop) costs the forward less its down-projection GEMM
    and last residual add; torchtitan's FullAC (early_stop=False) and Megatron's the whole forward."""
    from flopwise.catalog.hardware import get_hardware
    from flopwise.catalog.models import get_model
    from flopwise.plan.gemm import device_rates

    hw = get_hardware("h100-sxm")
    rates = device_rates(hw, "bf16", hw.peak_flops("bf16"))
    model = get_model("mpt-30b")
    whole = ops.layer_times(model, 2048, 4, 1, False, True, False, "full", "bf16", rates)
    stopped = ops.layer_times(model, 2048, 4, 1, False, True, False, "full", "bf16", rates, early_stop=True)
    assert whole.recompute == pytest.approx(whole.forward)
    down = ops._gemm_fwd_bwd(rates, 2048 * 4, model.hidden, model.ffn_hidden, 2.0)[0]
    assert whole.recompute - stopped.recompute == pytest.approx(down + rates.memory_seconds(2048 * 4 * 3 * model.hidden * 2.0, 1))
    assert 0.25 < down / whole.forward < 0.4  # a GELU 4h MLP's down projection: a third of the block's GEMMs

    job = dict(model="mpt-30b", hardware="h100-sxm", gpus=8, micro_batch=3, global_batch=504, seq_len=2048,
               zero=3, recompute="full")
    composer, titan = (plan(build_runspec(stack=s, **job)) for s in ("composer", "torchtitan"))
    assert composer.time.compute_seconds < titan.time.compute_seconds
    # an MoE block's last op is the experts' combine, not a dense GEMM: no credit taken
    moe = get_model("mixtral-8x7b")
    assert ops.layer_times(moe, 4096, 1, 1, False, True, False, "full", "bf16", rates, early_stop=True).recompute \
        == pytest.approx(ops.layer_times(moe, 4096, 1, 1, False, True, False, "full", "bf16", rates).recompute)


def test_hardware_flops_leave_out_the_down_projections_an_early_stop_skips():
    job = dict(model="mpt-30b", hardware="h100-sxm", gpus=8, micro_batch=3, global_batch=504, seq_len=2048,
               zero=3, recompute="full")
    composer, titan = (plan(build_runspec(stack=s, **job)).flops for s in ("composer", "torchtitan"))
    from flopwise.catalog.models import get_model

    mpt = get_model("mpt-30b")
    assert composer.model_per_unit == titan.model_per_unit
    assert titan.hardware_per_unit - composer.hardware_per_unit == pytest.approx(
        2.0 * mpt.ffn_hidden * mpt.hidden * mpt.n_layers)
