"""The ``.nv-meta/`` files: ``.info.json`` (or legacy ``.info.yaml``) and ``split.yaml``.

Both are parsed strictly, like Energon: an unknown key is an error (Energon itself refuses extra
keys in these files, so we never write any).  Errors name the file and the key path.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml
from braceexpand import braceexpand

from .. import energon_mode
from .._version import __version__
from ..errors import ConfigError, DatasetError, EmptyDatasetError, format_message
from ..storage import (
    AnyPath,
    FileStat,
    RemotePath,
    as_path,
    atomic_write_text,
    list_files,
)
from .tar_index import index_name

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


#: libyaml's C parser where PyYAML was built with it (10-30x faster on a 10,000-shard split.yaml).
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_structured(path: Path) -> Any:
    """Reads a YAML or JSON file; a syntax error becomes a :class:`ConfigError` with the line."""
    try:
        text = path.read_text(encoding="utf-8")
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
    try:
        if path.suffix == ".json":
            return json.loads(text)
        return yaml.load(text, Loader=_SAFE_LOADER)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(
            format_message(
                "cannot parse file",
                where=_error_position(path, text, exc),
                found=str(exc).replace("\n", " "),
                fix="fix the syntax at the position shown",
            )
        ) from None


def _error_position(path: Path, text: str, exc: Exception) -> str:
    """``path, line N: <that line>`` for a parse error (a split file may have 10,000s of lines)."""
    if isinstance(exc, json.JSONDecodeError):
        line = exc.lineno
    else:
        mark = getattr(exc, "context_mark", None) or getattr(exc, "problem_mark", None)
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
    allowed: Iterable[str],
    required: Iterable[str] = (),
) -> Mapping[str, Any]:
    """Checks that ``value`` is a mapping with only ``allowed`` keys and all ``required`` ones."""
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
    allowed = list(allowed)
    allowed_set = set(allowed)  # a shard_counts mapping has tens of thousands of keys
    unknown = [k for k in value if k not in allowed_set]
    if unknown:
        raise ConfigError(
            format_message(
                f"unknown key {unknown[0]!r}",
                where=f"{file}: {key_path + '.' if key_path else ''}{unknown[0]}",
                expected=f"one of {', '.join(allowed)}",
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


def check_shard_name(name: Any, *, where: str, allow_outside_root: bool = False) -> str:
    """Returns ``name`` if it is a shard path relative to the dataset folder and inside it.

    ``.info.json`` and ``split.yaml`` come with the data: a name that is absolute, climbs out
    with ``..`` or is a URL would make the loader read files outside the dataset, so it is
    refused unless the caller opts in with ``allow_outside_root``, the environment variable
    :data:`SHARDS_OUTSIDE_ROOT_ENV`, or ``as_energon`` (Energon reads such paths; logged once).
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
    if outside and energon_mode.opted_in(SHARDS_OUTSIDE_ROOT_ENV, f"outside-root:{where}", f"reading shard {name!r} from outside the dataset folder ({where})"):
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


@dataclass
class DatasetInfo:
    """``.info.json``: per-shard sample counts, in shard order (the order defines shard ids)."""

    shard_counts: dict[str, int]
    energon_version: str | None = WRITER_VERSION

    @property
    def total_samples(self) -> int:
        return sum(self.shard_counts.values())


def read_info(root: str | os.PathLike, *, allow_outside_root: bool = False) -> DatasetInfo:
    """Reads ``.info.json``; shard paths outside the dataset folder are refused (see
    :func:`check_shard_name`)."""
    require_prepared(root)
    meta = meta_dir(root)
    path = meta / INFO_JSON if (meta / INFO_JSON).is_file() else meta / INFO_YAML
    raw = check_mapping(
        load_structured(path),
        file=path,
        key_path="",
        allowed=("energon_version", "shard_counts"),
        required=("shard_counts",),
    )
    counts = raw["shard_counts"]
    check_mapping(counts, file=path, key_path="shard_counts", allowed=list(counts))
    for shard, count in counts.items():
        check_shard_name(shard, where=f"{path}: shard_counts", allow_outside_root=allow_outside_root)
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
        names: dict[str, int] = {}  # shard -> the entry that named it first
        for entry, pattern in enumerate(patterns):
            for name in _expand(pattern, self.path, f"{key_path}[{entry}]"):
                if name in names:
                    first = names[name]
                    again = "the same entry" if first == entry else f"[{entry}] {pattern!r}"
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
        return [s for pattern in self.exclude for s in _expand(pattern, self.path, "exclude")]


def _expand(pattern: str, path: Path | None, key_path: str) -> Iterable[str]:
    if "{" not in pattern and "}" not in pattern:  # the common case, 10,000s of times per split
        yield pattern
        return
    try:
        yield from braceexpand(pattern)
    except ValueError as exc:  # unbalanced braces
        raise ConfigError(
            format_message(
                "invalid brace pattern",
                where=f"{path}: {key_path}",
                expected="balanced braces, e.g. shards/{000..009}.tar",
                found=f"{pattern!r} ({exc})",
            )
        ) from None


def resolve_split_config_path(root: str | os.PathLike, name: str | None = None) -> AnyPath:
    meta = meta_dir(root)
    if name is not None:
        return meta / name
    if (meta / SPLIT_YAML).is_file() or not (meta / SPLIT_JSON).is_file():
        return meta / SPLIT_YAML
    return meta / SPLIT_JSON


def read_split_config(root: str | os.PathLike, name: str | None = None) -> SplitConfig:
    path = resolve_split_config_path(root, name)
    raw = check_mapping(
        load_structured(path),
        file=path,
        key_path="",
        allowed=("split_parts", "exclude"),
        required=("split_parts",),
    )
    parts = raw["split_parts"]
    check_mapping(parts, file=path, key_path="split_parts", allowed=list(parts))
    split_parts: dict[str, list[str]] = {}
    for name_, patterns in parts.items():
        split_parts[str(name_)] = _string_list(patterns, path, f"split_parts.{name_}")
    exclude = _string_list(raw.get("exclude") or [], path, "exclude")
    return SplitConfig(split_parts=split_parts, exclude=exclude, path=path)


def _string_list(value: Any, path: Path, key_path: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
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


def write_split_config(root: str | os.PathLike, config: SplitConfig, name: str = SPLIT_YAML) -> None:
    atomic_write_text(meta_dir(root) / name, split_config_text(config))


@dataclass(frozen=True)
class ShardSpec:
    """One shard of a split: its path relative to the dataset and its sample count."""

    name: str
    count: int


@dataclass
class ResolvedSplit:
    """A split's shards in read order and the sample keys excluded inside them."""

    root: AnyPath
    split_part: str
    shards: list[ShardSpec]
    excluded_keys: dict[str, frozenset[str]]  # shard name -> keys skipped when read
    stats: dict[str, FileStat] = field(default_factory=dict)  # shard and index name -> size and version

    @property
    def total_samples(self) -> int:
        return sum(s.count for s in self.shards)


def resolve_split(
    root: str | os.PathLike,
    split_part: str,
    *,
    split_config: str | None = None,
    info: DatasetInfo | None = None,
    allow_empty: bool = False,
    allow_outside_root: bool = False,
) -> ResolvedSplit:
    """Lists the shards of ``split_part`` in order, with shard excludes applied.

    Sample excludes (``shard/key``) do not change counts: the sample is skipped when read, as in
    Energon, so sharding is the same with and without them.  A shard named twice, or one outside
    the dataset folder (unless ``allow_outside_root``), is an error.
    """
    root = as_path(root)
    info = info or read_info(root, allow_outside_root=allow_outside_root)
    config = read_split_config(root, split_config)
    known = info.shard_counts  # its names were checked by read_info; split.yaml's must be among them
    shard_names = config.expanded_split(split_part, known)
    excluded_shards: set[str] = set()
    excluded_keys: dict[str, set[str]] = {}
    for entry in config.expanded_excludes():
        if entry in known:
            excluded_shards.add(entry)
            continue
        shard = _shard_prefix(entry, known)
        if shard is None:
            logger.warning(
                "%s: exclude entry %r names no shard of this dataset; it has no effect",
                config.path,
                entry,
            )
            continue
        excluded_keys.setdefault(shard, set()).add(entry[len(shard) + 1 :])
    shards = []
    for name in shard_names:
        if name not in excluded_shards:
            shards.append(ShardSpec(name, known[name]))
    # Remotely, shards and their indexes come in one listing per folder (the reader reuses the
    # stats); locally a stat per shard, and an index is looked at when its shard is first read.
    names = [n for shard in shards for n in (shard.name, index_name(shard.name))] if isinstance(root, RemotePath) else [shard.name for shard in shards]
    stats = list_files(root, names)
    for shard in shards:
        if shard.name not in stats:
            raise DatasetError(
                format_message(
                    "shard listed in the dataset's index is missing on disk",
                    where=str(root / shard.name),
                    fix="restore the shard, or run `energon-lite prepare --force-overwrite` "
                    "to re-index the dataset without it",
                )
            )
    resolved = ResolvedSplit(
        root=root,
        split_part=split_part,
        shards=shards,
        excluded_keys={k: frozenset(v) for k, v in excluded_keys.items()},
        stats=stats,
    )
    if not allow_empty and resolved.total_samples == 0:
        raise EmptyDatasetError(
            format_message(
                f"split {split_part!r} has no samples",
                where=str(config.path),
                fix="choose another split or re-run prepare with a split ratio that gives it shards",
            )
        )
    return resolved


def _shard_prefix(entry: str, shards: Mapping[str, int]) -> str | None:
    """For ``"a/b.tar/key"`` returns ``"a/b.tar"`` when that is a shard (keys may hold ``/``)."""
    pos = entry.find("/")
    while pos != -1:
        if entry[:pos] in shards:
            return entry[:pos]
        pos = entry.find("/", pos + 1)
    return None
