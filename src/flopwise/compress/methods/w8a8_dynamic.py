"""INT8 dynamic activations + INT8 weights: activations are quantized per token at run time.

torchao `Int8DynamicActivationInt8WeightConfig`: weights int8 per row, activations int8 per
token with scales computed on the fly, so the matmul itself can run in int8.
"""

from __future__ import annotations

from flopwise.compress.methods.llm_flow import LLMQuantMethod


def _config(device_type: str):
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig

    return Int8DynamicActivationInt8WeightConfig()


METHOD = LLMQuantMethod(
    name="w8a8-dynamic",
    summary="int8 weights and per-token dynamic int8 activations (torchao Int8DynamicActivationInt8WeightConfig)",
    torchao_config=_config,
)
