"""Splits: shards per split by ratio or by patterns, and writing ``split.yaml``."""

from __future__ import annotations

import hashlib
import json
import random
from typing import Sequence

from ...errors import ConfigError, format_message
from ...storage import AnyPath
from ..metadata import META_DIR, SPLIT_YAML, SplitConfig, collapse_shard_names, read_split_config, write_split_config
from ..safe_parse import expand_braces
from .discover import _compile
from .incremental import _stamps

DEFAULT_SPLIT_NAMES = ("train", "val", "test")


def split_counts_by_ratio(num_shards: int, ratio: Sequence[float]) -> list[int]:
    """Shard counts per split: Energon's cut points, except that the last split ends at the end.

    Energon cuts at ``int(N * running_sum_of_normalised_ratios)``; float rounding can leave the
    running sum just under 1 and drop the last shard from every split (7,2,1 over 10 shards gives
    7/2/0).  We take the same cut points, so splits match Energon's everywhere else, but the last
    split always ends at shard N (7/2/1).
    """
    total = float(sum(ratio))
    if len(ratio) == 0 or any(r < 0 for r in ratio) or total <= 0:
        raise ConfigError(
            format_message(
                "invalid split ratio",
                expected="non-negative numbers with a positive sum, e.g. 8,1,1",
                found=",".join(map(str, ratio)),
            )
        )
    counts, running, previous = [], 0.0, 0
    for i, r in enumerate(ratio):
        running += r / total
        end = num_shards if i == len(ratio) - 1 else min(num_shards, int(num_shards * running))
        counts.append(end - previous)
        previous = end
    return counts


def splits_by_ratio(
    shards: Sequence[str], ratio: Sequence[float] | Sequence[tuple[str, float]], *, shuffle: bool = False
) -> dict[str, list[str]]:
    """Consecutive runs of shards per split: ``ratio`` as ``(8, 1, 1)`` (train, val, test) or as
    Energon's ``[("train", 8), ("val", 1), ...]``."""
    split_names = list(DEFAULT_SPLIT_NAMES)
    if ratio and all(isinstance(r, (tuple, list)) and len(r) == 2 for r in ratio):
        split_names, ratio = [str(name) for name, _ in ratio], [float(r) for _, r in ratio]
    names = list(shards)
    if shuffle:
        random.Random(42).shuffle(names)  # Energon's seed, so the same shards go to each split
    counts = split_counts_by_ratio(len(names), ratio)
    result, start = {}, 0
    for split_name, count in zip(split_names, counts):
        result[split_name] = names[start : start + count]
        start += count
    return result


def splits_by_patterns(
    shards: Sequence[str], patterns: Sequence[tuple[str, str]]
) -> dict[str, list[str]]:
    """``[("train", "shards/train/.*"), ...]``: brace-expanded regexes matched at the start."""
    result: dict[str, list[str]] = {}
    for split_name, pattern in patterns:
        regexes = [_compile(p, f"--split-parts {split_name}") for _, p in expand_braces([pattern], f"--split-parts {split_name}")]
        matched = [s for s in shards if any(r.match(s) for r in regexes)]
        if not matched:
            raise ConfigError(
                format_message(
                    f"split pattern for {split_name!r} matches no shard",
                    found=repr(pattern),
                    expected=f"a regex matching the start of shard paths such as {shards[0]!r}",
                    fix="fix the pattern (it is a regular expression, not a glob)",
                )
            )
        result.setdefault(split_name, []).extend(m for m in matched if m not in result.get(split_name, ()))
    return result


def _choose_splits(
    names: Sequence[str],
    split_ratio: Sequence[float] | None,
    split_parts: Sequence[tuple[str, str]] | None,
    *,
    shuffle: bool,
) -> dict[str, list[str]]:
    """The splits of a full prepare: by ``split_parts`` if given, else by ``split_ratio``."""
    if split_parts is not None:
        return splits_by_patterns(names, split_parts)
    return splits_by_ratio(names, split_ratio, shuffle=shuffle)


def _kept_excludes(root: AnyPath) -> list[str]:
    """A re-prepare keeps the excludes a user wrote into the old split config."""
    try:
        return read_split_config(root).exclude
    except ConfigError:
        return []


def _write_splits(root: AnyPath, splits: dict[str, list[str]], previous: dict) -> dict:
    """Writes ``split.yaml`` with ``splits`` and the excludes of the old one, unless it already
    holds exactly that; returns what the prepare state records about it.

    A ``split.yaml`` whose stamp is the one the previous run recorded is the file that run wrote:
    its excludes are taken from the record instead of parsing 10,000 lines of YAML, and when the
    splits are the same too, the file (same text) is left as it is.  Any other file is read.
    """
    split_name = f"{META_DIR}/{SPLIT_YAML}"
    record = previous.get("split") if isinstance(previous.get("split"), dict) else {}
    stamp = _stamps(root, [split_name]).get(split_name)
    ours = stamp is not None and record.get("stamp") == stamp and isinstance(record.get("exclude"), list)
    exclude = list(record["exclude"]) if ours else _kept_excludes(root)
    # "braces": the file's spelling, so a file an earlier version wrote name by name is rewritten once.
    digest = hashlib.sha256(json.dumps([splits, exclude, "braces"]).encode()).hexdigest()
    if not ours or record.get("digest") != digest:
        # Brace ranges, as Energon writes them: every rank reads this file at start-up.
        collapsed = {part: collapse_shard_names(names) for part, names in splits.items()}
        write_split_config(root, SplitConfig(split_parts=collapsed, exclude=exclude))
        stamp = _stamps(root, [split_name]).get(split_name)
    return {"stamp": stamp, "digest": digest, "exclude": exclude}
