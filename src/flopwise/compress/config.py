"""The `compress:` section of a run config, and the seed's `training.pruning` keys.

`RunConfig.compress` is a plain dict so the trainer does not depend on this package; it is
validated here, and every mistake is one line naming `compress.<key>` and what is allowed.
No torch here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from flopwise.compress.methods import METHODS, get_method
from flopwise.errors import UserError
from flopwise.config.schema import refuse_booleans_for_numbers

TASKS = ("lm", "digits-cnn", "digits-mlp")


class CompressConfig(BaseModel):
    """What to compress and how to measure it. Defaults give INT8 static PTQ with a histogram observer."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    method: Literal[METHODS] = "int8-static"  # compress/methods/__init__.py: the one list
    # auto: PT2E + X86InductorQuantizer on x86 CPUs (measured fastest here); eager torch.ao is the fallback.
    backend: Literal["auto", "pt2e-x86", "torchao", "eager"] = "auto"
    observer: Literal["minmax", "histogram", "percentile"] = "histogram"
    percentile: float = Field(99.99, gt=50.0, le=100.0)
    per_channel: bool = True
    weight_bits: int = Field(8, ge=2, le=8)
    calib_batches: int = Field(16, ge=1, le=10**6)
    qat_steps: int = Field(100, ge=1, le=10**9)
    sparsity: float = Field(0.6, ge=0.0, lt=1.0)
    scope: Literal["layer", "global"] = "layer"
    schedule: Literal["oneshot", "gradual"] = "oneshot"
    finetune_steps: int = Field(0, ge=0, le=10**9)
    lr: float = Field(1e-4, gt=0.0, le=10.0)
    batch_size: int = Field(32, ge=1, le=2**20)
    eval_batches: int = Field(8, ge=1, le=10**6)
    latency_batch: int = Field(16, ge=2, le=2**16)
    new_tokens: int = Field(32, ge=1, le=4096)  # LLM methods: tokens generated per timed call
    latency_warmup: int = Field(3, ge=1, le=10**4)
    latency_iters: int = Field(20, ge=3, le=10**6)
    threads: int | None = Field(None, ge=1, le=4096)
    compile: bool = True
    task: Literal["lm", "digits-cnn", "digits-mlp"] | None = None
    out: Path | None = None

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value, info: ValidationInfo):
        """Numbers refuse YAML booleans, as in the run config's sections."""
        return refuse_booleans_for_numbers(cls, value, info)

    @field_validator("out", mode="after")
    @classmethod
    def _plain_path(cls, value):
        if value is not None and ("\x00" in str(value) or len(str(value)) > 4096):
            raise ValueError("must be a path without NUL characters, at most 4096 characters")
        return value


def parse_compress_config(section: dict | None, pruning: object | None = None, source: str = "config") -> CompressConfig:
    """Validate a `compress:` dict; a seed-style `training.pruning` block alone means method=prune.

    `pruning` is the trainer's PruningConfig (or None). Its sparsity and scope are used when
    the compress section does not set them.
    """
    data = dict(section or {})
    if pruning is not None:
        data.setdefault("method", "prune")
        if data["method"] == "prune":
            data.setdefault("sparsity", getattr(pruning, "sparsity"))
            data.setdefault("scope", getattr(pruning, "scope", "layer"))
    try:
        cfg = CompressConfig.model_validate(data)
    except ValidationError as err:
        raise UserError(f"{source}: {describe_error(err)}") from None
    check_combination(cfg, source)
    return cfg


def check_combination(cfg: CompressConfig, source: str = "config") -> None:
    """Combinations that each key allows alone but that the method cannot run, caught before any training."""
    get_method(cfg.method).check(cfg, source)


def describe_error(err: ValidationError) -> str:
    """The first validation problem as `compress.<key>: what is wrong (allowed: ...)`."""
    first = err.errors()[0]
    key = ".".join(str(part) for part in first["loc"])
    if first["type"] == "extra_forbidden":
        allowed = ", ".join(CompressConfig.model_fields)
        return f"compress.{key}: unknown key (allowed: {allowed})"
    if first["type"] == "literal_error":
        return f"compress.{key}: {_short(first['input'])} is not allowed ({first['msg'].replace('Input should be ', 'expected ')})"
    message = first["msg"].removeprefix("Value error, ")
    return f"compress.{key}: {message} (got {_short(first['input'])})"


def _short(value) -> str:
    """A bounded repr: a value built from YAML aliases can be huge (a "billion laughs" document)."""
    import reprlib

    shortener = reprlib.Repr()
    shortener.maxlevel, shortener.maxstring, shortener.maxother = 2, 80, 80
    return shortener.repr(value)


def check_method(method: str) -> str:
    """A method name from the command line, or a UserError listing the allowed ones."""
    return get_method(method).name
