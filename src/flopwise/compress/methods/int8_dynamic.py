"""INT8 dynamic quantization: weights int8 ahead of time, activation ranges computed per call.

Backends (`compress/quantize.py: quantize_dynamic`): PT2E with X86InductorQuantizer
(default on x86), torchao `Int8DynamicActivationInt8WeightConfig`, or the deprecated eager
`torch.ao.quantization.quantize_dynamic` as a fallback.
"""

from __future__ import annotations

from flopwise.compress.methods.model_flow import ModelMethod, int8_start


def dynamic_quantization(task, cfg, backend: str):
    """The dynamically quantized copy of `task.model`, and the details every INT8 record holds."""
    from flopwise.compress.quantize import quantize_dynamic

    model, example, _, details = int8_start(task, cfg, backend)
    return quantize_dynamic(model, example, backend), details


METHOD = ModelMethod(
    name="int8-dynamic",
    summary="int8 weights, activations quantized per call (PT2E x86, torchao, or eager torch.ao)",
    apply=dynamic_quantization,
    quantizes=True,
)
