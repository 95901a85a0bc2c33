"""Quantization-aware training with the PT2E flow: prepare (fake-quant) -> fine-tune -> convert.

torchao `prepare_qat_pt2e` inserts fake-quantize modules (straight-through estimator,
Jacob et al. 2018, arXiv:1712.05877) matching the X86InductorQuantizer's INT8 scheme, so
the fine-tuned weights learn to sit where the quantization grid is. `convert_pt2e` then
produces the same kind of INT8 graph as static PTQ.
"""

from __future__ import annotations

import torch
from torch import nn

from flopwise.compress.finetune import finetune
from flopwise.compress.quantize import drop_unused_tensors, export_graph, quantization_config, x86_quantizer
from flopwise.compress.tasks import Task


def quantize_aware_train(
    model: nn.Module,
    task: Task,
    steps: int,
    lr: float,
    batch_size: int,
    *,
    per_channel: bool = True,
    weight_bits: int = 8,
) -> tuple[torch.fx.GraphModule, list[float]]:
    """Fake-quant fine-tune `steps` steps, then convert; returns the INT8 graph and the loss curve.

    Observers keep updating during the first half and are frozen for the second, the usual
    recipe so the final steps train against fixed quantization ranges.
    """
    from torchao.quantization.pt2e import disable_observer
    from torchao.quantization.pt2e import move_exported_model_to_eval, move_exported_model_to_train
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_qat_pt2e

    config = quantization_config(per_channel=per_channel, weight_bits=weight_bits, is_qat=True)
    graph = export_graph(model, task.make_input(batch_size))
    prepared = prepare_qat_pt2e(graph, x86_quantizer(config))
    move_exported_model_to_train(prepared)

    def freeze_observers(step: int) -> None:
        if step == steps // 2:
            prepared.apply(disable_observer)

    losses = finetune(prepared, task, steps, lr, batch_size, before_step=freeze_observers)
    move_exported_model_to_eval(prepared)
    pin_trained_qparams(prepared)
    return drop_unused_tensors(convert_pt2e(prepared)), losses


def pin_trained_qparams(prepared: torch.fx.GraphModule) -> None:
    """Make `convert_pt2e` use the scales the fake-quant modules trained with.

    convert asks each module for `calculate_qparams()`, which re-derives scale / zero
    point from the observer's running min/max; the fused fake-quant op computes its own
    (torch 2.13 / torchao 0.18: 1.5x apart for 2-bit weights), so the converted graph lost
    what QAT learned (98% fake-quant accuracy, 42% converted). Pinning them keeps both equal.
    """
    from torchao.quantization.pt2e import FakeQuantizeBase

    for module in prepared.modules():
        if isinstance(module, FakeQuantizeBase) and hasattr(module, "scale"):
            scale, zero_point = module.scale.detach().clone(), module.zero_point.detach().clone()
            module.calculate_qparams = lambda s=scale, z=zero_point: (s, z)
