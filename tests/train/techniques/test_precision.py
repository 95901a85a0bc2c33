"""Precision modes: autocast, the fp16 loss scaler, fp32 norms and the FSDP2 policy (real torch, CPU)."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from flopwise.config.precision import precision_of
from flopwise.config.schema import ModelConfig, PrecisionConfig
from flopwise.train.model import build_model
from flopwise.train.techniques.precision import (
    apply_fp32_norm,
    autocast_context,
    fsdp_mixed_precision_policy,
    make_grad_scaler,
)


class OpDtypes(TorchDispatchMode):
    """Records (op name, output dtype) of every aten op run inside it."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        first = out[0] if isinstance(out, (tuple, list)) else out
        if isinstance(first, torch.Tensor):
            self.seen.append((func.__name__, first.dtype))
        return out


@pytest.mark.parametrize(
    "mode, dtype",
    [("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16), ("bf16-params", torch.bfloat16)],
)
def test_autocast_context_runs_matmuls_in_the_mode_dtype(mode, dtype):
    layer = nn.Linear(4, 4)
    with autocast_context(precision_of(mode), "cpu"):
        assert layer(torch.randn(2, 4)).dtype == dtype


def test_grad_scaler_only_for_fp16_modes():
    assert make_grad_scaler(precision_of("bf16"), PrecisionConfig(mode="bf16"), "cpu") is None
    assert make_grad_scaler(precision_of("fp32"), PrecisionConfig(mode="fp32"), "cpu") is None
    scaler = make_grad_scaler(precision_of("fp16-params"), PrecisionConfig(mode="fp16-params", growth_interval=7),
                              "cpu")
    assert scaler.get_scale() == 2.0**16
    assert scaler.get_growth_interval() == 7
    assert scaler.get_backoff_factor() == 0.5 and scaler.get_growth_factor() == 2.0


def scaled_step(scaler, layer, optimizer, poison: bool):
    optimizer.zero_grad()
    with autocast_context(precision_of("fp16"), "cpu"):
        loss = layer(torch.ones(2, 4)).float().sum()
    scaler.scale(loss).backward()
    if poison:
        layer.weight.grad[0, 0] = float("inf")
    scaler.step(optimizer)
    scaler.update()


def test_inf_gradient_skips_the_step_and_halves_the_scale():
    torch.manual_seed(0)
    layer = nn.Linear(4, 4)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    settings = PrecisionConfig(mode="fp16", initial_scale=1024.0, growth_interval=2)
    scaler = make_grad_scaler(precision_of("fp16"), settings, "cpu")
    before = layer.weight.detach().clone()

    scaled_step(scaler, layer, optimizer, poison=True)
    assert torch.equal(layer.weight, before)
    assert scaler.get_scale() == 512.0

    scaled_step(scaler, layer, optimizer, poison=False)
    assert not torch.equal(layer.weight, before)
    assert scaler.get_scale() == 512.0
    scaled_step(scaler, layer, optimizer, poison=False)
    assert scaler.get_scale() == 1024.0  # doubled after growth_interval clean steps


def test_fsdp_policy_keeps_reduction_in_fp32():
    assert fsdp_mixed_precision_policy(precision_of("bf16")) is None
    assert fsdp_mixed_precision_policy(precision_of("fp32")) is None
    policy = fsdp_mixed_precision_policy(precision_of("bf16-params"))
    assert policy.param_dtype == torch.bfloat16 and policy.reduce_dtype == torch.float32
    assert fsdp_mixed_precision_policy(precision_of("fp16-params")).param_dtype == torch.float16


@pytest.mark.parametrize("norm", [nn.LayerNorm(16), nn.RMSNorm(16)], ids=["layernorm", "rmsnorm"])
def test_fp32_norm_computes_in_fp32_and_returns_the_input_dtype(norm):
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(4, 16).to(torch.bfloat16)
    reference = norm(x.float())  # the plain module on fp32 input

    assert apply_fp32_norm(norm) == 1
    with autocast_context(precision_of("bf16"), "cpu"), OpDtypes() as ops:
        out = norm(x)
    *compute, cast_back = ops.seen
    assert compute and all(dtype == torch.float32 for _, dtype in compute), ops.seen
    assert cast_back == ("_to_copy.default", torch.bfloat16)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, reference.to(torch.bfloat16))

    norm.to(torch.bfloat16)  # 16-bit weights, as FSDP2 `*-params` gives the compute copy
    with OpDtypes() as ops:
        out16 = norm(x)
    *compute, cast_back = ops.seen
    assert all(dtype == torch.float32 for _, dtype in compute), ops.seen
    assert out16.dtype == torch.bfloat16


def test_fp32_norm_keeps_fp32_outputs_for_fp32_inputs():
    norm = nn.LayerNorm(8)
    apply_fp32_norm(norm)
    with autocast_context(precision_of("bf16"), "cpu"):
        assert norm(torch.randn(2, 8)).dtype == torch.float32


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
@pytest.mark.parametrize("params_dtype", [torch.float32, torch.bfloat16])
def test_model_with_fp32_norms_trains_under_bf16_autocast(kind, params_dtype):
    torch.manual_seed(0)
    model = build_model(ModelConfig(kind=kind, n_layers=2, hidden=32, n_heads=4, max_seq_len=16), 50)
    assert apply_fp32_norm(model) == 2 * 2 + 1
    assert apply_fp32_norm(model) == 0  # idempotent
    model.to(params_dtype)
    ids = torch.randint(0, 50, (2, 16))
    with autocast_context(precision_of("bf16"), "cpu"):
        logits = model(ids)
        loss = nn.functional.cross_entropy(logits.float().flatten(0, 1), ids.flatten())
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    assert set(model.state_dict()) == set(
        build_model(ModelConfig(kind=kind, n_layers=2, hidden=32, n_heads=4, max_seq_len=16), 50).state_dict()
    )


def test_fp32_norm_wraps_huggingface_norms():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(16).to(torch.bfloat16)
    assert apply_fp32_norm(nn.Sequential(norm)) == 1
    x = torch.randn(3, 16).to(torch.bfloat16)
    with autocast_context(precision_of("bf16"), "cpu"), OpDtypes() as ops:
        out = norm(x)
    assert out.dtype == torch.bfloat16
    assert ("pow.Tensor_Scalar", torch.float32) in ops.seen
    assert ("mul.Tensor", torch.bfloat16) not in ops.seen


FSDP_SCALER_SCRIPT = textwrap.dedent(
    """
    import os, sys, torch, torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import fully_shard
    from flopwise.config.precision import precision_of
    from flopwise.config.schema import PrecisionConfig
    from flopwise.train.techniques.precision import autocast_context, fsdp_mixed_precision_policy, make_grad_scaler

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    for layer in model:
        fully_shard(layer, mp_policy=fsdp_mixed_precision_policy(precision_of("fp16-params")))
    fully_shard(model, mp_policy=fsdp_mixed_precision_policy(precision_of("fp16-params")))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = make_grad_scaler(precision_of("fp16-params"), PrecisionConfig(mode="fp16-params", initial_scale=256.0),
                              "cpu")
    before = [p.full_tensor().clone() for p in model.parameters()]
    with autocast_context(precision_of("fp16-params"), "cpu"):
        loss = model(torch.ones(4, 8)).float().sum()
    scaler.scale(loss).backward()
    grad = next(model.parameters()).grad
    assert type(grad).__name__ == "DTensor" and grad.dtype == torch.float32, (type(grad), grad.dtype)
    if rank == 1:  # an overflow on one rank only
        grad.to_local().view(-1)[0] = float("inf")
    scaler.step(optimizer)
    scaler.update()
    after = [p.full_tensor() for p in model.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(before, after)), "a rank stepped despite the inf"
    assert scaler.get_scale() == 128.0, scaler.get_scale()
    print(f"rank {rank} ok")
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown, as train/launch/worker.py: gloo threads can abort there
    """
)


@pytest.mark.slow
@pytest.mark.distributed
def test_grad_scaler_with_fsdp2_skips_on_every_rank_when_one_rank_overflows(tmp_path):
    script = tmp_path / "fsdp_scaler.py"
    script.write_text(FSDP_SCALER_SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)],
        capture_output=True, text=True, timeout=180, env=env,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "rank 0 ok" in result.stdout and "rank 1 ok" in result.stdout
