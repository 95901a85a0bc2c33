"""The stack registry: every agreed name resolves, aliases resolve, unknown names are one line."""

import pytest

from flopwise.errors import UserError
from flopwise.plan.spec import RunSpec
from flopwise.plan.stacks import FP8_RECIPES, STACK_NAMES, get_stack


def test_agreed_names_and_aliases():
    assert STACK_NAMES[0] == "flopwise"
    assert set(STACK_NAMES) == {"flopwise", "megatron-core", "megatron-lm", "deepspeed", "megatron-deepspeed",
                                "composer", "torchtitan", "flash-attn"}
    for alias in ("nemo", "megatron-bridge"):
        assert get_stack(alias) is get_stack("megatron-core")
    assert RunSpec.__dataclass_fields__["stack"].default == "flopwise"


def test_every_stack_is_complete_and_cites_sources():
    for name in STACK_NAMES:
        stack = get_stack(name)
        assert stack.name == name
        assert stack.framework in ("fsdp", "megatron", "deepspeed")
        assert stack.fp8_recipe in FP8_RECIPES
        assert stack.grad_bytes in (2.0, 4.0) and stack.fp8_gemm_input_bytes in (1.0, 2.0)
        assert 0.0 <= stack.allocator_reserve <= 0.2
        assert stack.sources and all(source.strip() for source in stack.sources)


def test_unknown_stack_is_one_line():
    with pytest.raises(UserError) as err:
        get_stack("jax")
    assert "\n" not in str(err.value) and "megatron-core" in str(err.value)
