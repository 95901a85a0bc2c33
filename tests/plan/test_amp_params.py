"""AMP with fp32 parameters (torch.autocast; HF Trainer --bf16, Lightning bf16-mixed, flash-attn's trainer,
flopwise's plain bf16): fp32 weights and gradients, no master, and a bf16 copy of each weight saved for the
backward. The copies are measured on the trainer's own model under CPU autocast."""

import pytest

from flopwise.errors import UserError
from flopwise.plan import memory as mem
from flopwise.plan.params import count_params
from flopwise.plan.planner import build_runspec, plan

FA = dict(model="gpt3-2.7b", hardware="a100-80gb", gpus=8, stack="flash-attn", micro_batch=1, global_batch=128,
          seq_len=8192, zero=1)


def _weight_casts(model, tokens, checkpoint_every: int = 0) -> int:
    """Bytes of the bf16 copies of the model's weights that autograd saves in a forward under CPU autocast."""
    import torch

    from flopwise.train.techniques.activation_checkpointing import apply_activation_checkpointing

    apply_activation_checkpointing(model, checkpoint_every)
    weights = [p.detach().to(torch.bfloat16) for p in model.parameters() if p.dim() == 2]
    casts: dict[int, int] = {}

    def is_a_weight(t) -> bool:  # equal to a weight's bf16 cast (or its transpose), not an activation
        return t.dtype == torch.bfloat16 and t.dim() == 2 and any(
            w.shape == c.shape and torch.equal(w, c) for w in weights for c in (t, t.t()))

    def pack(t):
        if is_a_weight(t):
            casts[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16):
        model(tokens).float().sum()
    return sum(casts.values())


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_autocast_saves_a_bf16_copy_of_every_matmul_weight_as_planned(kind):
    """The trainer's decoder in fp32 under bf16 autocast: autograd keeps a 2-byte copy of every linear weight
    and of the head, none of the embedding table; the planner's `autocast_copy_bytes` over the planner's own
    parameter count of the same network says the same."""
    torch = pytest.importorskip("torch")
    from flopwise.config.schema import ModelConfig
    from flopwise.plan.from_config import model_spec_from_config
    from flopwise.train.model import build_model

    torch.manual_seed(0)
    vocab, seq = 96, 32
    cfg = ModelConfig(kind=kind, n_layers=3, hidden=64, n_heads=4, max_seq_len=seq)
    model = build_model(cfg, vocab)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    measured = _weight_casts(model, torch.randint(0, vocab, (2, seq)))
    linears = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert measured == 2 * linears
    pc = count_params(model_spec_from_config(cfg, vocab, seq))
    planned = mem.autocast_copy_bytes(pc.total, pc.per_layer, pc.n_layers, pc.embedding, "none")
    # the norms' gains and the biases are counted with the blocks but never saved as casts: 1.7 % of this
    # 64-wide GPT-2 block, a 1/h share at real widths
    assert planned == pytest.approx(measured, rel=0.02)
    # recomputed blocks save only their inputs: the copies left are the head's, and one block's while rebuilt
    rebuilt = build_model(cfg, vocab)
    only_head = _weight_casts(rebuilt, torch.randint(0, vocab, (2, seq)), checkpoint_every=1)
    head = rebuilt.lm_head.weight.numel() if hasattr(rebuilt, "lm_head") else vocab * cfg.hidden
    assert only_head == 2 * head
    assert mem.autocast_copy_bytes(pc.total, pc.per_layer, pc.n_layers, pc.embedding, "full") == pytest.approx(
        only_head + 2 * pc.per_layer, rel=0.02)


def test_flash_attn_plans_its_lightning_amp_and_the_flag_turns_it_off():
    """flash-attn's trainer (Lightning 1.8 `precision: bf16`) is AMP: 4 + 4 bytes/param of weights and gradients,
    Adam sharded at ZeRO-1, no master, and the bf16 copies; `--no-fp32-params` plans 16-bit weights beside an
    fp32 master instead, and the plan says which."""
    amp, mixed = plan(build_runspec(**FA)), plan(build_runspec(**FA, fp32_params=False))
    psi = count_params(amp.spec.model).total
    assert amp.memory.weights == pytest.approx(4 * psi) and amp.memory.gradients == pytest.approx(4 * psi)
    assert amp.memory.master_weights == 0 and amp.memory.optimizer_states == pytest.approx(8 * psi / 8)
    pc = count_params(amp.spec.model)
    assert amp.memory.fp8_buffers == pytest.approx(
        mem.autocast_copy_bytes(psi, pc.per_layer, pc.n_layers, pc.embedding, "none"))
    assert any("AMP" in note for note in amp.spec.cluster.extra["defaults"])
    assert mixed.memory.weights == pytest.approx(2 * psi) and mixed.memory.fp8_buffers == 0
    assert amp.memory.total_bytes > mixed.memory.total_bytes + 10 * mem.GIB
    assert amp.to_dict()["layout"]["fp32_params"] is True and mixed.to_dict()["layout"]["fp32_params"] is False
    assert amp.to_dict()["layout"]["grad_reduce"] == "fp32"  # DDP all-reduces the fp32 gradients


def test_fp32_params_on_any_fsdp_stack_and_refused_where_it_cannot_hold():
    """`--fp32-params` plans torchtitan or flopwise runs AMP-style (the reduction moves fp32 gradients); fp8,
    Megatron's conventions and a fine-tune are refused in one line each."""
    base = dict(model="llama2-7b", hardware="h100-sxm", gpus=8, micro_batch=1, global_batch=64, seq_len=4096, zero=3)
    for stack in ("flopwise", "torchtitan", "composer"):
        amp, plain = plan(build_runspec(**base, stack=stack, fp32_params=True)), plan(build_runspec(**base, stack=stack))
        assert amp.memory.weights == pytest.approx(2 * plain.memory.weights)  # fp32 shards, not bf16 ones
        assert amp.memory.fp8_buffers > 0 and plain.memory.fp8_buffers == 0
    composer = dict(base, stack="composer")
    assert plan(build_runspec(**composer, fp32_params=True)).comm.dp_bytes > plan(build_runspec(**composer)).comm.dp_bytes
    for bad in (dict(precision="fp8"), dict(stack="nemo"), dict(finetune="lora")):
        with pytest.raises(UserError, match="--fp32-params"):
            build_runspec(**{**base, **bad}, fp32_params=True)
