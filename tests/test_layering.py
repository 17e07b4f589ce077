"""The import graph's shape: one acyclic core (base -> storage -> format -> decode -> pipeline ->
loader) with Energon's API as a layer of adapters on top that the core never imports. The graph is
read from the source, imports inside functions included and ``if TYPE_CHECKING:`` ones left out
(tests/import_graph.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from import_graph import PACKAGE, cycles, describe_cycles, import_graph, layer_violations, short

#: Energon's API, adapters the core never imports (module names below megatron_energon_lite;
#: a prefix covers its submodules).
ENERGON_LAYER = ("energon",)

#: The modules above the layer, allowed to import it: the CLI, previews, the public names
#: (the package root), the as_energon alias table, and our ready-made task encoders (they are
#: Energon TaskEncoders, so that their users may override build_* too).
ABOVE_THE_LAYER = ("cli", "preview", "__init__", "as_energon", "encoders")


@pytest.fixture(scope="module")
def graph():
    return import_graph()


def test_no_import_cycles(graph) -> None:
    found = cycles(graph)
    assert not found, "import cycles (strongly connected components):\n" + describe_cycles(graph, found)


def test_the_core_does_not_import_the_energon_layer(graph) -> None:
    found = layer_violations(graph, ENERGON_LAYER, ABOVE_THE_LAYER)
    assert not found, "core modules importing the Energon layer:\n" + "\n".join(f"    {edge}" for edge in found)


def test_the_graph_reads_imports_as_python_runs_them(tmp_path: Path) -> None:
    """The helpers on a made-up package (named like ours, so names read the same)."""
    root = tmp_path / PACKAGE
    files = {
        "__init__.py": "",
        "a.py": "from . import b\n\ndef f():\n    from .c import thing\n",
        "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import X\nelse:\n    from .sub.d import z\n",
        "c.py": f"import {PACKAGE}.a\nimport os\n",
        "sub/__init__.py": "",
        "sub/d.py": "from .. import c\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    graph = import_graph(root)
    edges = {(short(e.source), short(e.target), e.in_function) for edges in graph.values() for e in edges}
    assert edges == {("a", "b", False), ("a", "c", True), ("b", "sub.d", False), ("c", "a", False), ("sub.d", "c", False)}
    assert [sorted(map(short, c)) for c in cycles(graph)] == [["a", "b", "c", "sub.d"]]
    assert "a -> c  (a.py:4; inside a function)" in describe_cycles(graph, cycles(graph))
    assert [(short(e.source), short(e.target)) for e in layer_violations(graph, ("c",), ("sub",))] == [("a", "c")]


def _imports_of_our_package_inside_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            ours = (isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").startswith(PACKAGE))) or (
                isinstance(node, ast.Import) and any(alias.name.startswith(PACKAGE) for alias in node.names)
            )
            if ours:
                found.append(f"{path.name}:{node.lineno} in {function.name}()")
    return found


def test_the_core_imports_its_own_modules_at_the_top() -> None:
    """An import inside a function hides an edge of the graph (and often a cycle dodged); only the
    CLI defers some, to start without torch for the commands that never need it."""
    root = Path(__file__).resolve().parent.parent / PACKAGE
    found = [hit for path in sorted(root.rglob("*.py")) if path.relative_to(root).parts[0] != "cli" for hit in _imports_of_our_package_inside_functions(path)]
    assert not found, "imports of the package inside functions:\n" + "\n".join(f"    {hit}" for hit in found)
