"""What every LLM compression method provides (kept apart so method files need not import the registry)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class LLMQuantMethod:
    """A torchao weight quantization that transformers can save and load.

    `torchao_config(device_type)` returns the torchao config for that device ("cpu"/"cuda");
    `note(device_type)` says what the device gets when it differs from the name (or "").
    """

    name: str
    summary: str
    torchao_config: Callable[[str], object]
    note: Callable[[str], str] = lambda device_type: ""
    # inputs per scale group on that device (None: not grouped); linears whose input width is not a
    # multiple of it are left in float (`compress/llm.py: ungroupable_linears`)
    group_size: Callable[[str], int | None] = lambda device_type: None
