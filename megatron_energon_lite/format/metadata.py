"""The ``.nv-meta/`` files: ``.info.json`` (or legacy ``.info.yaml``) and ``split.yaml``.

Both are parsed strictly, like Energon: an unknown key is an error (Energon itself refuses extra
keys in these files, so we never write any).  Errors name the file and the key path.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Any, Collection, Iterable, Mapping, NamedTuple

import yaml

from .._version import __version__
from ..errors import ConfigError, DatasetError, EmptyDatasetError, format_message
from ..policy import PLAIN, Policy
from ..storage import (
    AnyPath,
    FileStat,
    RemotePath,
    as_path,
    atomic_write_text,
    list_files,
)
from .safe_parse import expand_braces, parse_json, parse_yaml

logger = logging.getLogger(__name__)

META_DIR = ".nv-meta"
INFO_JSON = ".info.json"
INFO_YAML = ".info.yaml"
SPLIT_YAML = "split.yaml"
SPLIT_JSON = "split.json"
DATASET_YAML = "dataset.yaml"
INDEX_SQLITE = "index.sqlite"
INDEX_UUID = "index.uuid"
#: Set to 1 to read shards that .info.json / split.yaml name outside the dataset folder.
SHARDS_OUTSIDE_ROOT_ENV = "ENERGON_LITE_ALLOW_SHARDS_OUTSIDE_ROOT"

WRITER_VERSION = f"megatron-energon-lite {__version__}"


def load_structured(path: Path) -> Any:
    """Reads a YAML or JSON file; a syntax error becomes a :class:`ConfigError` with the line."""
    return parse_structured(path, read_text(path))


def read_text(path: Path) -> str:
    """The text of a metadata file; a missing or non-UTF-8 file is a :class:`ConfigError`."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(format_message("file not found", where=str(path))) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            format_message(
                "file is not valid UTF-8 text",
                where=f"{path}, byte {exc.start}",
                expected="a UTF-8 encoded YAML or JSON file",
                found=f"byte {exc.object[exc.start : exc.start + 1]!r} ({exc.reason})",
                fix="re-save the file as UTF-8, or re-create it (for .nv-meta files: run `energon-lite prepare` again)",
            )
        ) from None


def parse_structured(path: Path, text: str) -> Any:
    """Parses ``text`` (read from ``path``) as JSON or YAML by the file's suffix, bounded
    (:mod:`.safe_parse`: nesting depth, alias expansion)."""
    try:
        if path.suffix == ".json":
            return parse_json(text, str(path))
        return parse_yaml(text, str(path))
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(
            format_message(
                "cannot parse file",
                where=_error_position(path, text, exc),
                found=_parse_problem(exc),
                fix="fix the syntax at the position shown",
            )
        ) from None


def _parse_problem(exc: Exception) -> str:
    """The parser's words without PyYAML's ``in "<unicode string>"`` (the text was parsed from a
    string; ``where`` names the file): ``while parsing X (line 6, column 7): did not find Y
    (line 8, column 8)``."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return str(exc).replace("\n", " ")
    parts = []
    for words, mark in ((exc.context, exc.context_mark), (exc.problem, exc.problem_mark)):
        if words:
            parts.append(f"{words} (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else words)
    return ": ".join(parts) or type(exc).__name__


def _error_position(path: Path, text: str, exc: Exception) -> str:
    """``path, line N: <that line>`` for a parse error (a split file may have 10,000s of lines)."""
    if isinstance(exc, json.JSONDecodeError):
        line = exc.lineno
    else:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        if mark is None:
            return str(path)
        line = mark.line + 1
    # libyaml reports some errors at the token after the bad one: show the line before too.
    lines = text.splitlines()
    shown = [f"line {n}: {lines[n - 1].strip()[:120]!r}" for n in (line - 1, line) if 0 < n <= len(lines)]
    return f"{path}, " + "; ".join(shown) if shown else str(path)


def check_mapping(
    value: Any,
    *,
    file: Path | str,
    key_path: str,
    allowed: Iterable[str] | None,
    required: Iterable[str] = (),
) -> Mapping[str, Any]:
    """Checks that ``value`` is a mapping with only ``allowed`` keys (any keys: None) and all
    ``required`` ones."""
    where = f"{file}: {key_path or '<top level>'}"
    if not isinstance(value, Mapping):
        raise ConfigError(
            format_message(
                "expected a mapping",
                where=where,
                expected="a mapping of keys to values",
                found=f"{type(value).__name__} {value!r:.80}",
            )
        )
    allowed = None if allowed is None else list(allowed)
    allowed_set = set(allowed or ())
    unknown = [] if allowed is None else [k for k in value if k not in allowed_set]
    if unknown:
        raise ConfigError(
            format_message(
                f"unknown key {unknown[0]!r}",
                where=f"{file}: {key_path + '.' if key_path else ''}{unknown[0]}",
                expected=f"one of {', '.join(allowed or ())}",
                found=", ".join(map(repr, unknown)),
                fix="remove or rename the key",
            )
        )
    missing = [k for k in required if k not in value]
    if missing:
        raise ConfigError(
            format_message(
                f"missing key {missing[0]!r}",
                where=where,
                expected=f"keys {', '.join(required)}",
                found=f"keys {', '.join(map(str, value)) or 'none'}",
            )
        )
    return value


def index_name(tar_name: str) -> str:
    """``shards/a.tar`` -> ``shards/a.tar.idx`` for names relative to a dataset root."""
    # A string operation (called per shard at start-up): the last suffix becomes ".tar.idx".
    head, slash, base = tar_name.rpartition("/")
    stem, dot, suffix = base.rpartition(".")
    if not (dot and stem and suffix):  # no suffix (".tar", "b."): append, as pathlib does
        stem = base
    return f"{head}{slash}{stem}.tar.idx"


def meta_dir(root: str | os.PathLike) -> AnyPath:
    return as_path(root) / META_DIR


def is_prepared(root: str | os.PathLike) -> bool:
    meta = meta_dir(root)
    return (meta / INFO_JSON).is_file() or (meta / INFO_YAML).is_file()


def require_prepared(root: str | os.PathLike) -> None:
    if not is_prepared(root):
        found = "no folder" if not as_path(root).exists() else f"no {META_DIR}/{INFO_JSON}"
        raise DatasetError(
            format_message(
                "not a prepared dataset",
                where=str(root),
                expected=f"a folder with {META_DIR}/{INFO_JSON} (or {INFO_YAML})",
                found=found,
                fix=f"run `energon-lite prepare {root}` first",
            )
        )


def check_shard_name(name: Any, *, where: str, allow_outside_root: bool = False, policy: Policy = PLAIN) -> str:
    """Returns ``name`` if it is a shard path relative to the dataset folder and inside it.

    ``.info.json`` and ``split.yaml`` come with the data: a name that is absolute, climbs out
    with ``..`` or is a URL would make the loader read files outside the dataset, so it is
    refused unless the caller opts in with ``allow_outside_root``, the environment variable
    :data:`SHARDS_OUTSIDE_ROOT_ENV`, or ``policy`` is Energon's (Energon reads such paths; logged once).
    """
    if not isinstance(name, str):
        raise ConfigError(
            format_message(
                "shard path is not a string",
                where=where,
                expected="a path relative to the dataset folder, e.g. shards/000000.tar",
                found=f"{type(name).__name__} {name!r:.80}",
                fix="quote the shard path, or run `energon-lite prepare` again",
            )
        )
    if allow_outside_root:
        return name
    outside = (
        not name
        or "\0" in name
        or name.startswith("/")
        or "://" in name
        or (".." in name and ".." in name.split("/"))
    )
    problem = None if outside else unreadable_shard_name(name)
    if problem is not None:
        raise ConfigError(
            format_message(
                "shard name cannot be read from split.yaml",
                where=where,
                expected="a UTF-8 name without '{' or '}'",
                found=f"{name!r}: {problem}",
                fix="rename the shard file and run `energon-lite prepare` again",
            )
        )
    if outside and policy.opted_in(SHARDS_OUTSIDE_ROOT_ENV, f"outside-root:{where}", f"reading shard {name!r} from outside the dataset folder ({where})"):
        return name
    if outside:
        raise ConfigError(
            format_message(
                "shard path points outside the dataset folder",
                where=where,
                expected="a path relative to the dataset folder, without '..', e.g. shards/000000.tar",
                found=repr(name),
                fix="list shards by their path inside the dataset folder (re-run `energon-lite "
                "prepare` to rewrite the file); to blend data from elsewhere, use a metadataset; "
                f"if the dataset is yours and meant to do this, set {SHARDS_OUTSIDE_ROOT_ENV}=1",
            )
        )
    return name


def unreadable_shard_name(name: str) -> str | None:
    """Why the loader cannot read a shard of this name through ``split.yaml`` (None when it
    can): the rule both ``prepare`` (for the tar files it finds) and the loader (for the names
    in ``.info.json`` and ``split.yaml``) apply."""
    if "{" in name or "}" in name:
        return "split.yaml reads '{' and '}' as a brace pattern ({0..9}, {a,b})"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "it is not valid UTF-8 (split.yaml and .info.json are UTF-8 text)"
    return None


def plain_shard_names(names: Collection[Any]) -> bool:
    """True when every name is a non-empty string that :func:`check_shard_name` accepts as is
    (no NUL, no leading ``/``, no ``://``, no ``..``, no brace, valid UTF-8): one scan of the
    joined names."""
    try:
        joined = "\n" + "\n".join(names) + "\n"
    except TypeError:
        return False
    if joined == "\n\n":
        return not names  # no names at all, or one empty one
    return not any(bad in joined for bad in ("\n\n", "\0", "\n/", "://", "..", "{", "}")) and unreadable_shard_name(joined) is None


@dataclass
class DatasetInfo:
    """``.info.json``: per-shard sample counts, in shard order (the order defines shard ids)."""

    shard_counts: dict[str, int]
    energon_version: str | None = WRITER_VERSION

    @property
    def total_samples(self) -> int:
        return sum(self.shard_counts.values())


def info_path(root: str | os.PathLike) -> AnyPath:
    """``.nv-meta/.info.json``, or the legacy ``.info.yaml`` when there is no JSON one."""
    meta = meta_dir(root)
    return meta / INFO_JSON if (meta / INFO_JSON).is_file() else meta / INFO_YAML


def read_info(root: str | os.PathLike, *, allow_outside_root: bool = False, policy: Policy = PLAIN) -> DatasetInfo:
    """Reads ``.info.json``; shard paths outside the dataset folder are refused (see
    :func:`check_shard_name`)."""
    require_prepared(root)
    path = info_path(root)
    return parse_info(path, read_text(path), allow_outside_root=allow_outside_root, policy=policy)


def parse_info(path: Path, text: str, *, allow_outside_root: bool = False, policy: Policy = PLAIN) -> DatasetInfo:
    """The ``.info.json`` (or ``.info.yaml``) ``path`` whose text is ``text``, checked as
    :func:`read_info` checks it."""
    raw = check_mapping(
        parse_structured(path, text),
        file=path,
        key_path="",
        allowed=("energon_version", "shard_counts"),
        required=("shard_counts",),
    )
    counts = raw["shard_counts"]
    check_mapping(counts, file=path, key_path="shard_counts", allowed=None)
    # Checked in bulk first (a dataset may list 10,000s of shards); one by one for the error.
    values = list(counts.values())
    all_fine = plain_shard_names(counts) and set(map(type, values)) <= {int} and (not values or min(values) >= 0)
    for shard, count in () if all_fine else counts.items():
        check_shard_name(shard, where=f"{path}: shard_counts", allow_outside_root=allow_outside_root, policy=policy)
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ConfigError(
                format_message(
                    "invalid sample count",
                    where=f"{path}: shard_counts.{shard}",
                    expected="a non-negative integer",
                    found=repr(count),
                    fix="run `energon-lite prepare` again",
                )
            )
    version = raw.get("energon_version")
    return DatasetInfo(shard_counts=dict(counts), energon_version=None if version is None else str(version))


def write_info(root: str | os.PathLike, info: DatasetInfo) -> None:
    """Writes ``.info.json`` exactly as Energon does (indent 2, no trailing newline)."""
    data = {"energon_version": info.energon_version, "shard_counts": info.shard_counts}
    atomic_write_text(meta_dir(root) / INFO_JSON, json.dumps(data, indent=2))


@dataclass
class SplitConfig:
    """``split.yaml``: split name -> shard patterns, plus shard and ``shard/key`` excludes."""

    split_parts: dict[str, list[str]]
    exclude: list[str] = field(default_factory=list)
    path: Path | None = None

    def expanded_split(self, split_part: str, known: Mapping[str, int] | None = None) -> list[str]:
        """The shards of ``split_part`` in order, brace patterns expanded.

        A shard named twice is an error; so is one not in ``known`` (the shard counts of
        ``.info.json``), checked while expanding so that a huge brace range fails at once.
        """
        if split_part not in self.split_parts:
            raise ConfigError(
                format_message(
                    f"split {split_part!r} does not exist",
                    where=str(self.path),
                    expected=f"one of {', '.join(self.split_parts) or '(no splits)'}",
                    found=split_part,
                    fix="pass another split_part, or re-run prepare with --split-parts",
                )
            )
        key_path = f"split_parts.{split_part}"
        patterns = self.split_parts[split_part]
        if known is not None and _plain_distinct_known(patterns, known):
            return list(patterns)  # the usual split (the loop below finds and names the error otherwise)
        if known is None:  # from the start-up summary: brace ranges, expanded in bulk
            expanded = [name for _, name in expand_braces(patterns, f"{self.path}: {key_path}")]
            if len(set(expanded)) == len(expanded):
                return expanded
        names: dict[str, int] = {}  # shard -> the entry that named it first
        for entry, name in expand_braces(patterns, f"{self.path}: {key_path}"):
            if name in names:
                first = names[name]
                again = "the same entry" if first == entry else f"[{entry}] {patterns[entry]!r}"
                raise ConfigError(
                    format_message(
                        f"split {split_part!r} names shard {name!r} twice",
                        where=f"{self.path}: {key_path}",
                        expected="each shard at most once per split (its samples would be read twice)",
                        found=f"{name!r} from [{first}] {patterns[first]!r} and again from {again}",
                        fix="remove the repeated entry or narrow the brace pattern",
                    )
                )
            names[name] = entry
            if known is not None and name not in known:
                raise DatasetError(
                    format_message(
                        f"split {split_part!r} names a shard that is not in the index",
                        where=f"{self.path}: {key_path}",
                        expected=f"one of the {len(known)} shards listed in {META_DIR}/{INFO_JSON}",
                        found=name,
                        fix="fix split.yaml, or run `energon-lite prepare` again to index the shard",
                    )
                )
        return list(names)

    def expanded_excludes(self) -> list[str]:
        return [name for _, name in expand_braces(self.exclude, f"{self.path}: exclude")]


def _plain_distinct_known(patterns: list[str], known: Mapping[str, int]) -> bool:
    """True when ``patterns`` are plain shard names (no braces), each named once and indexed."""
    joined = "\n".join(patterns)
    distinct = set(patterns)
    return "{" not in joined and "}" not in joined and len(distinct) == len(patterns) and distinct <= known.keys()


def resolve_split_config_path(root: str | os.PathLike, name: str | None = None) -> AnyPath:
    meta = meta_dir(root)
    if name is not None:
        return meta / name
    if (meta / SPLIT_YAML).is_file() or not (meta / SPLIT_JSON).is_file():
        return meta / SPLIT_YAML
    return meta / SPLIT_JSON


def read_split_config(root: str | os.PathLike, name: str | None = None) -> SplitConfig:
    path = resolve_split_config_path(root, name)
    return parse_split_config(path, read_text(path))


def parse_split_config(path: Path, text: str) -> SplitConfig:
    """The split file ``path`` whose text is ``text``."""
    parsed = _plain_split_yaml(text) if path.suffix != ".json" else None
    raw = check_mapping(
        parse_structured(path, text) if parsed is None else parsed,
        file=path,
        key_path="",
        allowed=("split_parts", "exclude"),
        required=("split_parts",),
    )
    parts = raw["split_parts"]
    check_mapping(parts, file=path, key_path="split_parts", allowed=None)
    split_parts: dict[str, list[str]] = {}
    for name_, patterns in parts.items():
        split_parts[str(name_)] = _string_list(patterns, path, f"split_parts.{name_}")
    exclude = _string_list(raw.get("exclude") or [], path, "exclude")
    return SplitConfig(split_parts=split_parts, exclude=exclude, path=path)


_PLAIN_KEY = re.compile(r"( *)([A-Za-z_][A-Za-z0-9_-]*):( \[\])?")
_PLAIN_VALUE = r"[A-Za-z0-9_][A-Za-z0-9_./{}-]*"
_PLAIN_ITEM = re.compile(rf"( *)- {_PLAIN_VALUE}")
#: First characters of plain scalars that YAML may read as something other than a string.
_TYPED_FIRST = frozenset(c for c in yaml.SafeLoader.yaml_implicit_resolvers if c)
#: A line (after a newline) that starts with one of those characters.
_TYPED_LINE_START = re.compile(rf"\n[{re.escape(''.join(sorted(_TYPED_FIRST)))}]")


@functools.lru_cache(maxsize=16)
def _item_run(indent: int) -> re.Pattern[str]:
    """Consecutive item lines at ``indent``: one C-level match for a whole list."""
    return re.compile(rf"(?: {{{indent}}}- {_PLAIN_VALUE}(?:\n|\Z))+")


def _plain_split_yaml(text: str) -> dict[str, Any] | None:
    """Parses the plain ``split.yaml`` that prepare writes, or returns None for anything else.

    Even libyaml's C parser builds a Python node per entry (~35 ms for 10,000 shards, paid by
    every rank); this reads the one shape ``split_config_text`` writes (and Energon's prepare, and
    most hand edits): ``split_parts:`` with named block lists of plain scalars, and ``exclude:``.
    A line outside that shape, a repeated key, or a scalar YAML would read as something other than
    a string (``yes``, ``1e3``, ``null``) returns None and the caller parses with YAML, so the
    result is always what YAML gives (tests/format/test_split_fast_path.py checks that).
    """
    if "\r" in text:
        return None
    result: dict[str, Any] = {}
    parts: dict[str, list[str] | None] | None = None
    owner: dict[str, Any] | None = None  # the mapping whose ``owner_key`` item lines fill
    owner_key = ""
    owner_indent = 0
    item_indent: int | None = None
    split_indent: int | None = None
    pos, size = 0, len(text)
    while pos < size:
        end = text.find("\n", pos)
        end = size if end == -1 else end
        line = text[pos:end]
        match = _PLAIN_ITEM.fullmatch(line)
        if match is not None:
            indent = len(match[1])
            if owner is None or item_indent is not None or indent < owner_indent:
                return None  # no list here, or a second run of items at another indent
            run = _item_run(indent).match(text, pos)
            prefix = " " * indent + "- "
            # Every line of the run starts with ``prefix``: drop it from each, then split.
            values = text[pos + len(prefix) : run.end()].replace("\n" + prefix, "\n").split("\n")
            if not values[-1]:
                values.pop()  # the run ended with a newline
            if _TYPED_LINE_START.search("\n" + "\n".join(values)) and any(map(_implicitly_typed, values)):
                return None
            owner[owner_key] = values
            item_indent = indent
            pos = run.end()
            continue
        pos = end + 1
        match = _PLAIN_KEY.fullmatch(line)
        if match is None:
            return None
        indent, key, empty = len(match[1]), match[2], match[3] is not None
        # ``key:`` alone is null to YAML until an item line makes it a list; ``key: []`` is empty.
        if indent == 0:
            if key in result or key not in ("split_parts", "exclude") or (key == "split_parts" and empty):
                return None
            split_indent = None
            if key == "split_parts":
                parts = result[key] = {}
                owner = None
            else:
                parts = None
                result[key] = [] if empty else None
                owner = None if empty else result
        else:
            if parts is None or key in parts or _implicitly_typed(key):
                return None
            if split_indent is None:
                split_indent = indent
            elif indent != split_indent:
                return None
            parts[key] = [] if empty else None
            owner = None if empty else parts
        owner_key, owner_indent, item_indent = key, indent, None
    if not result.get("split_parts"):
        return None  # no splits: YAML's reading gives the error message
    return result


def _implicitly_typed(value: str) -> bool:
    """True when YAML would read the plain scalar ``value`` as a bool, number, null or date."""
    resolvers = yaml.SafeLoader.yaml_implicit_resolvers.get(value[0])
    return resolvers is not None and any(regexp.match(value) for _tag, regexp in resolvers)


def _string_list(value: Any, path: Path, key_path: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not (set(map(type, value)) <= {str} or all(isinstance(v, str) for v in value)):
        raise ConfigError(
            format_message(
                "expected a list of shard paths",
                where=f"{path}: {key_path}",
                expected="a YAML list of strings",
                found=repr(value)[:120],
            )
        )
    return list(value)


#: libyaml's emitter where PyYAML has it: ~15x faster on a 10,000-shard split.yaml, same text.
_SAFE_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def split_config_text(config: SplitConfig) -> str:
    """The text of ``split.yaml`` for ``config``: exactly what ``yaml.safe_dump`` writes.

    libyaml emits the same text as PyYAML's pure-Python emitter for the strings a split holds
    (tests/format/test_prepare_many_shards.py checks it); a string it cannot encode (a shard name
    with an undecodable byte, kept as a lone surrogate) falls back to the pure-Python emitter.
    """
    data = {"split_parts": config.split_parts, "exclude": config.exclude}
    options = dict(sort_keys=False, default_flow_style=False)
    if _SAFE_DUMPER is not yaml.SafeDumper:
        try:
            return yaml.dump(data, Dumper=_SAFE_DUMPER, **options)
        except (UnicodeError, yaml.YAMLError):
            pass
    return yaml.dump(data, Dumper=yaml.SafeDumper, **options)


_LAST_NUMBER = re.compile(r"^(.*?)(\d+)(\D*)$", re.S)


def collapse_shard_names(names: list[str]) -> list[str]:
    """``names`` with each run of consecutive numbers written as a brace range, Energon's
    spelling (``shards/{000000..009999}.tar``): what ``prepare`` writes to ``split.yaml``, so that
    a rank reads a few hundred bytes instead of every name.  A run shares the text around its
    last number, and the number's width; the order is kept.  A range is written only where
    expanding it gives its names exactly (a name with ``\\`` or ``,`` stays as it is).
    """
    out: list[str] = []
    run: list[str] = []  # consecutive names of one range
    key: tuple[str, str, int] | None = None  # the run's prefix, suffix and number width
    last = -1

    def close() -> None:
        if len(run) > 1:
            prefix, suffix, width = key
            pattern = f"{prefix}{{{run[0][len(prefix):len(prefix) + width]}..{run[-1][len(prefix):len(prefix) + width]}}}{suffix}"
            try:
                if [name for _, name in expand_braces([pattern], "split.yaml")] == run:
                    out.append(pattern)
                    return
            except ConfigError:
                pass
        out.extend(run)

    for name in names:
        match = _LAST_NUMBER.match(name)
        parts = None if match is None else (match[1], match[3], len(match[2]))
        number = -2 if match is None else int(match[2])
        if parts is None or parts != key or number != last + 1:
            close()
            run, key = [], parts
        run.append(name)
        last = number
    close()
    return out


def write_split_config(root: str | os.PathLike, config: SplitConfig, name: str = SPLIT_YAML) -> None:
    atomic_write_text(meta_dir(root) / name, split_config_text(config))


class ShardSpec(NamedTuple):
    """One shard of a split: its path relative to the dataset and its sample count (a tuple:
    a split may hold 10,000s, made on every rank's start)."""

    name: str
    count: int


@dataclass
class ResolvedSplit:
    """A split's shards in read order and the sample keys excluded inside them.

    Names and counts are two lists (every rank of a job makes this for 10,000s of shards; the
    :class:`ShardSpec` pairs are made only when asked for)."""

    root: AnyPath
    split_part: str
    names: list[str]  # shard paths relative to root, in read order
    counts: list[int]  # their sample counts
    excluded_keys: dict[str, frozenset[str]]  # shard name -> keys skipped when read
    stats: dict[str, FileStat] = field(default_factory=dict)  # shard and index name -> size and version

    @functools.cached_property
    def shards(self) -> list[ShardSpec]:
        return list(map(ShardSpec, self.names, self.counts))

    @functools.cached_property
    def shard_starts(self) -> tuple[int, ...]:
        """Split index of the first sample of each shard, then the total."""
        return tuple(accumulate(self.counts, initial=0))

    @property
    def total_samples(self) -> int:
        return self.shard_starts[-1]


def resolve_split(
    root: str | os.PathLike,
    split_part: str,
    *,
    split_config: str | None = None,
    info: DatasetInfo | None = None,
    allow_empty: bool = False,
    allow_outside_root: bool = False,
    policy: Policy = PLAIN,
) -> ResolvedSplit:
    """Lists the shards of ``split_part`` in order, with shard excludes applied.

    Sample excludes (``shard/key``) do not change counts: the sample is skipped when read, as in
    Energon, so sharding is the same with and without them.  A shard named twice, or one outside
    the dataset folder (unless ``allow_outside_root``), is an error.
    """
    root = as_path(root)
    info = info or read_info(root, allow_outside_root=allow_outside_root, policy=policy)
    config = read_split_config(root, split_config)
    resolved, unknown_excludes = resolve_unchecked(root, split_part, info, config)
    # Remotely, shards and their indexes come in one listing per folder (the reader reuses the
    # stats).  Locally nothing is looked at here: a shard is stat'ed when it is first read, so a
    # rank of a large job touches only its own shards (10,000 stats on a parallel filesystem,
    # per rank, would cost more than the whole build).
    if isinstance(root, RemotePath):
        names = resolved.names
        resolved.stats = list_files(root, [n for name in names for n in (name, index_name(name))])
        for name in names:
            if name not in resolved.stats:
                raise missing_shard_error(root / name)
    return checked_split(resolved, unknown_excludes, config.path, allow_empty=allow_empty)


def resolve_unchecked(root: AnyPath, split_part: str, info: DatasetInfo, config: SplitConfig) -> tuple[ResolvedSplit, list[str]]:
    """``split_part`` of ``config`` with ``info``'s counts, and the exclude entries that name no
    shard of the dataset (nothing logged, emptiness not checked, nothing listed)."""
    known = info.shard_counts  # its names were checked by read_info; split.yaml's must be among them
    shard_names = config.expanded_split(split_part, known)
    excluded_shards: set[str] = set()
    excluded_keys: dict[str, set[str]] = {}
    unknown: list[str] = []
    for entry in config.expanded_excludes():
        if entry in known:
            excluded_shards.add(entry)
            continue
        shard = shard_prefix(entry, known)
        if shard is None:
            unknown.append(entry)
            continue
        excluded_keys.setdefault(shard, set()).add(entry[len(shard) + 1 :])
    names = [name for name in shard_names if name not in excluded_shards] if excluded_shards else shard_names
    resolved = ResolvedSplit(
        root=root,
        split_part=split_part,
        names=names,
        counts=list(map(known.__getitem__, names)),
        excluded_keys={k: frozenset(v) for k, v in excluded_keys.items()},
    )
    return resolved, unknown


def checked_split(resolved: ResolvedSplit, unknown_excludes: list[str], split_path: AnyPath | None, *, allow_empty: bool) -> ResolvedSplit:
    """``resolved`` once its exclude entries that name no shard are logged; an empty split is an
    :class:`EmptyDatasetError` unless ``allow_empty``."""
    for entry in unknown_excludes:
        logger.warning("%s: exclude entry %r names no shard of this dataset; it has no effect", split_path, entry)
    if not allow_empty and resolved.total_samples == 0:
        raise EmptyDatasetError(
            format_message(
                f"split {resolved.split_part!r} has no samples",
                where=str(split_path),
                fix="choose another split or re-run prepare with a split ratio that gives it shards",
            )
        )
    return resolved


def missing_shard_error(path: AnyPath) -> DatasetError:
    return DatasetError(
        format_message(
            "shard listed in the dataset's index is missing on disk",
            where=str(path),
            fix="restore the shard, or run `energon-lite prepare --force-overwrite` "
            "to re-index the dataset without it",
        )
    )


def shard_prefix(entry: str, shards: Collection[str]) -> str | None:
    """For ``"a/b.tar/key"`` returns ``"a/b.tar"`` when that is a shard (keys may hold ``/``)."""
    pos = entry.find("/")
    while pos != -1:
        if entry[:pos] in shards:
            return entry[:pos]
        pos = entry.find("/", pos + 1)
    return None
