"""Every compression method, one file each, found by name in one registry.

A method is an object satisfying `base.Method` (name, flow, checks, `run(job)`). Two flows:
"model" (`model_flow.ModelMethod`: a task's network through `compress/model_run.py`: PT2E /
torch.ao INT8, QAT, pruning, 2:4) and "llm" (`llm_flow.LLMQuantMethod`: an HF causal-LM
folder in, a smaller one out that `AutoModelForCausalLM.from_pretrained` loads, through
`compress/llm.py`). Adding a method is one file here and one line in `ALL`; the config's
allowed values, the `--method` help and the command's dispatch all read this list.
No torch here: method files import it inside their functions.
"""

from __future__ import annotations

from flopwise.compress.methods import (
    int4_weight_only,
    int8_dynamic,
    int8_static,
    int8_weight_only,
    prune,
    qat,
    two_four,
    w8a8_dynamic,
)
from flopwise.compress.methods.base import Job, Method
from flopwise.compress.methods.llm_flow import LLMQuantMethod
from flopwise.compress.methods.model_flow import ModelMethod
from flopwise.errors import UserError

__all__ = ["ALL", "Job", "LLMQuantMethod", "LLM_METHODS", "METHOD_FLOWS", "METHODS", "Method", "ModelMethod",
           "get_method", "method_help", "registry"]

# The one list, in the order the help and the error messages show them.
ALL: tuple[Method, ...] = (
    int8_static.METHOD,
    int8_dynamic.METHOD,
    qat.METHOD,
    prune.METHOD,
    two_four.METHOD,
    int8_weight_only.METHOD,
    int4_weight_only.METHOD,
    w8a8_dynamic.METHOD,
)
METHOD_FLOWS = {method.name: method.flow for method in ALL}  # name -> "model" | "llm"
METHODS = tuple(METHOD_FLOWS)
LLM_METHODS = tuple(name for name, flow in METHOD_FLOWS.items() if flow == "llm")


def method_help() -> str:
    """The `--method` help: every method, the LLM ones marked."""
    model = [name for name, flow in METHOD_FLOWS.items() if flow == "model"]
    return " | ".join(model) + " | LLM: " + " | ".join(LLM_METHODS)


def registry() -> dict[str, Method]:
    """Every method by name."""
    return {method.name: method for method in ALL}


def get_method(name: str) -> Method:
    """The method called `name`, or a one-line error listing the known ones."""
    methods = registry()
    if name not in methods:
        raise UserError(f"--method {name!r} is not a compression method (allowed: {', '.join(methods)})")
    return methods[name]
