"""``.nv-meta/.lite-split-cache.json``: every split of a prepared dataset, already resolved.

Every rank of a job resolves its split when it starts: with 10,000 shards that is a 300 KB YAML
file and a 400 KB JSON file parsed, checked and joined, ~10 ms per rank and per dataset before the
first sample.  ``prepare`` therefore also writes what resolving gives (each split's shard names
in read order, their sample counts, the sample keys excluded inside them) and the loader reads
that instead, in one JSON parse.

The cache is only ever a copy: it records the size and CRC-32 of the split file and of
``.info.json`` it was made from, and is used only while both files still hold exactly those
bytes (an edit by hand, Energon's own ``prepare``, a copy that changed either file: the cache is
ignored and the files are read as before).  It is checked like any dataset input (names inside
the dataset folder, counts non-negative integers); a cache that is unreadable or fails a check is
ignored too, with a debug line: deleting it is always safe.  Local datasets only: on object
storage it would cost one more request per rank, more than it saves.
"""

from __future__ import annotations

import json
import logging
import zlib
from pathlib import Path
from typing import Any

from ..errors import ConfigError, DatasetError
from ..storage import AnyPath, RemotePath, atomic_write_text
from .metadata import (
    ResolvedSplit,
    checked_split,
    info_path,
    meta_dir,
    plain_shard_names,
    read_info,
    read_split_config,
    resolve_split_config_path,
    resolve_unchecked,
)

logger = logging.getLogger(__name__)

SPLIT_CACHE = ".lite-split-cache.json"
CACHE_VERSION = 1


def _stamp(path: Path) -> list[int] | None:
    """``[size, crc32]`` of a file's bytes; None when it cannot be read."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return [len(data), zlib.crc32(data)]


def _sources(root: Path, split_config: str | None) -> tuple[dict[str, Any], Path] | None:
    """What a cache for ``split_config`` must have been made from: the info and split files'
    names and stamps (None when one cannot be read)."""
    info = info_path(root)
    split = resolve_split_config_path(root, split_config)
    info_stamp, split_stamp = _stamp(info), _stamp(split)
    if info_stamp is None or split_stamp is None:
        return None
    return {"info": [info.name, *info_stamp], "split": [split.name, *split_stamp]}, split


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
    there is no usable cache for it (then resolve the files)."""
    if isinstance(root, RemotePath):
        return None
    root = Path(root)
    try:
        text = (meta_dir(root) / SPLIT_CACHE).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    sources = _sources(root, split_config)
    try:
        data = json.loads(text)
        if sources is None or data.get("version") != CACHE_VERSION:
            return None
        stamps, split_path = sources
        if data.get("info") != stamps["info"] or data.get("split") != stamps["split"]:
            logger.debug("%s: %s is stale (the info or split file changed since prepare)", root, SPLIT_CACHE)
            return None
        entry = data["splits"].get(split_part)
        if entry is None:
            return None  # not a split of this file: resolving names the error
        resolved = _checked(root, split_part, entry)
        unknown = data["unknown_excludes"]
        if not (isinstance(unknown, list) and all(isinstance(u, str) for u in unknown)):
            raise ValueError("unknown_excludes is not a list of strings")
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        logger.debug("%s: ignoring %s: %s", root, SPLIT_CACHE, exc)
        return None
    return checked_split(resolved, unknown, split_path, allow_empty=allow_empty)


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
