"""flopwise's own import graph has no cycles, between modules or between packages, and its
package arrows point the way docs/architecture.md draws them.

The graph is read from the source with `ast`: every `import flopwise...` / `from flopwise...`
(and relative import) counts, at module level and inside functions alike, because a
function-local import that closes a cycle is still a cycle (it only fails later, at
call time). Strongly connected components (Tarjan 1972) of more than one node are the
cycles; the test prints one path through each.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "flopwise"


def module_files(root: Path = SRC) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The module a dotted name lives in (`flopwise.train.loop.train_step` -> `flopwise.train.loop`)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """flopwise modules that `module` imports anywhere in its file."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            # `from flopwise.train import loop` imports the module `loop`, not only the package
            targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names]
        else:
            continue
        for target in targets:
            if target == "flopwise" or target.startswith("flopwise."):
                owner = _owner(target, modules)
                if owner and owner != module:
                    found.add(owner)
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the flopwise modules it imports."""
    modules = module_files()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The same graph between flopwise's sub-packages (`flopwise.plan`, `flopwise.train`, ...)."""

    def package(module: str) -> str:
        return ".".join(module.split(".")[:2])

    packages: dict[str, set[str]] = {}
    for module, targets in graph.items():
        edges = packages.setdefault(package(module), set())
        edges.update(package(t) for t in targets if package(t) != package(module))
    return packages


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (recursive; the graph is small)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def a_cycle(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """One closed path through a component, for the failure message."""
    members = set(component)
    path = [component[0]]
    while True:
        nxt = sorted(graph[path[-1]] & members)[0]
        if nxt in path:
            return path[path.index(nxt):] + [nxt]
        path.append(nxt)


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    return [" -> ".join(a_cycle(c, graph)) for c in strongly_connected(graph) if len(c) > 1]


def test_the_graph_is_read_from_the_source():
    graph = import_graph()
    assert "flopwise.train.loop" in graph and "flopwise.plan.planner" in graph
    assert "flopwise.errors" in graph["flopwise.plan.planner"]
    assert "flopwise.train.model" in graph["flopwise.train.build"]


def test_tarjan_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == ["a -> b -> c -> a"]


def test_no_module_imports_itself_back():
    cycles = _cycles(import_graph())
    assert not cycles, "import cycles between modules:\n" + "\n".join(cycles)


def test_no_package_imports_itself_back():
    cycles = _cycles(package_graph(import_graph()))
    assert not cycles, "import cycles between packages:\n" + "\n".join(cycles)


# Which packages each package may import (docs/architecture.md, "Packages and their direction").
# Leaf modules of flopwise (errors, safe_write, ...) are packages of one module here.
LEAVES = {"errors", "extras", "hf_logging", "rotary", "table_layout", "safe_write", "library_noise", "user_key"}
ALLOWED = {
    "__main__": {"cli"},
    "cli": {"plan", "train", "artifacts", "compress", "diagnose", "report", "evaluate", "catalog", "config",
            "flopwise", "errors", "extras"},
    "config": {"errors", "user_key"},  # runs sign their config.yaml with this user's key
    "runrecord": {"errors", "safe_write"},
    "catalog": {"errors", "table_layout"},
    "plan": {"config", "catalog", "runrecord", "errors", "table_layout"},
    "measure": {"plan", "catalog", "runrecord", "errors", "rotary", "safe_write", "flopwise"},
    "train": {"plan", "measure", "config", "runrecord", "catalog"} | LEAVES,
    "artifacts": {"train", "config", "runrecord"} | LEAVES,
    "compress": {"artifacts", "train", "config", "runrecord", "catalog"} | LEAVES,
    "diagnose": {"runrecord", "measure", "plan", "catalog"} | LEAVES,
    "report": {"runrecord"} | LEAVES,
    "evaluate": {"artifacts", "train", "config", "runrecord"} | LEAVES,
    "user_key": {"errors"},
    "library_noise": {"safe_write", "runrecord"},
    "safe_write": {"errors"},
}
# The trainer reaches the planner from these modules only: the forecast (`prediction.py`,
# `launch/forecast.py`), the parameter count that sizes a run (`launch/machine_fit.py`), and the
# pipeline's layer split (`parallel/parallelize.py`, numbers in, numbers out), and the default
# strategy's memory verdict (`launch/strategy_choice.py`: the rule `plan --config` applies too), and
# the LoRA target check's hint (`techniques/lora.py`: the planner's table of module spellings, data only).
TRAIN_TO_PLAN = {"flopwise.train.prediction", "flopwise.train.launch.forecast", "flopwise.train.launch.machine_fit",
                 "flopwise.train.parallel.parallelize", "flopwise.train.launch.strategy_choice",
                 "flopwise.train.techniques.lora"}


def _short(package: str) -> str:
    return package.split(".", 1)[1] if "." in package else package


def forbidden_arrows(graph: dict[str, set[str]]) -> list[str]:
    """Package arrows outside ALLOWED, each with one module pair that draws it."""
    found = []
    for module, targets in sorted(graph.items()):
        source = _short(".".join(module.split(".")[:2]))
        for target in sorted(targets):
            dest = _short(".".join(target.split(".")[:2]))
            if dest != source and dest not in ALLOWED.get(source, set()):
                found.append(f"{source} -> {dest} ({module} imports {target})")
    return found


def test_a_planted_forbidden_arrow_is_found():
    graph = {"flopwise.report.run_report": {"flopwise.diagnose.analyze", "flopwise.runrecord.run_data"}}
    assert forbidden_arrows(graph) == [
        "report -> diagnose (flopwise.report.run_report imports flopwise.diagnose.analyze)"]


def test_every_package_arrow_is_an_allowed_one():
    found = forbidden_arrows(import_graph())
    assert not found, "package arrows docs/architecture.md does not allow:\n" + "\n".join(found)


def test_the_trainer_reaches_the_planner_only_from_its_forecast_modules():
    graph = import_graph()
    reaching = {m for m, targets in graph.items() if m.startswith("flopwise.train")
                and any(t.startswith("flopwise.plan") for t in targets)}
    assert reaching <= TRAIN_TO_PLAN, f"train modules importing plan: {sorted(reaching - TRAIN_TO_PLAN)}"
    assert not any(t.startswith("flopwise.diagnose") for m, ts in graph.items() if m.startswith("flopwise.train")
                   for t in ts)


DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def documented_arrows(text: str) -> tuple[dict[str, set[str]], dict[str, str], set[str]]:
    """docs/architecture.md's direction table: package -> the packages its "may import" cell names,
    package -> its "why" cell, and the leaves every package may use."""
    import re

    table = text[text.index("| package | may import |"):]
    table = table[:table.index("\n\n")]
    arrows, why = {}, {}
    for row in table.splitlines()[2:]:
        _, package, may_import, reason, _ = (cell.strip() for cell in row.split("|"))
        arrows[package.strip("`")] = set(re.findall(r"`([a-z_]+)`", re.sub(r"\([^)]*\)", "", may_import)))
        why[package.strip("`")] = reason
    leaves_text = text[text.index("Every package may also use the one-module leaves"):]
    leaves = set(re.findall(r"`([a-z_]+)`", leaves_text[:leaves_text.index(".")]))
    return arrows, why, leaves


def test_docs_architecture_writes_the_allowed_arrows_this_test_checks():
    arrows, why, leaves = documented_arrows(DOC.read_text())
    assert leaves == LEAVES
    packages = [p for p in ALLOWED if p not in ("__main__", "cli", "flopwise") and p not in LEAVES]
    assert sorted(arrows) == sorted(["cli", *packages])
    for package in packages:
        checked = {p for p in ALLOWED[package] if p not in LEAVES and p != "flopwise"}
        assert arrows[package] - LEAVES == checked, f"{package}: the doc allows {sorted(arrows[package])}"
    for module in TRAIN_TO_PLAN:  # the trainer's ways into the planner are the ones the doc names
        assert module.removeprefix("flopwise.train.").replace(".", "/") + ".py" in why["train"], module


def test_a_doc_arrow_the_test_does_not_allow_is_told_apart():
    text = DOC.read_text().replace("| `report` | `runrecord` |", "| `report` | `runrecord`, `diagnose` |")
    arrows, _, _ = documented_arrows(text)
    assert arrows["report"] == {"runrecord", "diagnose"} != ALLOWED["report"] - LEAVES
