"""config/precision.py: `precision_of` is the one place a mode name becomes a `Precision`, and the
trainer reads that decision from the resolved run (`ResolvedRun.precision`), never from the mode string.

Two readers that each turn `cfg.precision.mode` into a dtype agree only while nobody changes the
mode after the run is resolved; a pretrained model's device default once did exactly that (plan.json
said fp32 while the model trained in bf16). The scan below keeps every trainer module on `run.precision`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from flopwise.config.precision import MODES, precision_of
from flopwise.errors import UserError

TRAIN = Path(__file__).resolve().parents[2] / "src" / "flopwise" / "train"

# Reads of the mode that stay, each with its reason (module relative to train/ -> function).
EXEMPT = {
    # Runs in every rank process before it joins the process group and resolves its run (a torchrun
    # rank reaches it straight from its config file); it only names the mode the user wrote in a
    # warning that this CPU runs bf16 slower (measure/bf16_on_cpu.py) and decides nothing about the run.
    ("launch/start.py", "_warn_about_bf16_on_cpu"),
}


def _chain(node: ast.AST) -> list[str]:
    """`self.cfg.precision` -> ['self', 'cfg', 'precision'] ([] when the chain does not start at a name)."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return []
    return [node.id, *reversed(names)]


def mode_reads(source: str) -> list[tuple[str, int, str]]:
    """(function, line, what) for each place `source` derives precision from the mode string itself:
    a `precision_of` call, a read of `<x>.precision.mode` (the config's field; `run.precision.mode`,
    the resolved run's name for its precision, is fine), or `.mode` of a parameter typed `PrecisionConfig`."""
    found = []

    def visit(node: ast.AST, function: str, config_params: frozenset[str]) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            typed = {a.arg for a in args if a.annotation is not None and "PrecisionConfig" in ast.unparse(a.annotation)}
            function, config_params = node.name, frozenset(typed)
        if isinstance(node, ast.Name) and node.id == "precision_of":
            found.append((function, node.lineno, "precision_of"))
        if isinstance(node, ast.Attribute) and node.attr == "mode" and isinstance(node.ctx, ast.Load):
            chain = _chain(node)
            if len(chain) >= 3 and chain[-2] == "precision" and chain[:-2] not in (["run"], ["self", "run"]):
                found.append((function, node.lineno, ".".join(chain)))
            elif len(chain) == 2 and chain[0] in config_params:
                found.append((function, node.lineno, ".".join(chain)))
        for child in ast.iter_child_nodes(node):
            visit(child, function, config_params)

    visit(ast.parse(source), "<module>", frozenset())
    return found


def test_no_trainer_module_derives_precision_from_the_mode_string():
    found = []
    for path in sorted(TRAIN.rglob("*.py")):
        module = path.relative_to(TRAIN).as_posix()
        for function, line, what in mode_reads(path.read_text()):
            if (module, function) not in EXEMPT:
                found.append(f"train/{module}:{line} ({function}): {what}")
    assert found == [], "read the run's resolved precision (`run.precision`) instead:\n" + "\n".join(found)


def test_every_exemption_still_reads_the_mode():
    """An exemption whose read has gone is stale and would hide a new one."""
    for module, function in EXEMPT:
        assert any(f == function for f, _, _ in mode_reads((TRAIN / module).read_text())), (module, function)


def test_the_scan_finds_each_way_of_reading_the_mode():
    source = '''
from flopwise.config.precision import precision_of
def build(cfg, run):
    a = precision_of(cfg.precision.mode)
    b = self.cfg.precision.mode
    c = run.precision.mode
    cfg.precision.mode = "bf16"
def strategy(precision: PrecisionConfig, resolved: Precision):
    return precision.mode, resolved.mode
'''
    assert sorted(mode_reads(source)) == [
        ("build", 4, "cfg.precision.mode"),
        ("build", 4, "precision_of"),
        ("build", 5, "self.cfg.precision.mode"),
        ("strategy", 9, "precision.mode"),
    ]


@pytest.mark.parametrize("mode", MODES)
def test_each_mode_names_itself_and_only_fp16_scales_the_loss(mode):
    precision = precision_of(mode)
    assert precision.mode == mode
    assert precision.loss_scaling == (precision.compute_dtype == "fp16")
    assert precision.pure == (mode == "bf16-true")


def test_an_unknown_mode_is_one_line_naming_the_allowed_ones():
    with pytest.raises(UserError, match=r"precision.mode='fp8' is not one of: fp32, bf16") as caught:
        precision_of("fp8")
    assert "\n" not in str(caught.value)
