"""Join index: which sample of each joined dataset belongs to each row of a join.

A join (metadataset ``join:``) pairs every sample of its primary dataset with the samples of the
other datasets that have the same ``__key__``, found through each dataset's ``index.sqlite``
(Energon's schema: ``samples(tar_file_id, sample_key, sample_index, ...)``, ``tar_file_id`` being
the shard's position in ``.info.json``).  Rows follow the primary's split order; a primary
sample whose key is missing in another dataset fails (``nonmatch: error``), is dropped
(``skip``) or gets ``None`` there (``none``).

Energon needs ``energon prepare <metadataset>.yaml`` to write this index to a cache file first;
here it is computed when the loader is built (one SQL scan per dataset) and kept in memory, so
forked dataloader workers share it.
"""

from __future__ import annotations

import functools
import sqlite3
from dataclasses import dataclass
import numpy as np

from ..errors import ConfigError, DatasetError, format_message
from ..storage import as_path, file_stat, local_view
from .metadata import INDEX_SQLITE, meta_dir, read_info, resolve_split
from .metadataset import JoinMember, JoinSpec

__all__ = ["JoinIndex", "join_index"]


@dataclass(frozen=True)
class JoinIndex:
    """``rows[r, m]``: split index of row ``r``'s sample in member ``m`` (-1: none)."""

    rows: np.ndarray
    shard_starts: list[int]  # row index of the first row of each primary shard, plus the total

    def __len__(self) -> int:
        return len(self.rows)


def _split_keys(member: JoinMember) -> tuple[list[str | None], list[int]]:
    """Every sample key of the member's split, in split order, and the split's shard starts."""
    root = as_path(member.path)
    info = read_info(root)
    split = resolve_split(root, member.split_part, split_config=member.split_config, info=info)
    info_position = {name: i for i, name in enumerate(info.shard_counts)}
    starts, start = {}, 0
    shard_starts = [0]
    for shard in split.shards:
        starts[info_position[shard.name]] = (start, shard.name)
        start += shard.count
        shard_starts.append(start)
    database = meta_dir(root) / INDEX_SQLITE
    local_database = local_view(database)  # a remote index is read from its cached copy
    if local_database is None:
        raise DatasetError(
            format_message(
                "a joined dataset has no sample index",
                where=member.where,
                expected=f"{database}",
                fix=f"run `energon-lite prepare {root}` (it writes index.sqlite), or Energon's prepare",
            )
        )
    keys: list[str | None] = [None] * start
    db = sqlite3.connect(f"file:{local_database}?mode=ro", uri=True)
    try:
        for tar_file_id, key, sample_index in db.execute("SELECT tar_file_id, sample_key, sample_index FROM samples"):
            found = starts.get(tar_file_id)
            if found is not None:
                first, shard_name = found
                if key not in split.excluded_keys.get(shard_name, ()):
                    keys[first + sample_index] = key
    except sqlite3.Error as exc:
        raise DatasetError(format_message("cannot read the sample index", where=str(database), found=str(exc), fix=f"re-run `energon-lite prepare {root}`")) from None
    finally:
        db.close()
    return keys, shard_starts


def _stamp(member: JoinMember) -> tuple:
    stat = file_stat(meta_dir(member.path) / INDEX_SQLITE)
    return (member, None if stat is None else stat.version)


def join_index(spec: JoinSpec) -> JoinIndex:
    """The join's rows (cached per process while the members' indexes are unchanged)."""
    return _cached_index(spec, tuple(_stamp(m) for m in spec.members))


@functools.lru_cache(maxsize=16)
def _cached_index(spec: JoinSpec, stamps: tuple) -> JoinIndex:
    primary_keys, primary_starts = _split_keys(spec.members[0])
    columns = [np.arange(len(primary_keys), dtype=np.int64)]
    keep = np.array([key is not None for key in primary_keys], dtype=bool)  # excluded keys drop out
    for member in spec.members[1:]:
        keys, _ = _split_keys(member)
        position = {key: i for i, key in enumerate(keys) if key is not None}
        column = np.fromiter((position.get(key, -1) if key is not None else -1 for key in primary_keys), dtype=np.int64, count=len(primary_keys))
        missing = (column < 0) & keep
        if missing.any():
            if member.nonmatch == "error":
                first = primary_keys[int(np.flatnonzero(missing)[0])]
                raise ConfigError(
                    format_message(
                        f"sample key {first!r} of the primary dataset is missing in a joined dataset ({int(missing.sum())} keys in all)",
                        where=member.where,
                        expected=f"every key of {spec.members[0].path} (split {spec.members[0].split_part!r}) in {member.path} (split {member.split_part!r})",
                        found=f"no sample with key {first!r}",
                        fix="add the samples, or set nonmatch: skip (drop such rows) or nonmatch: none (pass None)",
                    )
                )
            if member.nonmatch == "skip":
                keep &= ~missing
        columns.append(column)
    rows = np.stack(columns, axis=1)[keep]
    # Row shards follow the primary's: a row belongs to the shard of its primary sample.
    kept_before = np.concatenate([[0], np.cumsum(keep)])
    shard_starts = [int(kept_before[s]) for s in primary_starts]
    return JoinIndex(rows=rows, shard_starts=shard_starts)
