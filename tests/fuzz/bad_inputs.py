"""A seeded generator of invalid inputs: run-config overrides, config files, CLI flags.

Every case is invalid by construction (a bound crossed, a non-finite float, a wrong type
inside a list, a duplicate key, an unknown key, a broken file), so the only right answer
is a one-line error and a non-zero exit. Values are derived from the schemas themselves
(pydantic field constraints), so a field added later is fuzzed without editing this file.
"""

from __future__ import annotations

import random
import typing
from dataclasses import dataclass

from pydantic import BaseModel

from flopwise.compress.config import CompressConfig
from flopwise.plan.flag_bounds import BOUNDS, COUNT_BOUNDS
from flopwise.config.schema import RunConfig

SEED = 20261203
NON_FINITE = [".inf", "-.inf", ".nan", "1e400", "-1e400"]
YAML_BOOLEANS = ["on", "yes", "no", "true"]  # booleans in YAML, never a number
HUGE_INTS = ["99999999999999999999", "18446744073709551616", "1" + "0" * 300, "-1" + "0" * 40]


@dataclass(frozen=True)
class Case:
    kind: str  # "override" | "file" | "cli"
    payload: tuple[str, ...]  # overrides, or file text + overrides, or CLI argv

    def __str__(self) -> str:
        return f"{self.kind}: {' '.join(p[:120] for p in self.payload)}"


def _constraints(field) -> dict:
    found = {}
    for meta in field.metadata:
        for name in ("ge", "gt", "le", "lt"):
            value = getattr(meta, name, None)
            if value is not None:
                found[name] = value
    return found


def _base_types(annotation) -> set[type]:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:  # StrictInt and the like: the type they annotate
        return _base_types(typing.get_args(annotation)[0])
    if origin is None:
        return {annotation} if isinstance(annotation, type) else set()
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", typing.Union)):
        found = set()
        for arg in typing.get_args(annotation):
            found |= _base_types(arg)
        return found
    if origin is typing.Literal:
        return {typing.Literal}
    return {origin}


def _bad_values(field, rng: random.Random) -> list[str]:
    """YAML texts that the field must refuse."""
    types = _base_types(field.annotation)
    bounds = _constraints(field)
    bad: list[str] = []
    if types & {int, float} and bool not in types:
        bad += ["'12'x", "[1, 2]", "{a: 1}", "abc", *YAML_BOOLEANS]
        if "ge" in bounds:
            bad.append(repr(bounds["ge"] - (1 if isinstance(bounds["ge"], int) else 1e-3 * max(1, abs(bounds["ge"])))))
        if "gt" in bounds:
            bad.append(repr(bounds["gt"]))
        if "le" in bounds:
            high = bounds["le"]
            low = bounds.get("ge", bounds.get("gt", float("-inf")))
            huge = [v for v in HUGE_INTS if not low <= int(v) <= high]  # 2^64 is inside a bound of 2^64
            bad += [repr(high * 10 + 1 if high > 0 else high + 1), rng.choice(huge)]
        if "lt" in bounds:
            bad.append(repr(bounds["lt"]))
        if float in types:
            bad += NON_FINITE
    if typing.Literal in types:  # a number is a fine value where the field also takes one (int | Literal["all"])
        bad += ["not-a-choice", "[]"] + ([] if int in types else ["42"])
    if types == {bool}:
        bad += ["maybe", "2", "[true]"]
    if list in types or tuple in types:
        inner = {t for arg in typing.get_args(field.annotation) for t in _base_types(arg)}
        bad += ["[1, 2]", "[[a]]", "[{a: 1}]"] if str in inner else ["['x', 'y']", "[.nan, .inf]", "[[1]]"]
    return bad


def _sections(model: type[BaseModel], prefix: str = ""):
    for name, field in model.model_fields.items():
        nested = [a for a in (field.annotation, *typing.get_args(field.annotation))
                  if isinstance(a, type) and issubclass(a, BaseModel)]
        if nested:
            yield from _sections(nested[0], f"{prefix}{name}.")
        else:
            yield f"{prefix}{field.alias or name}", field  # checkpoint.async: by the name users write


CROSS_FIELD = [
    ("data.seq_len=512", "model.max_seq_len=256"),
    ("training.lr=0.001", "training.min_lr=0.01"),
    ("parallel.nnodes=2", "parallel.node_rank=2"),
    ("precision.mode=bf16-params", "parallel.strategy=ddp"),
    ("compress.method=prune", "compress.schedule=gradual"),
    ("compress.method=int8-static", "compress.backend=torchao"),
    ("parallel.rdzv_endpoint=host:0",),
    ("parallel.rdzv_endpoint=host:99999",),
    ("parallel.rdzv_endpoint=:29500",),
]

SYNTAX = ["training", "=5", "training.=5", ".max_steps=5", "training..max_steps=5", "nosection.key=1",
          "training.max_stepz=5", "model=5", "training.max_steps.x=1", "compress={a: 1, a: 2}",
          "training.betas=[0.9]", "training.betas=[0.9, 0.9, 0.9]", "checkpoint.pin=[1, 'two']",
          "data.paths=[1, 2]", "data.paths=[[a]]", "training.gradient_checkpointing=-1",
          "training.gradient_checkpointing=1e30", "compress=[1, 2]", "compress.out=" + "x" * 5000,
          "logging.run_dir=" + "r" * 5000, "logging.run_dir=", "logging.run_dir=' '", "training.max_steps=" + "[" * 3000 + "]" * 3000]

FILES = [
    "training:\n  lr: 0.1\n  lr: 0.2\n",
    "training: {max_steps: 5}\ntraining: {max_steps: 6}\n",
    "model:\n  hidden: 64\n  n_heads: 2\n  hidden: 32\n",
    "compress:\n  method: prune\n  method: qat\n",
    "- a\n- b\n",
    "just a string\n",
    "training: 5\n",
    "training:\n\tmax_steps: 5\n",
    "training: {max_steps: [\n",
    "a: &x [1]\nb: *y\n",
    "!!python/object/apply:os.system ['true']\n",
    "training: {lr: !!python/name:os.system }\n",
    "[" * 5000 + "]" * 5000 + "\n",
    "training: {seed: 1e400}\n",
    "data: {paths: [1, 2, 3]}\n",
    "data: {paths: 'one string, not a list'}\n",
    "checkpoint: {pin: ['1', 2]}\n",
    "model: {kind: llama, hidden: .nan}\n",
]

LAUGHS = "\n".join(['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
                   + [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)])
FILES += [  # "billion laughs": aliases that expand to 9^9 strings; the error must not print them
    "compress:\n  refs:\n" + "\n".join("    " + line for line in LAUGHS.splitlines()) + "\n  method: *a8\n",
    "compress:\n  method: prune\n  out:\n" + "\n".join("    " + line for line in LAUGHS.splitlines()) + "\n",
    "refs:\n" + "\n".join("  " + line for line in LAUGHS.splitlines()) + "\ndata:\n  paths: *a8\n",
    "refs:\n" + "\n".join("  " + line for line in LAUGHS.splitlines()) + "\ntraining:\n  betas: *a8\n",
    "model:\n  hidden: '" + "9" * 100_000 + "'\n",
]

_PLAN_SPECIAL = {"zero": ["4", "-1"], "pue": ["0.5", "0.99"], "memory_reserve_gib": ["-1", "inf"]}


def _cli_cases(rng: random.Random) -> list[Case]:
    plan_flags = {"gpus", "dp", "tp", "pp", "micro_batch", "global_batch", "seq_len", "zero", "virtual_stages",
                  "efficiency", "price_per_hour", "spot_price_per_hour", "pue", "memory_reserve_gib", "top",
                  "preemptions_per_day", "checkpoint_seconds", "restart_seconds", "host_memory_gib"}
    compare_flags = {"gpus", "seq_len", "budget_usd", "deadline_days", "max_devices", "price_per_hour",
                     "global_batch", "host_memory_gib"}
    cases = []
    for command, flags in (("plan", plan_flags), ("compare", compare_flags)):
        for name in sorted(flags):
            low, high, _ = BOUNDS[name]
            is_int = isinstance(low, int) and isinstance(high, int)
            values = [str(high * 10 + 7) if is_int else repr(high * 10 + 7), "1e30", "-5", "nan", "inf", "-inf",
                      "abc", "1" + "0" * 40, *_PLAN_SPECIAL.get(name, [])]
            if low > 0:
                values.append("0")
            for value in values:
                cases.append(Case("cli", (command, f"--{name.replace('_', '-')}", value)))
        for name in COUNT_BOUNDS:
            if name == "batch_tokens" or command == "plan":
                for value in ("1e300", "-1", "nan", "x", "1e400", "99999999999999P"):
                    cases.append(Case("cli", (command, f"--{name.replace('_', '-')}", value)))
    cases += [Case("cli", ("plan", "--gpus", str(rng.randint(10**7, 10**30)), "--search")) for _ in range(3)]
    for flag, values in (("--nproc", ["100000", "0", "-3", "1e9"]), ("--iters", ["0", "-1", "10000000000"]),
                         ("--warmup", ["-1", "10000000000"]), ("--sizes", ["1000G", "0", "-1K", "x", ",", "1e400"])):
        cases += [Case("cli", ("bench", flag, value)) for value in values]
    for flag, values in (("--sparsity", ["nan", "1.5", "-0.1"]), ("--threads", ["0", "100000"]),
                         ("--calib-batches", ["0", "1000000000000"]), ("--qat-steps", ["0", "-5"]),
                         ("--finetune-steps", ["-1", "10000000000000"])):
        cases += [Case("cli", ("compress", "--task", "digits-mlp", "--method", "prune", flag, value)) for value in values]
    return cases


# Inputs that reach past the config into a command: `{tmp}` is a folder `write_input_files` filled.
HF_CONFIGS = {
    "hf_zero_heads.json": {"num_attention_heads": 0},
    "hf_heads_do_not_divide.json": {"hidden_size": 64, "num_attention_heads": 5},
    "hf_four_terabytes.json": {"hidden_size": 65536, "num_attention_heads": 64, "intermediate_size": 262144,
                               "num_hidden_layers": 15},  # ~1e12 parameters: 4 TB of fp32 weights
}
ONE_PROCESS = ("parallel.nproc_per_node=1", "parallel.strategy=single", "logging.run_dir={tmp}/run")
COMMANDS = [
    *[("train", "model.kind=hf", f"model.hf_config={{tmp}}/{name}", *ONE_PROCESS) for name in HF_CONFIGS],
    ("train", "parallel.nproc_per_node=1", "parallel.strategy=single", "logging.run_dir=/proc/flopwise-fuzz"),
    ("train", "parallel.nproc_per_node=1", "parallel.strategy=single", "logging.run_dir={tmp}/a-file"),
    ("train", "parallel.nproc_per_node=1", "parallel.strategy=single", "logging.run_dir="),
    ("export", "{tmp}", "--out", "/proc/flopwise-fuzz/x"),
    ("export", "{tmp}", "--out", "{tmp}/a-file"),
    *[("generate", "{tmp}", "-p", "x", flag, value) for flag, value in
      (("--temperature", "nan"), ("--temperature", "inf"), ("--temperature", "-1"), ("--top-p", "nan"),
       ("--top-p", "0"), ("--max-new-tokens", "0"), ("--top-k", "-1"))],
    # a run's files (tests/security/): remote code from a file, unsigned records, a memory bomb, a FIFO
    ("train", "model.kind=hf", "model.hf_config={tmp}/hf_auto_map.json", *ONE_PROCESS),
    ("export", "{tmp}/unsigned-run"), ("export", "{tmp}/unsigned-run", "--accept-run"),
    ("compress", "{tmp}/unsigned-run", "--method", "int8-dynamic"),
    ("compress", "{tmp}/unsigned-run", "--method", "int8-weight-only"),
    ("generate", "{tmp}/unsigned-run", "-p", "x"), ("generate", "{tmp}/unsigned-run", "-p", "x", "--accept-run"),
    ("generate", "{tmp}/auto-map-hf", "-p", "x"),
    ("export", "{tmp}/memo-bomb-run", "--accept-run"), ("export", "{tmp}/fifo-run", "--accept-run"),
    ("plan", "--hardware", ""), ("plan", "--hardware", " "), ("plan", "--hardware", "", "--json"),
    ("plan", "--model", ""), ("compare", "--hardware", ""),
]


def write_input_files(folder) -> None:
    """The files COMMANDS name under `{tmp}`: HF configs that no model can have, and a plain file."""
    import json

    base = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
            "num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 4096,
            "max_position_embeddings": 256}
    for name, changes in HF_CONFIGS.items():
        (folder / name).write_text(json.dumps({**base, **changes}))
    (folder / "a-file").write_text("not a folder\n")
    remote = {**base, "model_type": "fuzz-remote", "auto_map": {"AutoConfig": "fuzz_code.Config"}}
    (folder / "hf_auto_map.json").write_text(json.dumps(remote))
    (folder / "auto-map-hf").mkdir()
    (folder / "auto-map-hf" / "config.json").write_text(json.dumps(remote))
    write_run_files(folder)


def write_run_files(folder) -> None:
    """Run directories forged as tests/security/ forges them: each refused by export / compress / generate."""
    import json
    import os
    import pickle
    import struct

    import torch
    import torch.distributed.checkpoint as dcp

    from flopwise.train.checkpoint.store import quiet_single_process_notice
    from flopwise.config.loading import load_config
    from flopwise.train.model import build_model
    from tests.security.forged_runs import rehash

    cfg = load_config(None, ["model.n_layers=1", "model.hidden=32", "model.n_heads=2", "model.max_seq_len=32",
                             "data.seq_len=16", f"logging.run_dir={folder}/run"])
    remote = cfg.model_dump(mode="json")
    remote["model"].update(kind="hf", hf_config=str(folder / "hf_auto_map.json"), trust_remote_code=True)
    for name, config in (("unsigned-run", remote), ("memo-bomb-run", cfg.model_dump(mode="json")),
                         ("fifo-run", cfg.model_dump(mode="json"))):
        step = folder / name / "checkpoints" / "step-1"
        step.mkdir(parents=True)
        if name == "fifo-run":
            with quiet_single_process_notice():
                dcp.save({"model": build_model(cfg.model, 64).state_dict()}, checkpoint_id=str(step))
            meta = pickle.loads((step / ".metadata").read_bytes())
            os.mkfifo(folder / "pipe")
            for info in meta.storage_data.values():
                info.relative_path = "../../../pipe"
            (step / ".metadata").write_bytes(pickle.dumps(meta))
        elif name == "memo-bomb-run":
            (step / ".metadata").write_bytes(b"\x80\x04Nr" + struct.pack("<I", 2**30) + b".")
        manifest = {"format": 1, "step": 1, "world_size": 1, "strategy": "single", "state_format": "dcp",
                    "vocab_size": 64, "config": config, "files": {n: {} for n in os.listdir(step)}}
        (step / "manifest.json").write_text(json.dumps(manifest))
        rehash(step)  # sizes and hashes match (and the manifest is signed; unsigned-run drops it below)
        if name == "unsigned-run":
            manifest = json.loads((step / "manifest.json").read_text())
            del manifest["signature"]
            (step / "manifest.json").write_text(json.dumps(manifest))
            (folder / name / "config.yaml").write_text(json.dumps(config))
            (folder / name / "export").mkdir()
            (folder / name / "export" / "model.safetensors").write_bytes(b"")


def generate(min_cases: int = 1000) -> list[Case]:
    """At least `min_cases` distinct invalid inputs, the same ones for the same SEED."""
    rng = random.Random(SEED)
    cases: list[Case] = []
    for key, field in list(_sections(RunConfig)) + [(f"compress.{k}", f) for k, f in CompressConfig.model_fields.items()]:
        if key == "compress":
            continue
        for value in _bad_values(field, rng):
            cases.append(Case("override", (f"{key}={value}",)))
    cases += [Case("override", pair) for pair in CROSS_FIELD]
    cases += [Case("override", (item,)) for item in SYNTAX]
    cases += [Case("file", (text,)) for text in FILES]
    cases += _cli_cases(rng)
    cases += [Case("cli", command) for command in COMMANDS]
    # random combinations of a valid override with an invalid one, until there are enough
    singles = [c.payload[0] for c in cases if c.kind == "override" and len(c.payload) == 1]
    valid = ["training.max_steps=20", "model.hidden=64", "data.seq_len=64", "training.lr=0.001",
             "logging.progress=false", "parallel.nproc_per_node=1"]
    seen = set(cases)
    while len(seen) < min_cases:
        case = Case("override", (rng.choice(valid), rng.choice(singles)))
        if case not in seen:
            seen.add(case)
            cases.append(case)
    return cases

