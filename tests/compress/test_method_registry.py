"""One list of compression methods: every method is a file in compress/methods/ registered once,
reachable from `flopwise compress --method`, and the command itself names no method."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
import typer

from flopwise.compress import commands
from flopwise.compress.commands import resolve_config
from flopwise.compress.config import CompressConfig
from flopwise.compress.methods import ALL, LLM_METHODS, METHOD_FLOWS, METHODS, Job, Method, get_method, registry
from flopwise.compress.methods.base import FLOWS

METHODS_DIR = Path(importlib.import_module("flopwise.compress.methods").__file__).parent
NOT_METHOD_FILES = {"__init__.py", "base.py", "model_flow.py", "llm_flow.py"}  # the protocol and the two flows
# Names that hold, or are compared with, a method's identity: the command must not branch on them.
METHOD_WORDS = {"method", "flow", "METHODS", "LLM_METHODS", "METHOD_FLOWS", "INT8_METHODS"}


def method_branches(source: str, names: tuple[str, ...]) -> list[tuple[int, str]]:
    """(line, what) of each place in `source` that spells a method name or compares a method's identity."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and node.value in names:
            found.append((node.lineno, f"the method name {node.value!r}"))
        elif isinstance(node, (ast.Compare, ast.Match)):
            words = {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
            words |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            if words & METHOD_WORDS:
                found.append((node.lineno, f"a comparison with {sorted(words & METHOD_WORDS)}"))
        elif isinstance(node, ast.ImportFrom):
            imported = {alias.name for alias in node.names} & METHOD_WORDS
            if imported:
                found.append((node.lineno, f"an import of {sorted(imported)}"))
    return found


def test_every_method_file_holds_one_registered_method_and_the_lists_derive_from_the_registry():
    files = sorted(p.stem for p in METHODS_DIR.glob("*.py") if p.name not in NOT_METHOD_FILES)
    registered = sorted(_module_of(m) for m in ALL)
    assert files == registered, "a method file is not registered, or a registered method has no file of its own"
    assert len(set(METHODS)) == len(ALL) == 8
    assert tuple(registry()) == METHODS == tuple(METHOD_FLOWS)
    assert LLM_METHODS == tuple(m.name for m in ALL if m.flow == "llm")
    assert set(METHOD_FLOWS.values()) == set(FLOWS)
    for method in ALL:
        assert isinstance(method, Method), method.name
        assert method.summary and get_method(method.name) is method


def _module_of(method) -> str:
    """The file (in compress/methods/) whose METHOD is `method`."""
    for path in METHODS_DIR.glob("*.py"):
        if path.name not in NOT_METHOD_FILES:
            module = importlib.import_module(f"flopwise.compress.methods.{path.stem}")
            if getattr(module, "METHOD", None) is method:
                return path.stem
    return f"<no file for {method.name}>"


@pytest.mark.parametrize("name", METHODS)
def test_every_registered_method_is_reachable_from_the_command_line(name, tmp_path):
    """`--method NAME` is offered, accepted, resolved to the registered object, and makes a Job it can run."""
    app = typer.Typer()
    commands.register(app)
    option = next(p for p in typer.main.get_command(app).params if p.name == "method")
    assert name in option.help.replace(" | ", " ").replace("LLM: ", "").split()
    assert name in CompressConfig.model_fields["method"].annotation.__args__
    target = "digits-cnn" if METHOD_FLOWS[name] == "model" else str(tmp_path / "run")
    cfg, source = resolve_config(target, {"method": name})
    method = get_method(cfg.method)
    assert cfg.method == name and method is registry()[name]
    job = Job(cfg=cfg, source=source, out=tmp_path / "out", latency_batch=method.timed_batch(cfg, None))
    assert job.latency_batch >= 1 and callable(method.run)


def test_the_command_names_no_method_and_branches_on_none():
    assert method_branches(Path(commands.__file__).read_text(), METHODS) == []


def test_a_planted_branch_on_a_method_is_found():
    planted = ('from flopwise.compress.config import LLM_METHODS\n'
               'if cfg.method in LLM_METHODS:\n    pass\n'
               'elif method.flow == x:\n    pass\n'
               'run = {"prune": 1}\n')
    found = method_branches(planted, METHODS)
    assert [line for line, _ in found] == [1, 2, 4, 6], found
