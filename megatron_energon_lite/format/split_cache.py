"""``.nv-meta/.lite-split-cache.json``: every split of a prepared dataset, already resolved.

Every rank of a job resolves its split when it starts: with 10,000 shards that is a 300 KB YAML
file and a 400 KB JSON file parsed, checked and joined, ~10 ms per rank and per dataset before the
first sample.  ``prepare`` therefore also writes what resolving gives (each split's shard names
in read order, their sample counts, the sample keys excluded inside them) and the loader reads
that instead, in one JSON parse.

The cache is only ever a copy: it records the size and CRC-32 of the split file and of
``.info.json`` it was made from, and is used only while both files still hold exactly those
bytes (an edit by hand, Energon's own ``prepare``, a copy that changed either file: the cache is
ignored and the files are read as before).  A dataset comes with its cache, so the cache is
checked like any dataset input and may not say more than the files: its shard names and
excludes must be what the split file gives (the split file is read for this, ~2 ms for 10,000
shards; ``.info.json`` is not), its counts positive; a count is checked against the shard's
``.tar.idx`` when the shard is first read, as a count from ``.info.json`` is.  A cache that is
unreadable or disagrees is ignored with a warning (``lint`` reports it): deleting it is always
safe.  Local datasets only: on object storage it would cost one more request per rank, more than
it saves.
"""

from __future__ import annotations

import json
import logging
import zlib
from pathlib import Path
from typing import Any, Collection

from ..errors import ConfigError, DatasetError
from ..storage import AnyPath, RemotePath, atomic_write_text
from .metadata import (
    ResolvedSplit,
    SplitConfig,
    checked_split,
    info_path,
    meta_dir,
    parse_split_config,
    plain_shard_names,
    read_info,
    read_split_config,
    resolve_split_config_path,
    resolve_unchecked,
    shard_prefix,
)
from .safe_parse import parse_json

logger = logging.getLogger(__name__)

SPLIT_CACHE = ".lite-split-cache.json"
CACHE_VERSION = 1


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _sources(root: Path, split_config: str | None) -> tuple[dict[str, Any], Path, bytes] | None:
    """What a cache for ``split_config`` must have been made from: the info and split files'
    names and stamps (``[size, crc32]``), the split file's path and bytes (None when one cannot
    be read)."""
    info = info_path(root)
    split = resolve_split_config_path(root, split_config)
    info_data, split_data = _read(info), _read(split)
    if info_data is None or split_data is None:
        return None
    stamps = {"info": [info.name, len(info_data), zlib.crc32(info_data)], "split": [split.name, len(split_data), zlib.crc32(split_data)]}
    return stamps, split, split_data


def write_split_cache(root: AnyPath) -> bool:
    """Writes the cache of every split in the default split file of the prepared dataset at
    ``root``; returns whether it did.

    Nothing is written (and a stale cache is removed) when the files do not resolve without an
    error or an opt-in (a split naming an unknown shard, shards outside the folder): loading then
    reads the files and reports the problem as it always did.
    """
    if isinstance(root, RemotePath):
        return False
    root = Path(root)
    cache = meta_dir(root) / SPLIT_CACHE
    sources = _sources(root, None)
    if sources is None:
        cache.unlink(missing_ok=True)
        return False
    splits: dict[str, Any] = {}
    try:
        info = read_info(root)
        config = read_split_config(root)
        unknown_excludes: list[str] = []
        for part in config.split_parts:
            resolved, unknown_excludes = resolve_unchecked(root, part, info, config)
            splits[part] = {
                "names": resolved.names,
                "counts": resolved.counts,
                "excluded_keys": {shard: sorted(keys) for shard, keys in resolved.excluded_keys.items()},
            }
    except (ConfigError, DatasetError) as exc:
        logger.debug("%s: not writing %s: %s", root, SPLIT_CACHE, exc)
        cache.unlink(missing_ok=True)
        return False
    data = {"version": CACHE_VERSION, **sources[0], "unknown_excludes": unknown_excludes, "splits": splits}
    atomic_write_text(cache, json.dumps(data, separators=(",", ":")))
    return True


def cached_split(root: AnyPath, split_part: str, split_config: str | None, *, allow_empty: bool = False) -> ResolvedSplit | None:
    """What :func:`~.metadata.resolve_split` gives for ``split_part``, from the cache; None when
    there is no usable cache for it (then resolve the files).

    The cache is dataset input like the files it summarises, and may say no more than they do:
    its shard names and excludes must be what the split file gives (read for this; that also
    rules out a shard named twice) and its counts positive (prepare refuses empty shards; a
    count is checked against the shard's ``.tar.idx`` when the shard is first read).  A cache
    that disagrees is ignored, with a warning saying why.
    """
    found = _fresh_cache(root, split_config)
    if found is None:
        return None
    data, split_path, split_data = found
    try:  # the bytes the stamp was taken of: the file is read once
        config = parse_split_config(split_path, split_data.decode("utf-8"))
    except (ConfigError, DatasetError, UnicodeDecodeError):
        return None  # resolving the files reports it
    try:
        entry = data["splits"].get(split_part)
        if entry is None:
            return None  # not a split of this file: resolving names the error
        resolved = _checked(root, split_part, entry)
        unknown = data["unknown_excludes"]
        if not (isinstance(unknown, list) and all(isinstance(u, str) for u in unknown)):
            raise ValueError("unknown_excludes is not a list of strings")
        problem = _disagreement(config, resolved, unknown)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        problem = str(exc)
    if problem is not None:
        logger.warning(
            "%s: ignoring %s for split %r (%s); reading %s and .info.json instead. Run `energon-lite prepare` to rewrite it.",
            root, SPLIT_CACHE, split_part, problem, split_path.name,
        )  # fmt: skip
        return None
    return checked_split(resolved, unknown, split_path, allow_empty=allow_empty)


def split_cache_problems(root: AnyPath, split_config: str | None = None) -> list[tuple[str, str]]:
    """``(split, problem)`` for each split where a cache that the loader would read (its stamps
    match the files) disagrees with the files (for ``lint``)."""
    found = _fresh_cache(root, split_config)
    if found is None:
        return []
    data = found[0]
    try:
        info, config = read_info(root), read_split_config(root, split_config)
        splits = data["splits"]
        if not isinstance(splits, dict):
            return [("*", "the cache holds no mapping of splits")]
    except (ConfigError, DatasetError, KeyError):
        return []  # the files themselves are reported by the other checks
    problems = []
    for part in sorted(set(splits) - set(config.split_parts)):
        problems.append((part, f"the cache has a split that {config.path.name} does not"))
    for part in config.split_parts:
        if part not in splits:
            continue
        try:
            cached = _checked(root, part, splits[part])
            resolved, unknown = resolve_unchecked(root, part, info, config)
        except (ConfigError, DatasetError):
            continue  # the loader reports the files' own problem
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            problems.append((part, str(exc)))
            continue
        if (cached.names, cached.counts) != (resolved.names, resolved.counts):
            problems.append((part, "its shards or counts differ from what the split file and .info.json give"))
        elif _within(cached.excluded_keys, cached.names) != _within(resolved.excluded_keys, resolved.names):
            problems.append((part, "its excluded sample keys differ from the split file's"))
    return problems


def _fresh_cache(root: AnyPath, split_config: str | None) -> tuple[dict, Path, bytes] | None:
    """The parsed cache, the split file's path and bytes when there is a cache made from the info
    and split files as they are now (stale, unreadable or another version: None, logged at debug)."""
    if isinstance(root, RemotePath):
        return None
    root = Path(root)
    path = meta_dir(root) / SPLIT_CACHE
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    sources = _sources(root, split_config)
    try:
        data = parse_json(text, str(path))
    except ValueError as exc:  # bad JSON, nesting too deep (ConfigError)
        logger.warning("%s: ignoring %s: %s", root, SPLIT_CACHE, " ".join(str(exc).split()))
        return None
    if sources is None or not isinstance(data, dict) or data.get("version") != CACHE_VERSION:
        return None
    stamps, split_path, split_data = sources
    if data.get("info") != stamps["info"] or data.get("split") != stamps["split"]:
        logger.debug("%s: %s is stale (the info or split file changed since prepare)", root, SPLIT_CACHE)
        return None
    return data, split_path, split_data


def _disagreement(config: SplitConfig, cached: ResolvedSplit, unknown: list[str]) -> str | None:
    """Why the cached split is not what ``config`` (the split file) gives, or None.

    Names: the split's patterns, expanded, less the shards its excludes name, in order.  Shard
    excludes and ``shard/key`` excludes are told apart by the split's own shards (a shard of
    another split cannot be the folder of one of these).
    """
    if 0 in cached.counts:
        return "a shard with no samples (prepare refuses empty shards)"
    patterns = config.split_parts.get(cached.split_part)
    if patterns is None:
        return f"split {cached.split_part!r} is not in {config.path.name}"
    plain = "{" not in "".join(patterns) and "}" not in "".join(patterns)
    expansion = list(patterns) if plain else config.expanded_split(cached.split_part)
    shards = set(expansion)
    if len(shards) != len(expansion):
        return "the split file names a shard twice"
    entries = config.expanded_excludes()
    excluded_shards = shards.intersection(entries)
    names = [n for n in expansion if n not in excluded_shards] if excluded_shards else expansion
    if cached.names != names:
        return f"its shards are not the ones {config.path.name} lists"
    keys: dict[str, set[str]] = {}
    for entry in entries:
        shard = None if entry in shards else shard_prefix(entry, shards)
        if shard is not None and shard not in excluded_shards:
            keys.setdefault(shard, set()).add(entry[len(shard) + 1 :])
    if _within(cached.excluded_keys, set(names)) != {shard: frozenset(k) for shard, k in keys.items()}:
        return f"its excluded sample keys are not the ones {config.path.name} lists"
    if not set(unknown) <= set(entries):
        return f"it lists exclude entries that {config.path.name} does not"
    return None


def _within(excluded: dict[str, frozenset[str]], names: Collection[str]) -> dict[str, frozenset[str]]:
    return {shard: keys for shard, keys in excluded.items() if shard in names and keys}


def _checked(root: Path, split_part: str, entry: dict) -> ResolvedSplit:
    """The cache entry as a split, checked as the files it came from would be (ValueError or
    TypeError when it is not what prepare writes)."""
    names, counts, excluded = entry["names"], entry["counts"], entry["excluded_keys"]
    if not (isinstance(names, list) and isinstance(counts, list) and len(names) == len(counts)):
        raise ValueError("names and counts are not two lists of one length")
    if not plain_shard_names(names):
        raise ValueError("a shard name is not a plain path inside the dataset folder")
    if not set(map(type, counts)) <= {int} or (counts and min(counts) < 0):
        raise ValueError("a count is not a non-negative integer")
    if not isinstance(excluded, dict) or not all(
        isinstance(keys, list) and all(isinstance(k, str) for k in keys) for keys in excluded.values()
    ):
        raise ValueError("excluded_keys is not a mapping of shard to key lists")
    return ResolvedSplit(
        root=root,
        split_part=split_part,
        names=names,
        counts=counts,
        excluded_keys={shard: frozenset(keys) for shard, keys in excluded.items()},
    )
