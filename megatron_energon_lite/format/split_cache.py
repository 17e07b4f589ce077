"""``.nv-meta/.lite-split-cache.json``: the start-up summary of a prepared dataset.

Every rank of a job resolves its split when it starts.  From the files that means ``.info.json``
(a count per shard: 280 KB at 10,000 shards) and the split file parsed, checked and joined, and
on object storage also a listing of the shard folder; ``prepare`` therefore also writes this
summary, which a rank reads instead: one small object, the same cost at 20 shards and at 10,000.

It holds, per split of the default split file, only what that file does not say: the sample
count of each shard, in split order, run-length encoded (``[[count, shards], ...]``: a few bytes
when the shards hold equal counts).  Shard names and sample excludes always come from the split
file itself, which the loader reads (``prepare`` writes it with brace patterns, as Energon does,
so it is small too).  The summary records the size and SHA-256 of the split file and the size,
MD5 and, remotely, the store's version tag (ETag) of ``.info.json`` it was made from, and is used
only while both files are still those: checked against the bytes read (the split file; locally
``.info.json`` too) or one ``HEAD`` of ``.info.json`` on object storage (S3's ETag of an object
written in one piece is its MD5).  An edit by hand, Energon's own ``prepare``, a copy that changed
either file: the summary is ignored and the files are read as before.

A dataset comes with its summary, so it is dataset input like the files: it can say no more than
they do.  Names and excludes are the split file's; a count must be a positive integer, one per
shard; and a count is checked against the shard's ``.tar.idx`` when the shard is first read, as a
count from ``.info.json`` is.  A summary that is unreadable or disagrees is ignored with a warning
(``lint`` reports it): deleting it is always safe.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from ..errors import ConfigError, DatasetError
from ..storage import AnyPath, FileStat, RemotePath, as_path, atomic_write_text, file_stat
from .metadata import (
    INFO_JSON,
    SPLIT_YAML,
    ResolvedSplit,
    SplitConfig,
    checked_split,
    info_path,
    meta_dir,
    parse_info,
    parse_split_config,
    plain_shard_names,
    resolve_split_config_path,
    resolve_unchecked,
    shard_prefix,
)
from .safe_parse import parse_json

logger = logging.getLogger(__name__)

SPLIT_CACHE = ".lite-split-cache.json"
CACHE_VERSION = 2


def _read(path: AnyPath) -> bytes | None:
    try:
        return path.read_bytes()
    except (OSError, FileNotFoundError):
        return None


def _info_stamp(data: bytes, stat: FileStat | None) -> dict[str, Any]:
    stamp: dict[str, Any] = {"size": len(data), "md5": hashlib.md5(data).hexdigest()}
    if stat is not None:
        stamp["etag"] = stat.version
    return stamp


def _split_stamp(name: str, data: bytes) -> dict[str, Any]:
    return {"name": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def run_lengths(counts: list[int]) -> list[list[int]]:
    """``[10, 10, 10, 7]`` -> ``[[10, 3], [7, 1]]``."""
    runs: list[list[int]] = []
    for count in counts:
        if runs and runs[-1][0] == count:
            runs[-1][1] += 1
        else:
            runs.append([count, 1])
    return runs


def _expanded_counts(runs: Any, shards: int) -> list[int]:
    """The counts of ``runs``, which must give exactly ``shards`` positive integers (ValueError
    otherwise; checked before anything is expanded, so a forged run length costs nothing)."""
    if not (isinstance(runs, list) and all(isinstance(r, list) and len(r) == 2 and all(type(v) is int for v in r) for r in runs)):
        raise ValueError("counts are not a list of [count, shards] integer pairs")
    if any(count < 1 or repeat < 1 for count, repeat in runs):
        raise ValueError("a count or run length is not positive (prepare refuses empty shards)")
    if sum(repeat for _, repeat in runs) != shards:
        raise ValueError(f"it counts {sum(repeat for _, repeat in runs)} shards where the split file lists {shards}")
    return [count for count, repeat in runs for _ in range(repeat)]


def write_split_cache(root: AnyPath) -> bool:
    """Writes the start-up summary of the prepared dataset at ``root`` (local or remote), made
    from its ``.info.json`` and default split file as they are now; returns whether it did.

    Prepare calls it last, once every other file is in place (single-process and distributed
    prepare alike).  Nothing is written (and a stale summary is removed) when the files do not
    resolve without an error or an opt-in (a split naming an unknown shard, shards outside the
    folder): loading then reads the files and reports the problem as it always did.
    """
    root = as_path(root)
    cache = meta_dir(root) / SPLIT_CACHE
    info, split = info_path(root), resolve_split_config_path(root, None)
    info_data, split_data = _read(info), _read(split)
    splits: dict[str, Any] = {}
    try:
        if info_data is None or split_data is None:
            raise DatasetError(f"no {info.name} or {split.name}")
        dataset_info = parse_info(info, info_data.decode("utf-8"))
        config = parse_split_config(split, split_data.decode("utf-8"))
        unknown_excludes: list[str] = []
        excluded: dict[str, list[str]] = {}
        for part in config.split_parts:
            resolved, unknown_excludes = resolve_unchecked(root, part, dataset_info, config)
            splits[part] = {"counts": run_lengths(resolved.counts)}
            excluded = {shard: sorted(keys) for shard, keys in resolved.excluded_keys.items()}  # the same for every split
    except (ConfigError, DatasetError, UnicodeDecodeError) as exc:
        logger.debug("%s: not writing %s: %s", root, SPLIT_CACHE, exc)
        cache.unlink(missing_ok=True)
        return False
    info_stat = file_stat(info) if isinstance(root, RemotePath) else None  # the store's tag for it
    data = {
        "version": CACHE_VERSION,
        "info": {"name": info.name, **_info_stamp(info_data, info_stat)},
        "split": _split_stamp(split.name, split_data),
        "unknown_excludes": unknown_excludes,
        "excluded_keys": excluded,
        "splits": splits,
    }
    atomic_write_text(cache, json.dumps(data, separators=(",", ":")))
    return True


def cached_split(root: AnyPath, split_part: str, split_config: str | None, *, info_stat: FileStat | None = None, allow_empty: bool = False) -> ResolvedSplit | None:
    """What :func:`~.metadata.resolve_split` gives for ``split_part``, from the summary; None when
    there is no usable summary for it (then resolve the files).

    Reads the summary and the split file (one GET each remotely) and checks ``.info.json``'s
    stamp: its bytes locally, ``info_stat`` (one HEAD, made here when not given) remotely.  The
    shards and excludes are the split file's; the summary gives the counts.  A summary that
    disagrees with the files is ignored, with a warning saying why.
    """
    root = as_path(root)
    found = _fresh_cache(root, split_config, info_stat)
    if found is None:
        return None
    data, config = found
    entry = data["splits"].get(split_part) if isinstance(data.get("splits"), dict) else None
    if entry is None or split_part not in config.split_parts:
        return None  # not a split of this file: resolving names the error
    try:
        resolved, unknown = _resolved_from(root, split_part, config, entry, data)
    except (ConfigError, DatasetError):
        return None  # the split file's own problem: resolving the files reports it
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        problem = f"it has no {exc}" if isinstance(exc, KeyError) else str(exc)
        logger.warning(
            "%s: ignoring %s for split %r (%s); reading %s and .info.json instead. Run `energon-lite prepare` to rewrite it.",
            root, SPLIT_CACHE, split_part, problem, config.path.name if config.path else "the split file",
        )  # fmt: skip
        return None
    return checked_split(resolved, unknown, config.path, allow_empty=allow_empty)


def _resolved_from(root: AnyPath, split_part: str, config: SplitConfig, entry: Any, data: dict) -> tuple[ResolvedSplit, list[str]]:
    """The split: the split file's shards (patterns expanded, excluded shards removed), the
    summary's counts and sample excludes.  The excludes inside the split's own shards must be
    the split file's (shard and ``shard/key`` entries told apart by the split's shards: a shard
    of another split cannot be the folder of one of these); those of other shards (which
    ``.info.json`` alone could tell apart; a loader state's digest covers them) must each be an
    entry of the split file."""
    expansion = config.expanded_split(split_part)  # a shard named twice: ConfigError
    if not plain_shard_names(expansion):
        raise DatasetError("a shard name needs checking")  # outside the folder, braces: the files' path says so
    shards = set(expansion)
    entries = config.expanded_excludes()
    excluded_shards = shards.intersection(entries)
    names = [n for n in expansion if n not in excluded_shards] if excluded_shards else expansion
    keys: dict[str, set[str]] = {}
    for item in entries:
        shard = None if item in shards else shard_prefix(item, shards)
        if shard is not None and shard not in excluded_shards:
            keys.setdefault(shard, set()).add(item[len(shard) + 1 :])
    counts = _expanded_counts(entry["counts"], len(names))
    unknown, excluded = data["unknown_excludes"], data["excluded_keys"]
    if not (isinstance(unknown, list) and all(isinstance(u, str) for u in unknown)):
        raise ValueError("unknown_excludes is not a list of strings")
    if not (isinstance(excluded, dict) and all(isinstance(v, list) and all(isinstance(k, str) for k in v) for v in excluded.values())):
        raise ValueError("excluded_keys is not a mapping of shard to key lists")
    file_name = config.path.name if config.path else "the split file"
    listed = set(entries)
    if not set(unknown) <= listed or any(f"{shard}/{key}" not in listed for shard, keys in excluded.items() for key in keys):
        raise ValueError(f"it lists exclude entries that {file_name} does not")
    excluded_keys = {shard: frozenset(v) for shard, v in excluded.items() if v}
    if {s: k for s, k in excluded_keys.items() if s in shards} != {s: frozenset(k) for s, k in keys.items()}:
        raise ValueError(f"its excluded sample keys are not the ones {file_name} lists")
    resolved = ResolvedSplit(root=root, split_part=split_part, names=names, counts=counts, excluded_keys=excluded_keys)
    return resolved, unknown


def split_cache_problems(root: AnyPath, split_config: str | None = None) -> list[tuple[str, str]]:
    """``(split, problem)`` for each split where a summary that the loader would read (its
    stamps match the files) disagrees with the files (for ``lint``)."""
    root = as_path(root)
    found = _fresh_cache(root, split_config, None)
    if found is None:
        return []
    data, config = found
    splits = data.get("splits")
    if not isinstance(splits, dict):
        return [("*", "the summary holds no mapping of splits")]
    try:
        info = parse_info(info_path(root), info_path(root).read_text(encoding="utf-8"))
    except (ConfigError, DatasetError, OSError, UnicodeDecodeError):
        return []  # the files themselves are reported by the other checks
    problems = [(part, f"the summary has a split that {config.path.name} does not") for part in sorted(set(splits) - set(config.split_parts))]
    for part in config.split_parts:
        if part not in splits:
            continue
        try:
            cached, _ = _resolved_from(root, part, config, splits[part], data)
            resolved, _ = resolve_unchecked(root, part, info, config)
        except (ConfigError, DatasetError):
            continue  # the loader reports the files' own problem
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            problems.append((part, str(exc)))
            continue
        if cached.counts != resolved.counts:
            problems.append((part, "its counts differ from what .info.json gives"))
        elif cached.excluded_keys != resolved.excluded_keys:
            problems.append((part, "its excluded sample keys differ from the split file's"))
    return problems


def _fresh_cache(root: AnyPath, split_config: str | None, info_stat: FileStat | None) -> tuple[dict, SplitConfig] | None:
    """The parsed summary and split file when there is a summary made from the info and split
    files as they are now (none, stale, unreadable or another version: None, logged)."""
    remote = isinstance(root, RemotePath)
    meta = meta_dir(root)
    raw = _read(meta / SPLIT_CACHE)
    if raw is None:
        if remote:
            logger.info(
                "%s: no start-up summary (.nv-meta/%s); reading .info.json and the split file and listing the shards "
                "instead, which costs more requests the more shards there are. Run `energon-lite prepare %s` "
                "(megatron-energon-lite) once to write it: start-up then costs the same few requests at any shard count.",
                root, SPLIT_CACHE, root,
            )  # fmt: skip
        return None
    try:
        data = parse_json(raw.decode("utf-8"), str(meta / SPLIT_CACHE))
    except (ValueError, UnicodeDecodeError) as exc:  # bad JSON, nesting too deep (ConfigError)
        logger.warning("%s: ignoring %s: %s", root, SPLIT_CACHE, " ".join(str(exc).split()))
        return None
    if not isinstance(data, dict) or data.get("version") != CACHE_VERSION:
        logger.log(logging.INFO if remote else logging.DEBUG, "%s: %s was written by another version; run `energon-lite prepare %s` to rewrite it", root, SPLIT_CACHE, root)
        return None
    split, info = data.get("split"), data.get("info")
    if not (isinstance(split, dict) and isinstance(info, dict)):
        return None
    # The split file the loader would read: the one named, else the default (split.yaml first).
    if split.get("name") != (split_config or SPLIT_YAML) or info.get("name") != INFO_JSON:
        return None
    split_path = meta / split["name"]
    split_data = _read(split_path)
    stale = split_data is None or split != _split_stamp(split["name"], split_data) or not _info_fresh(root, info, info_stat)
    if stale:
        logger.log(
            logging.INFO if remote else logging.DEBUG,
            "%s: %s is stale (the info or split file changed since prepare); reading the files. Run `energon-lite prepare %s` to rewrite it.",
            root, SPLIT_CACHE, root,
        )  # fmt: skip
        return None
    try:
        config = parse_split_config(split_path, split_data.decode("utf-8"))
    except (ConfigError, DatasetError, UnicodeDecodeError):
        return None  # resolving the files reports it
    return data, config


def _info_fresh(root: AnyPath, stamp: dict, stat: FileStat | None) -> bool:
    """Whether ``.info.json`` is still the file ``stamp`` describes: its bytes locally; remotely
    its size and the store's version tag (S3's ETag of a one-part object is its MD5)."""
    path = meta_dir(root) / INFO_JSON
    if not isinstance(root, RemotePath):
        data = _read(path)
        return data is not None and stamp.get("size") == len(data) and stamp.get("md5") == hashlib.md5(data).hexdigest()
    stat = stat or file_stat(path)
    return stat is not None and stat.size == stamp.get("size") and stat.version in (stamp.get("md5"), stamp.get("etag"))
