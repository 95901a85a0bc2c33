"""INT4 weight-only, grouped: 4-bit weights with one scale (and zero point) per group of inputs.

On CUDA: torchao `Int4WeightOnlyConfig` (group 128, tinygemm's tile-packed layout, two
values per byte). On a CPU that config needs the CUDA-only mslk kernels (torchao 0.18
raises "Requires mslk"), so the CPU gets `IntxWeightOnlyConfig(weight_dtype=torch.int4,
PerGroup(32))`: the same 4-bit values and accuracy, but stored unpacked, one per int8,
so the file is no smaller than INT8's. The report states which one ran.
"""

from __future__ import annotations

from flopwise.compress.methods.llm_flow import LLMQuantMethod

CUDA_GROUP_SIZE = 128
CPU_GROUP_SIZE = 32


def _config(device_type: str):
    if device_type == "cuda":
        from torchao.quantization import Int4WeightOnlyConfig

        return Int4WeightOnlyConfig(group_size=CUDA_GROUP_SIZE, int4_packing_format="tile_packed_to_4d")
    import torch
    from torchao.quantization import IntxWeightOnlyConfig
    from torchao.quantization.granularity import PerGroup

    return IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(CPU_GROUP_SIZE))


def _note(device_type: str) -> str:
    if device_type == "cuda":
        return ""
    return (f"CPU: int4 values in groups of {CPU_GROUP_SIZE} stored one per int8 (IntxWeightOnlyConfig); "
            "torchao's packed Int4WeightOnlyConfig needs CUDA kernels")


METHOD = LLMQuantMethod(
    name="int4-weight-only",
    summary="int4 weights in groups, float activations (torchao Int4WeightOnlyConfig on CUDA, IntxWeightOnlyConfig on CPU)",
    torchao_config=_config,
    note=_note,
    group_size=lambda device_type: CUDA_GROUP_SIZE if device_type == "cuda" else CPU_GROUP_SIZE,
)
