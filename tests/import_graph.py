"""The package's import graph, read from its source with ``ast`` (nothing is imported).

An edge ``A -> B`` means that module ``A`` imports something module ``B`` owns, wherever the
``import`` statement sits: at module level or inside a function, since a function-level import
is still a dependency (it only runs later).  Imports under ``if TYPE_CHECKING:`` are left out:
they never run.  Relative imports are resolved against the importing module's package.

A name is owned by the longest module that contains it: ``from ..storage import as_path`` in
``epathlib/epath.py`` is an edge to ``storage`` (the package's ``__init__``), ``from ..storage
import paths`` one to ``storage.paths``.  Importing ``a.b.c`` also runs ``a/__init__.py`` and
``a/b/__init__.py``; those implicit edges are left out (every module would then depend on the
package root, which names everything).

Used by ``tests/test_layering.py``; run ``python tests/import_graph.py`` for a report.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "megatron_energon_lite"


@dataclass(frozen=True)
class Edge:
    """One import statement's dependency: ``source`` imports ``target`` at ``path:line``."""

    source: str
    target: str
    path: Path
    line: int
    in_function: bool

    @property
    def where(self) -> str:
        return "inside a function" if self.in_function else "module level"

    def __str__(self) -> str:
        return f"{short(self.source)} -> {short(self.target)}  ({self.path.name}:{self.line}; {self.where})"


def short(module: str) -> str:
    """``megatron_energon_lite.storage.paths`` -> ``storage.paths``; the root is ``__init__``."""
    return module.removeprefix(PACKAGE).removeprefix(".") or "__init__"


def package_dir() -> Path:
    """The package's source folder in this checkout (the tests' sibling), whatever sys.path finds."""
    return Path(__file__).resolve().parents[1] / PACKAGE


def find_modules(root: Path) -> dict[str, Path]:
    """Every module under the package folder ``root`` by dotted name (a package by its own name,
    not ``.__init__``)."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = (PACKAGE, *path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def runtime_imports(tree: ast.AST) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """The import statements that can run, each with whether it sits inside a function.

    Skipped: the body of ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``); its ``else`` runs.
    """
    found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append((node, in_function))
            return
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child, in_function)
            return
        inside = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    visit(tree, False)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_names(module: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The absolute dotted names a statement imports: ``from .x import y`` in ``p.m`` -> ``p.x.y``."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level == 0:
        base = node.module or ""
    else:
        package = module if is_package else module.rpartition(".")[0]
        parts = package.split(".")
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join([*parts, node.module] if node.module else parts)
    return [f"{base}.{alias.name}" if alias.name != "*" else base for alias in node.names]


def owner(name: str, modules: dict[str, Path]) -> str | None:
    """The module that owns ``name``: ``name`` itself if it is a module, else its longest
    module prefix; None outside the package."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(root: Path | None = None) -> dict[str, list[Edge]]:
    """Every module of the package (at ``root``, default :func:`package_dir`) with its edges to
    other modules of the package."""
    modules = find_modules(root or package_dir())
    graph: dict[str, list[Edge]] = {}
    for module, path in modules.items():
        edges: dict[Edge, None] = {}  # one edge per statement and target, in source order
        for node, in_function in runtime_imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            for name in imported_names(module, path.name == "__init__.py", node):
                target = owner(name, modules)
                if target is not None and target != module:
                    edges[Edge(module, target, path, node.lineno, in_function)] = None
        graph[module] = list(edges)
    return graph


def reachable(graph: dict[str, list[Edge]], start: str) -> set[str]:
    """The modules ``start`` imports directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for edge in graph[todo.pop()]:
            if edge.target not in seen:
                seen.add(edge.target)
                todo.append(edge.target)
    return seen


def cycles(graph: dict[str, list[Edge]]) -> list[set[str]]:
    """The import cycles: strongly connected components of more than one module, largest first.

    Two modules are in one component when each reaches the other (a few hundred modules: the
    quadratic way is fast enough and plain to read).
    """
    reach = {module: reachable(graph, module) for module in graph}
    components: list[set[str]] = []
    for module in sorted(graph):
        if module in reach[module] and not any(module in c for c in components):
            components.append({other for other in reach[module] if module in reach[other]})
    return sorted(components, key=lambda c: (-len(c), sorted(c)))


def edges_within(graph: dict[str, list[Edge]], component: set[str]) -> list[Edge]:
    """The edges between members of ``component``, imports inside functions first: a cycle
    whose module-level imports alone are acyclic is closed by those."""
    inside = [edge for module in sorted(component) for edge in graph[module] if edge.target in component]
    return sorted(inside, key=lambda e: (not e.in_function, e.source, e.line))


def describe_cycles(graph: dict[str, list[Edge]], components: list[set[str]]) -> str:
    """Each cycle's members, then its edges: one line per pair of modules, with the lines."""
    lines = []
    for component in components:
        lines.append(f"cycle of {len(component)} modules: {', '.join(sorted(map(short, component)))}")
        pairs: dict[tuple[str, str, str], list[str]] = {}
        for edge in edges_within(graph, component):
            pairs.setdefault((edge.source, edge.target, edge.where), []).append(f"{edge.path.name}:{edge.line}")
        for (source, target, where), places in pairs.items():
            lines.append(f"    {short(source)} -> {short(target)}  ({', '.join(places)}; {where})")
    return "\n".join(lines)


def in_prefixes(module: str, prefixes: tuple[str, ...]) -> bool:
    """Whether ``module`` is one of ``prefixes`` (short names, ``__init__`` for the root) or below one."""
    name = short(module)
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


def layer_violations(graph: dict[str, list[Edge]], layer: tuple[str, ...], allowed: tuple[str, ...]) -> list[Edge]:
    """The edges into ``layer`` from modules that are neither in it nor ``allowed`` to import it."""
    return [
        edge
        for module in sorted(graph)
        if not in_prefixes(module, layer) and not in_prefixes(module, allowed)
        for edge in graph[module]
        if in_prefixes(edge.target, layer)
    ]


if __name__ == "__main__":
    graph = import_graph()
    print(f"{package_dir()}:")
    print(describe_cycles(graph, cycles(graph)) or "no cycles")
