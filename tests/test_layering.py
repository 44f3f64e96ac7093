"""The dependency rules of DESIGN.md as a package graph: `models` <- `common` <- `edge`, `cloud`, `trainer` <-
`filterforward`.
Every import counts, also those inside functions (a lazy import is still a dependency)."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Which of our packages each package may import (besides itself).
ALLOWED = {
    "models": set(),
    "common": {"models"},
    "edge": {"models", "common"},
    "cloud": {"models", "common"},
    "trainer": {"models", "common"},
    "filterforward": {"models", "common", "edge", "cloud", "trainer"},
}
EDGE_MODULES = [
    "edge.node",
    "edge.replay",
    "edge.mcbank",
    "edge.pipeline",
    "edge.sources",
    "edge.camera_server",
    "models.bundle",
    "filterforward.cli",
]


def imported_packages(source: Path) -> set[str]:
    """Top-level names of everything `source` imports, absolute or relative (resolved to its package)."""
    tree = ast.parse(source.read_text(), filename=str(source))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add(source.relative_to(ROOT).parts[0] if node.level else (node.module or "").split(".")[0])
    return names


def package_graph() -> dict[str, dict[str, list[str]]]:
    """package -> imported package of ours -> the modules that import it."""
    graph: dict[str, dict[str, list[str]]] = {package: {} for package in ALLOWED}
    for package in ALLOWED:
        for source in sorted((ROOT / package).rglob("*.py")):
            for imported in imported_packages(source) & ALLOWED.keys() - {package}:
                graph[package].setdefault(imported, []).append(str(source.relative_to(ROOT)))
    return graph


def test_every_installed_package_has_a_layer() -> None:
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert {pattern.rstrip("*") for pattern in patterns["include"]} == ALLOWED.keys()


def test_packages_import_only_the_layers_below() -> None:
    graph = package_graph()
    wrong = {
        f"{package} -> {imported} ({', '.join(modules)})"
        for package, imports in graph.items()
        for imported, modules in imports.items()
        if imported not in ALLOWED[package]
    }
    assert not wrong, "imports against the layering:\n" + "\n".join(sorted(wrong))


def test_package_graph_is_acyclic() -> None:
    graph = package_graph()
    try:
        order = list(TopologicalSorter({package: set(imports) for package, imports in graph.items()}).static_order())
    except CycleError as error:
        raise AssertionError(f"the packages import in a cycle: {error.args[1]}") from None
    assert order[0] == "models" and order[-1] == "filterforward"


def test_edge_runtime_imports_no_torch_and_no_cloud() -> None:
    code = (
        f"import importlib, sys\nfor name in {EDGE_MODULES!r}: importlib.import_module(name)\n"
        "from filterforward.cli import build_parser; build_parser()\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'cloud', 'fastapi'))\n"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
