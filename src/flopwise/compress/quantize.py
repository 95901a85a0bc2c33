"""INT8 post-training quantization: static (calibrated) and dynamic.

Backends, all maintained APIs except the stated fallback:

- `pt2e-x86` (default on x86): `torch.export` -> torchao `prepare_pt2e` with
  `X86InductorQuantizer` -> calibration -> `convert_pt2e`; run through `torch.compile`
  with Inductor freezing, which lowers the q/dq patterns to oneDNN INT8 kernels (VNNI /
  AMX where the CPU has them). Measured fastest here (see docs/compress.md).
- `torchao`: `quantize_(model, Int8DynamicActivationInt8WeightConfig())` (dynamic only).
- `eager`: the deprecated `torch.ao.quantization.quantize_dynamic` (fbgemm/x86 engine),
  kept as a fallback where export or Inductor is unavailable.

Static activation ranges come from an observer: `minmax` (running min/max),
`histogram` (PyTorch's HistogramObserver: picks the range that minimises the L2
quantization error of the histogram), or `percentile` (clips to the p-th percentile of
each calibration batch, the "percentile calibration" of Wu et al. 2020,
arXiv:2004.09602). Weights are symmetric int8, per output channel by default.
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Iterable

import torch
from torch import nn

from flopwise.errors import UserError

ACT_EPS = 2**-12  # the x86 default config's eps


def _observer_classes():
    from torchao.quantization.pt2e import MinMaxObserver

    class PercentileObserver(MinMaxObserver):
        """Tracks the running min/max of each batch's (100-p)th / p-th percentile instead of its extremes."""

        def __init__(self, percentile: float = 99.99, **kwargs):
            super().__init__(**kwargs)
            self.percentile = percentile

        def forward(self, x_orig: torch.Tensor) -> torch.Tensor:
            if x_orig.numel() == 0:
                return x_orig
            x = x_orig.detach().to(self.min_val.dtype).flatten()
            k_hi = max(1, min(x.numel(), round(x.numel() * self.percentile / 100.0)))
            k_lo = max(1, x.numel() - k_hi + 1)
            hi = torch.kthvalue(x, k_hi).values
            lo = torch.kthvalue(x, k_lo).values
            self.min_val.copy_(torch.minimum(self.min_val, lo))
            self.max_val.copy_(torch.maximum(self.max_val, hi))
            return x_orig

    return PercentileObserver


def default_backend(method: str) -> str:
    """pt2e-x86 on x86 machines (fastest measured here); the eager fallback elsewhere."""
    if platform.machine().lower() in ("x86_64", "amd64", "i686", "x86"):
        return "pt2e-x86"
    return "eager"


def has_int8_dot_product() -> bool:
    """Whether this CPU multiplies u8 x s8 into 32-bit sums in one instruction (VNNI or AMX).

    Without it (AVX2, AVX-512 before VNNI) oneDNN uses `vpmaddubsw`, which adds pairs of u8 x s8
    products into a *saturating* 16-bit lane: 255 x 127 x 2 overflows it and a compiled INT8 linear
    came out 25 % off its eager graph on an AVX2-only EPYC. That is why fbgemm's x86 qconfig keeps
    activations to 7 bits (`reduce_range`) on such CPUs, and so do we.
    """
    if platform.machine().lower() not in ("x86_64", "amd64", "i686", "x86"):
        return True  # the saturating path is an x86 detail; other backends are not affected
    if getattr(torch.cpu, "_is_vnni_supported", lambda: False)() or getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)():
        return True
    try:
        flags = Path("/proc/cpuinfo").read_text(errors="replace").split()
    except OSError:
        return False
    return any(flag in flags for flag in ("avx512_vnni", "avx_vnni", "amx_int8"))


def activation_quant_max() -> int:
    """255 (8-bit activations) where the CPU has an int8 dot product, else 127 (7 bits: no overflow)."""
    return 255 if has_int8_dot_product() else 127


def quantization_config(
    *,
    observer: str = "histogram",
    percentile: float = 99.99,
    per_channel: bool = True,
    weight_bits: int = 8,
    is_qat: bool = False,
    is_dynamic: bool = False,
):
    """An X86InductorQuantizer config: uint8 affine activations, symmetric signed weights of `weight_bits`.

    With the defaults (histogram, per-channel, 8 bits) this equals torchao's
    `get_default_x86_inductor_quantization_config` on a CPU with VNNI/AMX; without one,
    activations keep to 7 bits (`activation_quant_max`). The other knobs exist to compare
    observers and to build the lower-precision cases where QAT has something to recover.
    """
    from torchao.quantization.pt2e import (
        FakeQuantize,
        FusedMovingAvgObsFakeQuantize,
        HistogramObserver,
        MinMaxObserver,
        MovingAverageMinMaxObserver,
        MovingAveragePerChannelMinMaxObserver,
        PerChannelMinMaxObserver,
        PlaceholderObserver,
    )
    from torchao.quantization.pt2e.quantizer import QuantizationConfig, QuantizationSpec

    if is_dynamic:
        act_ctr = PlaceholderObserver.with_args(eps=ACT_EPS)
        if is_qat:
            act_ctr = FakeQuantize.with_args(eps=ACT_EPS, observer=MovingAverageMinMaxObserver.with_args(averaging_constant=1))
    elif is_qat:
        act_ctr = FusedMovingAvgObsFakeQuantize.with_args(eps=ACT_EPS)
    elif observer == "minmax":
        act_ctr = MinMaxObserver.with_args(eps=ACT_EPS)
    elif observer == "percentile":
        act_ctr = _observer_classes().with_args(eps=ACT_EPS, percentile=percentile)
    else:
        act_ctr = HistogramObserver.with_args(eps=ACT_EPS)
    act_spec = QuantizationSpec(
        dtype=torch.uint8,
        quant_min=0,
        quant_max=activation_quant_max(),
        qscheme=torch.per_tensor_affine,
        is_dynamic=is_dynamic,
        observer_or_fake_quant_ctr=act_ctr,
    )
    qmax = 2 ** (weight_bits - 1) - 1
    qmin = -qmax - 1
    if is_qat:
        weight_observer = MovingAveragePerChannelMinMaxObserver if per_channel else MovingAverageMinMaxObserver
        weight_ctr = FusedMovingAvgObsFakeQuantize.with_args(
            eps=ACT_EPS, observer=weight_observer, quant_min=qmin, quant_max=qmax, dtype=torch.int8,
            qscheme=torch.per_channel_symmetric if per_channel else torch.per_tensor_symmetric,
        )
    else:
        weight_ctr = (PerChannelMinMaxObserver if per_channel else MinMaxObserver).with_args(eps=ACT_EPS)
    weight_spec = QuantizationSpec(
        dtype=torch.int8,
        quant_min=qmin,
        quant_max=qmax,
        qscheme=torch.per_channel_symmetric if per_channel else torch.per_tensor_symmetric,
        ch_axis=0,
        is_dynamic=False,
        observer_or_fake_quant_ctr=weight_ctr,
    )
    return QuantizationConfig(act_spec, act_spec, weight_spec, None, is_qat)


def x86_quantizer(config):
    """An X86InductorQuantizer with `config` applied to the whole graph (convs, linears, pools, adds)."""
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import X86InductorQuantizer

    quantizer = X86InductorQuantizer()
    quantizer.set_global(config)
    return quantizer


def export_graph(model: nn.Module, example: torch.Tensor) -> torch.fx.GraphModule:
    """`torch.export` with a dynamic batch (and, for token ids, sequence) dimension, as a GraphModule
    the PT2E flow can annotate (`export_shapes.dynamic_shapes`)."""
    from flopwise.compress.export_shapes import dynamic_shapes, max_sequence_length

    model = model.eval()
    try:
        program = torch.export.export(model, (example,), dynamic_shapes=dynamic_shapes(example, max_sequence_length(model)))
    except Exception as err:  # export failures are model-specific; say which model and why
        raise UserError(
            f"torch.export could not capture {type(model).__name__} for PT2E quantization "
            f"({type(err).__name__}: {str(err).splitlines()[0][:160]}); try --backend eager"
        ) from None
    return program.module()


def quantize_static(
    model: nn.Module,
    example: torch.Tensor,
    calibration: Iterable[torch.Tensor],
    *,
    observer: str = "histogram",
    percentile: float = 99.99,
    per_channel: bool = True,
    weight_bits: int = 8,
) -> torch.fx.GraphModule:
    """Static INT8 PTQ via PT2E: observers see the calibration inputs, then q/dq nodes are fixed."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    config = quantization_config(observer=observer, percentile=percentile, per_channel=per_channel, weight_bits=weight_bits)
    prepared = prepare_pt2e(export_graph(model, example), x86_quantizer(config))
    with torch.no_grad():
        for batch in calibration:
            prepared(batch)
    return drop_unused_tensors(convert_pt2e(prepared))


def drop_unused_tensors(graph: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Delete parameters and buffers no graph node reads.

    After `convert_pt2e` the graph reads int8 `_frozen_param*` constants, but the fp32
    originals stay registered; left there they would double the memory and the file.
    """
    used = {node.target for node in graph.graph.nodes if node.op == "get_attr"}
    for name in [n for n, _ in graph.named_parameters()] + [n for n, _ in graph.named_buffers()]:
        if name not in used:
            owner_name, _, attr = name.rpartition(".")
            owner = graph.get_submodule(owner_name) if owner_name else graph
            delattr(owner, attr)
    return graph


def quantize_dynamic(model: nn.Module, example: torch.Tensor, backend: str) -> nn.Module:
    """Dynamic INT8: weights quantized ahead of time, activation ranges computed per call."""
    if backend == "pt2e-x86":
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

        config = quantization_config(is_dynamic=True)
        prepared = prepare_pt2e(export_graph(model, example), x86_quantizer(config))
        with torch.no_grad():
            prepared(example)
        return drop_unused_tensors(convert_pt2e(prepared))
    if backend == "torchao":
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

        quantize_(model, Int8DynamicActivationInt8WeightConfig())
        return model
    if backend == "eager":
        return quantize_dynamic_eager(model)
    raise UserError(f"compress.backend: {backend!r} cannot do int8-dynamic (allowed: pt2e-x86, torchao, eager)")


def quantize_dynamic_eager(model: nn.Module) -> nn.Module:
    """Fallback: the deprecated eager `torch.ao.quantization.quantize_dynamic` on every nn.Linear."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(model.eval(), {nn.Linear}, dtype=torch.qint8)


class FrozenInference(nn.Module):
    """Inference wrapper around a frozen compiled graph: no autograd, and the input is copied first.

    The copy is needed: Inductor fuses `qlinear(x) + x` into a oneDNN "sum" post-op that
    writes into its residual operand; when that operand is the graph input, the caller's
    tensor is overwritten (seen with torch 2.13 + torchao 0.18). The copy costs one
    activation-sized memcpy.
    """

    def __init__(self, compiled):
        super().__init__()
        self.compiled = compiled

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.compiled(x.clone())


def compile_for_cpu(model: nn.Module) -> nn.Module:
    """torch.compile with Inductor freezing: constant-folds weights so q/dq patterns become oneDNN INT8 ops."""
    import torch._inductor.config as inductor_config

    inductor_config.freezing = True
    # dynamic=False: one static graph per batch size; dynamic-shape qconv lowering trips a stride assertion
    return FrozenInference(torch.compile(model, dynamic=False))
