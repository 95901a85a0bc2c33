"""INT8 weight-only: each linear weight stored as int8 with one scale per output row.

Activations stay in floating point; the matmul dequantizes the weight (torchao
`Int8WeightOnlyConfig`, per-row symmetric). Weight bytes fall ~4x from fp32, ~2x from bf16.
"""

from __future__ import annotations

from flopwise.compress.methods.llm_flow import LLMQuantMethod


def _config(device_type: str):
    from torchao.quantization import Int8WeightOnlyConfig

    return Int8WeightOnlyConfig()


METHOD = LLMQuantMethod(
    name="int8-weight-only",
    summary="int8 weights (per-row scales), float activations (torchao Int8WeightOnlyConfig)",
    torchao_config=_config,
)
