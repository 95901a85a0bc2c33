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

__all__ = ["LLMQuantMethod", "METHOD_FLOWS", "METHODS", "LLM_METHODS", "get_method", "registry"]

# Every compression method, the one list: its name and the flow that runs it. "model": a task's
# network through `compress/run.py` (PT2E / torch.ao INT8, QAT, pruning, 2:4); "llm": an HF causal
# LM folder in, a smaller one out, one file per method in this package (`registry`).
METHOD_FLOWS = {
    "int8-static": "model",
    "int8-dynamic": "model",
    "qat": "model",
    "prune": "model",
    "2:4": "model",
    "int8-weight-only": "llm",
    "int4-weight-only": "llm",
    "w8a8-dynamic": "llm",
}
METHODS = tuple(METHOD_FLOWS)
LLM_METHODS = tuple(name for name, flow in METHOD_FLOWS.items() if flow == "llm")


def method_help() -> str:
    """The `--method` help: every method, the LLM ones marked."""
    model = [name for name, flow in METHOD_FLOWS.items() if flow == "model"]
    return " | ".join(model) + " | LLM: " + " | ".join(LLM_METHODS)


def registry() -> dict[str, LLMQuantMethod]:
    """Every LLM method by name (imports each method's file)."""
    from flopwise.compress.methods import int4_weight_only, int8_weight_only, w8a8_dynamic

    methods = (int8_weight_only.METHOD, int4_weight_only.METHOD, w8a8_dynamic.METHOD)
    return {method.name: method for method in methods}


def get_method(name: str) -> LLMQuantMethod:
    """The method called `name`, or a one-line error listing the known ones."""
    methods = registry()
    if name not in methods:
        raise UserError(f"--method {name!r} is not an LLM compression method (allowed: {', '.join(methods)})")
    return methods[name]
