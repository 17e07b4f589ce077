"""Bounded parsing of the YAML and JSON files that come with data, checkpoints and configs.

A few hundred bytes can make a parser's output huge or deep: a YAML alias bomb (``a: &a [x, x]``,
``b: &b [*a, *a]``, ... doubles at every line: 665 bytes become 10^12 nodes when walked, as
printing, comparing or saving it in a state does) or 1,500 nested brackets (a bare
``RecursionError`` wherever the value is walked).  Every YAML and JSON file the package reads goes
through :func:`parse_yaml` or :func:`parse_json`, which refuse, with a :class:`ConfigError` naming
the file and the key path:

- nesting deeper than :data:`MAX_NESTING` levels;
- a YAML document whose aliases add more than :data:`MAX_ALIAS_NODES` nodes to it (anchors and
  aliases are fine for sharing a few settings; a document that refers to itself is refused).

Brace patterns (``shards/{000..999}.tar`` in ``split.yaml``) are bounded the same way:
:func:`expand_braces` counts a pattern's names before making any and refuses more than
:data:`MAX_BRACE_NAMES` (``s0.tar/k{0..1000000000000}`` was a bare ``MemoryError``).
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable

import yaml
from braceexpand import alphabet, braceexpand, char_range_re, int_range_re

from ..errors import ConfigError, EnergonLiteError, format_message

#: Deepest nesting of lists and mappings accepted in a YAML or JSON file (a loader state, the
#: deepest file we read, nests ~10 levels per blend level).
MAX_NESTING = 200
#: Most nodes the aliases of one YAML document may add to it, counted as often as they are used.
MAX_ALIAS_NODES = 100_000

#: Most names a brace pattern, or one key's list of patterns, may expand to.
MAX_BRACE_NAMES = 1_000_000
#: Deepest nesting of braces in a pattern.
_MAX_BRACE_NESTING = 32

#: libyaml's C parser where PyYAML was built with it (10-30x faster on a 10,000-shard split.yaml).
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse_json(text: str | bytes, where: str) -> Any:
    """``json.loads(text)``, refusing nesting past :data:`MAX_NESTING` (``where``: the file, for
    the error).  Syntax errors are raised as ``json.JSONDecodeError`` for the caller to word."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise _too_deep(where, "", None) from None
    # Fewer brackets than the limit cannot nest deeper (a 10,000-shard .info.json has two).
    brackets = text.count("[" if isinstance(text, str) else b"[") + text.count("{" if isinstance(text, str) else b"{")
    if brackets > MAX_NESTING:
        check_nesting(value, where)
    return value


def check_nesting(value: Any, where: str, error: type[EnergonLiteError] = ConfigError) -> None:
    """Raises the error of :func:`parse_json` (as ``error``: a checkpoint's is a
    :class:`StateError`) when ``value`` (plain JSON types, tuples too) nests deeper than
    :data:`MAX_NESTING`; walked without recursion."""
    stack: list[tuple[Any, int, str]] = [(value, 0, "")]
    while stack:
        item, depth, path = stack.pop()
        if depth > MAX_NESTING:
            raise _too_deep(where, path, depth, error)
        if isinstance(item, dict):
            stack.extend((v, depth + 1, f"{path}.{k}" if path else str(k)) for k, v in item.items() if isinstance(v, _CONTAINERS))
        elif isinstance(item, (list, tuple)):
            stack.extend((v, depth + 1, f"{path}[{i}]") for i, v in enumerate(item) if isinstance(v, _CONTAINERS))


def parse_yaml(text: str, where: str) -> Any:
    """The YAML document in ``text`` as Python values (YAML's safe types only), refusing deep
    nesting and alias-heavy documents (see the module's docstring).  Syntax errors are raised as
    ``yaml.YAMLError`` for the caller to word."""
    loader = _SAFE_LOADER(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:  # the pure-Python composer nests one call per level
            raise _too_deep(where, "", None) from None
        if node is None:
            return None
        _check_nodes(node, where)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _check_nodes(root: yaml.Node, where: str) -> None:
    """Walks the node graph once (each node once, aliases are shared nodes): depth, cycles and
    the count of nodes the document expands to; the error names the key path."""
    expanded: dict[int, int] = {}  # id(node) -> nodes it expands to, itself included
    on_path: set[int] = set()
    # (node, depth, key path, children visited?)
    stack: list[tuple[yaml.Node, int, str, bool]] = [(root, 0, "", False)]
    while stack:
        node, depth, path, visited = stack.pop()
        key = id(node)
        if visited:
            on_path.discard(key)
            expanded[key] = 1 + sum(expanded[id(child)] for child in _children(node))
            continue
        if key in expanded:
            continue
        if key in on_path:
            raise ConfigError(
                format_message(
                    "YAML anchor refers to itself",
                    where=f"{where}: {path or '<top level>'}",
                    expected="a tree of values (an alias may repeat an earlier value, not contain itself)",
                    found="an alias inside the value it names",
                    fix="remove the alias or repeat the value it names",
                )
            )
        if depth > MAX_NESTING:
            raise _too_deep(where, path, depth)
        on_path.add(key)
        stack.append((node, depth, path, True))
        for child, child_path in _labelled_children(node, path):
            stack.append((child, depth + 1, child_path, False))
    distinct = len(expanded)
    if expanded[id(root)] - distinct > MAX_ALIAS_NODES:
        path = _heaviest_path(root, expanded, distinct)
        raise ConfigError(
            format_message(
                "YAML aliases expand the document too far",
                where=f"{where}: {path or '<top level>'}",
                expected=f"aliases that add at most {MAX_ALIAS_NODES:,} values to the document",
                found=f"{distinct:,} values written, {expanded[id(root)]:,} once every alias is expanded",
                fix="write the values out, or use fewer levels of aliases of aliases",
            )
        )


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _labelled_children(node: yaml.Node, path: str) -> list[tuple[yaml.Node, str]]:
    """The child nodes with their key paths (a mapping's keys are labelled like its values)."""
    if isinstance(node, yaml.MappingNode):
        out = []
        for key_node, value_node in node.value:
            label = key_node.value if isinstance(key_node, yaml.ScalarNode) else "<key>"
            child_path = f"{path}.{label}" if path else str(label)
            out += [(key_node, child_path), (value_node, child_path)]
        return out
    if isinstance(node, yaml.SequenceNode):
        return [(child, f"{path}[{i}]") for i, child in enumerate(node.value)]
    return []


def _heaviest_path(root: yaml.Node, expanded: dict[int, int], distinct: int) -> str:
    """The key path down to the deepest value that alone expands past the limit."""
    node, path = root, ""
    while True:
        heavy = [(child, p) for child, p in _labelled_children(node, path) if expanded[id(child)] - distinct > MAX_ALIAS_NODES]
        if not heavy:
            return path
        node, path = heavy[0]


_CONTAINERS = (dict, list, tuple)


def _too_deep(where: str, path: str, depth: int | None, error: type[EnergonLiteError] = ConfigError) -> EnergonLiteError:
    if len(path) > 80:
        path = f"{path[:40]} ... {path[-30:]}"
    return error(
        format_message(
            "nesting too deep",
            where=f"{where}: {path or '<top level>'}",
            expected=f"at most {MAX_NESTING} levels of lists and mappings",
            found="deeper nesting" if depth is None else f"{depth} levels",
            fix="flatten the file; if it is generated (an index, a state), re-create it",
        )
    )


def expand_braces(patterns: Iterable[str], where: str, limit: int = MAX_BRACE_NAMES) -> Iterable[tuple[int, str]]:
    """``(entry, name)`` for every name the brace ``patterns`` expand to, in order (braceexpand's
    grammar: ``{a,b}``, ``{0..9}``, ``{a..e..2}``, nested, ``\\`` escapes).  Each pattern's names
    are counted before any is made: more than ``limit`` in all is a :class:`ConfigError` naming
    ``where``, as is an unbalanced pattern."""
    total = 0
    for entry, pattern in enumerate(patterns):
        if "{" not in pattern and "}" not in pattern:  # the common case, 10,000s of times per split
            total += 1
            yield entry, pattern
            continue
        try:
            total += brace_count(pattern)
        except (ValueError, RecursionError) as exc:
            raise _bad_pattern(where, entry, pattern, "balanced braces, e.g. shards/{000..009}.tar", str(exc)) from None
        if total > limit:
            raise _bad_pattern(
                where, entry, pattern, f"at most {limit:,} names from brace patterns", f"{total:,} names so far",
                "list fewer shards per pattern (split the range) or fix the range's bounds",
            )  # fmt: skip
        simple = _SIMPLE_RANGE.fullmatch(pattern)
        names = braceexpand(pattern) if simple is None else _simple_range(*simple.groups())
        for name in names:
            yield entry, name


#: ``prefix{A..B}suffix`` with plain numbers and no other braces or escapes: what prepare writes.
_SIMPLE_RANGE = re.compile(r"([^{}\\]*)\{(\d+)\.\.(\d+)\}([^{}\\]*)", re.S)


def _simple_range(prefix: str, start: str, end: str, suffix: str) -> Iterable[str]:
    """braceexpand's expansion of ``prefix{start..end}suffix`` (same zero padding: to the longer
    bound when either bound has a leading zero), without its per-name generators: 10,000 names
    in a few milliseconds instead of ~0.2 s, paid by every rank at start-up."""
    padding = max(len(start), len(end)) if any(b.startswith("0") and b != "0" for b in (start, end)) else 0
    first, last = int(start), int(end)
    numbers = range(first, last + 1) if first <= last else range(first, last - 1, -1)
    return [f"{prefix}{n:0{padding}d}{suffix}" for n in numbers]


def brace_count(pattern: str) -> int:
    """How many names ``braceexpand(pattern)`` gives, computed without making them (ValueError
    for unbalanced or too deeply nested braces, as braceexpand's own UnbalancedBracesError)."""
    depth = deepest = 0
    for char in pattern.replace("\\\\", "").replace("\\{", "").replace("\\}", ""):
        depth += (char == "{") - (char == "}")
        deepest = max(deepest, depth)
    if deepest > _MAX_BRACE_NESTING:
        raise ValueError(f"braces nested {deepest} deep (at most {_MAX_BRACE_NESTING})")
    return _count_pattern(pattern)


def _count_pattern(pattern: str) -> int:
    """braceexpand's ``parse_pattern``, counting: the product of its parts' counts."""
    count, start, pos, depth = 1, 0, 0, 0
    while pos < len(pattern):
        char = pattern[pos]
        if char == "\\":
            pos += 2
            continue
        if char == "{":
            if depth == 0 and pos > start:
                start = pos
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                expression = pattern[start + 1 : pos]
                found = _count_expression(expression)
                count *= _count_pattern(expression) if found is None else found
                start = pos + 1
        pos += 1
    if depth != 0:
        raise ValueError(f"unbalanced braces: {pattern!r}")
    return count


def _count_expression(expression: str) -> int | None:
    """braceexpand's ``parse_expression``, counting; None when it is no range or sequence."""
    match = int_range_re.match(expression)
    if match:
        first, last, step = int(match[1]), int(match[2]), int(match[3] or 1) or 1
        return abs(last - first) // step + 1
    match = char_range_re.match(expression)
    if match:
        first, last, step = alphabet.index(match[1]), alphabet.index(match[2]), int(match[3] or 1) or 1
        return abs(last - first) // step + 1
    return _count_sequence(expression)


def _count_sequence(sequence: str) -> int | None:
    """braceexpand's ``parse_sequence``, counting: the sum over the comma-separated items."""
    items, start, pos, depth = [], 0, 0, 0
    while pos < len(sequence):
        char = sequence[pos]
        if char == "\\":
            pos += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
        elif char == "," and depth == 0:
            items.append(sequence[start:pos])
            start = pos + 1
        pos += 1
    if depth != 0 or not items:
        return None
    items.append(sequence[start:])
    return sum(map(_count_pattern, items))


def _bad_pattern(where: str, entry: int, pattern: str, expected: str, found: str, fix: str | None = None) -> ConfigError:
    return ConfigError(format_message("invalid brace pattern", where=f"{where}[{entry}]", expected=expected, found=f"{pattern[:200]!r}: {found}", fix=fix))
