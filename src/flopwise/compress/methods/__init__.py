"""Compression methods for causal LMs, one file each, found by name in one registry.

A method here turns an HF causal LM folder into a smaller HF folder that
`AutoModelForCausalLM.from_pretrained` loads as it is (torchao tensor subclasses in
safetensors, `quantization_config` in config.json). `compress/llm.py` runs any of them and
measures before and after. The PT2E / pruning / 2:4 methods of `compress/run.py` are not
(yet) in this registry; their behaviour is unchanged.
"""

from __future__ import annotations

from flopwise.compress.methods.base import LLMQuantMethod
from flopwise.errors import UserError

__all__ = ["LLMQuantMethod", "LLM_METHOD_NAMES", "get_method", "registry"]


def registry() -> dict[str, LLMQuantMethod]:
    """Every LLM method by name (imports each method's file)."""
    from flopwise.compress.methods import int4_weight_only, int8_weight_only, w8a8_dynamic

    methods = (int8_weight_only.METHOD, int4_weight_only.METHOD, w8a8_dynamic.METHOD)
    return {method.name: method for method in methods}


LLM_METHOD_NAMES = ("int8-weight-only", "int4-weight-only", "w8a8-dynamic")


def get_method(name: str) -> LLMQuantMethod:
    """The method called `name`, or a one-line error listing the known ones."""
    methods = registry()
    if name not in methods:
        raise UserError(f"--method {name!r} is not an LLM compression method (allowed: {', '.join(methods)})")
    return methods[name]
