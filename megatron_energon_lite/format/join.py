"""Join index: which sample of each joined dataset belongs to each row of a join.

A join (metadataset ``join:``) pairs every sample of its primary dataset with the samples of the
other datasets that have the same ``__key__``, found through each dataset's ``index.sqlite``
(Energon's schema: ``samples(tar_file_id, sample_key, sample_index, ...)``, ``tar_file_id`` being
the shard's position in ``.info.json``).  Rows follow the primary's split order; a primary
sample whose key is missing in another dataset fails (``nonmatch: error``), is dropped
(``skip``) or gets ``None`` there (``none``).

Energon needs ``energon prepare <metadataset>.yaml`` to write this index to a cache file first;
here it is computed when the loader is built (one SQL scan per dataset) and kept in memory, so
forked dataloader workers share it.  :func:`write_energon_join_index` writes Energon's cache file
too (``<metadataset>.yaml.cache/join_index_<sha256>.bin``, see below), so that
``energon-lite prepare meta.yaml`` leaves a join that Energon loads.

Energon's join index file: the magic ``b"JIDX0001"``, the number of columns (one per joined
dataset) as a little-endian int64, then per row and column three int64 ``(shard, byte_offset,
byte_size)``: ``shard`` is the position of the sample's shard in the split's list of shard files
(as written in split.yaml, shard excludes included), the byte range is the sample's in its tar
(``index.sqlite``), and ``(-1, -1, -1)`` stands for a missing match (``nonmatch: none``).  The
file name hashes each dataset's ``index.uuid``, its ``shard/key`` excludes and its ``nonmatch``.
"""

from __future__ import annotations

import functools
import hashlib
import sqlite3
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError, DatasetError, format_message
from ..policy import PLAIN, Policy
from ..storage import AnyPath, as_path, atomic_write_bytes, file_stat, local_view
from .metadata import (
    INDEX_SQLITE,
    INDEX_UUID,
    check_mapping,
    load_structured,
    meta_dir,
    read_info,
    read_split_config,
    resolve_split,
)
from .metadataset import JoinMember, JoinSpec, load_blend_plan

__all__ = [
    "JOIN_INDEX_MAGIC",
    "JoinIndex",
    "JoinIndexFile",
    "PreparedJoin",
    "energon_join_index_path",
    "join_cache_dir",
    "join_index",
    "prepare_metadataset_joins",
    "require_energon_join_index",
    "write_energon_join_index",
]

#: The first bytes of Energon's join index file (format version 1).
JOIN_INDEX_MAGIC = b"JIDX0001"


@dataclass(frozen=True)
class JoinIndex:
    """``rows[r, m]``: split index of row ``r``'s sample in member ``m`` (-1: none)."""

    rows: np.ndarray
    shard_starts: list[int]  # row index of the first row of each primary shard, plus the total

    def __len__(self) -> int:
        return len(self.rows)


def _split_keys(member: JoinMember, policy: Policy) -> tuple[list[str | None], list[int]]:
    """Every sample key of the member's split, in split order, and the split's shard starts."""
    root = as_path(member.path)
    info = read_info(root, policy=policy)
    split = resolve_split(root, member.split_part, split_config=member.split_config, info=info)
    info_position = {name: i for i, name in enumerate(info.shard_counts)}
    starts, start = {}, 0
    shard_starts = [0]
    for shard in split.shards:
        starts[info_position[shard.name]] = (start, shard.count, shard.name)
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
                position = _split_position(found, sample_index, (tar_file_id, key, sample_index), database, root)
                if key not in split.excluded_keys.get(found[2], ()):
                    keys[position] = key
    except sqlite3.Error as exc:
        raise DatasetError(format_message("cannot read the sample index", where=str(database), found=str(exc), fix=f"re-run `energon-lite prepare {root}`")) from None
    finally:
        db.close()
    return keys, shard_starts


def _split_position(shard: tuple[int, int, str], sample_index: object, row: tuple, database: AnyPath, root: AnyPath) -> int:
    """The split index of an ``index.sqlite`` row of ``shard`` (its first split index, sample
    count and name): a row whose ``sample_index`` is not one of the shard's samples would
    overwrite another sample's entry (a negative one from the end), so it stops the read."""
    first, count, name = shard
    if type(sample_index) is not int or not 0 <= sample_index < count:
        raise DatasetError(
            format_message(
                "a row of the sample index points outside its shard",
                where=f"{database}, table samples, row {row!r}"[:400],
                expected=f"sample_index 0..{count - 1} ({name} holds {count} samples per .nv-meta/.info.json)",
                found=f"sample_index {sample_index!r}"[:200],
                fix=f"re-run `energon-lite prepare {root}` (the index does not match the shards)",
            )
        )
    return first + sample_index


def _stamp(member: JoinMember) -> tuple:
    stat = file_stat(meta_dir(member.path) / INDEX_SQLITE)
    return (member, None if stat is None else stat.version)


def join_index(spec: JoinSpec, *, policy: Policy = PLAIN) -> JoinIndex:
    """The join's rows (cached per process while the members' indexes are unchanged);
    ``policy``: the loader's (members' shards outside their folders, see ``check_shard_name``)."""
    return _cached_index(spec, tuple(_stamp(m) for m in spec.members), policy)


@functools.lru_cache(maxsize=16)
def _cached_index(spec: JoinSpec, stamps: tuple, policy: Policy) -> JoinIndex:
    primary_keys, primary_starts = _split_keys(spec.members[0], policy)
    columns = [np.arange(len(primary_keys), dtype=np.int64)]
    keep = np.array([key is not None for key in primary_keys], dtype=bool)  # excluded keys drop out
    for member in spec.members[1:]:
        keys, _ = _split_keys(member, policy)
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


# --- Energon's join index cache file --------------------------------------------------------------


def _index_database(member: JoinMember) -> str:
    database = meta_dir(member.path) / INDEX_SQLITE
    local = local_view(database)
    if local is None:
        raise DatasetError(format_message("a joined dataset has no sample index", where=member.where, expected=str(database), fix=f"run `energon-lite prepare {member.path}`"))
    return str(local)


def energon_join_index_path(spec: JoinSpec, cache_dir: AnyPath) -> AnyPath:
    """Where Energon looks for this join's index: ``cache_dir / join_index_<sha256>.bin``.

    The hash covers, per joined dataset in order: its ``index.uuid`` (which a new prepare
    changes), its ``shard/key`` excludes and its ``nonmatch``.  Energon hashes the excludes in the
    order of a Python set, which varies between processes when there are two or more; they are
    hashed sorted here.
    """
    digest = hashlib.sha256()
    for member in spec.members:
        uuid_file = meta_dir(member.path) / INDEX_UUID
        if not uuid_file.is_file():
            raise DatasetError(
                format_message(
                    "a joined dataset has no index.uuid",
                    where=member.where,
                    expected=str(uuid_file),
                    fix=f"run `energon-lite prepare {member.path} --tar-index-only` (or a full prepare)",
                )
            )
        excludes = sorted({entry for entry in read_split_config(member.path, member.split_config).expanded_excludes() if "/" in entry})
        digest.update(b"\0uuid=")
        digest.update(uuid_file.read_text().encode())
        digest.update(b"\0excludes=")
        for entry in excludes:
            digest.update(entry.encode())
            digest.update(b"\0")
        digest.update(f"\0nonmatch={member.nonmatch}\0".encode())
    return cache_dir / f"join_index_{digest.hexdigest()}.bin"


def require_energon_join_index(spec: JoinSpec, where: str) -> None:
    """Under the as_energon switch: the join must have been prepared, as Energon requires.

    Energon reads a join only from its index file, so a join that ``energon prepare`` never saw
    (or saw before a member was re-prepared or its excludes changed: the file name hashes those)
    fails there when the dataset is made; the switch fails the same way, so a program tried under
    the switch does not fail later on Energon.  The plain import computes the join itself and
    needs no file.  A join written in Python (no YAML file) has no cache folder and no check.
    """
    if spec.file is None:
        return
    path = energon_join_index_path(spec, join_cache_dir(spec.file))
    if not path.is_file():
        raise DatasetError(
            format_message(
                "the join was not prepared (Energon loads a join only from its join index, and the as_energon switch does the same)",
                where=where,
                expected=str(path),
                found="no such file: the metadataset was not prepared, or a joined dataset or its excludes changed since",
                fix=f"run `energon prepare {spec.file}` (or `energon-lite prepare {spec.file}`); without the switch, the join is computed when the loader is made",
            )
        )


def _member_locations(member: JoinMember) -> np.ndarray:
    """``(n, 3)`` int64: Energon's ``(shard, byte_offset, byte_size)`` of each split index."""
    root = as_path(member.path)
    info = read_info(root)
    config = read_split_config(root, member.split_config)
    split = resolve_split(root, member.split_part, split_config=member.split_config, info=info)
    listed = {name: i for i, name in reversed(list(enumerate(config.expanded_split(member.split_part))))}
    info_position = {name: i for i, name in enumerate(info.shard_counts)}
    first: dict[int, tuple[int, int, str]] = {}  # tar_file_id -> (first split index, count, name)
    shard_listed: dict[int, int] = {}  # tar_file_id -> position in the split's list
    start = 0
    for shard in split.shards:
        first[info_position[shard.name]] = (start, shard.count, shard.name)
        shard_listed[info_position[shard.name]] = listed[shard.name]
        start += shard.count
    out = np.full((start, 3), -1, dtype=np.int64)
    db = sqlite3.connect(f"file:{_index_database(member)}?mode=ro", uri=True)
    try:
        for tar_file_id, sample_index, offset, size in db.execute("SELECT tar_file_id, sample_index, byte_offset, byte_size FROM samples"):
            found = first.get(tar_file_id)
            if found is not None:
                position = _split_position(found, sample_index, (tar_file_id, sample_index), meta_dir(root) / INDEX_SQLITE, root)
                out[position] = (shard_listed[tar_file_id], offset, size)
    except sqlite3.Error as exc:
        raise DatasetError(format_message("cannot read the sample index", where=str(meta_dir(root) / INDEX_SQLITE), found=str(exc), fix=f"re-run `energon-lite prepare {root}`")) from None
    finally:
        db.close()
    return out


@dataclass(frozen=True)
class JoinIndexFile:
    """What :func:`write_energon_join_index` did."""

    path: AnyPath
    rows: int  # rows written (joined samples)
    primary_samples: int  # samples of the primary split (excludes applied)
    missing: tuple[int, ...]  # per dataset: rows where it had no match (nonmatch: none)
    written: bool  # False: an up-to-date file was already there


def write_energon_join_index(spec: JoinSpec, cache_dir: AnyPath) -> JoinIndexFile:
    """Writes Energon's join index file for ``spec`` into ``cache_dir`` (unless it is up to date).

    The rows are this module's (:func:`join_index`: a primary sample whose key is missing fails,
    is skipped or gets ``(-1, -1, -1)`` as its dataset's ``nonmatch`` says), in the primary's
    split order.
    """
    index = join_index(spec)
    primary_keys, _ = _split_keys(spec.members[0], PLAIN)
    primary = sum(key is not None for key in primary_keys)
    missing = tuple(int((index.rows[:, m] < 0).sum()) for m in range(len(spec.members)))
    path = energon_join_index_path(spec, cache_dir)
    if path.is_file():
        return JoinIndexFile(path, len(index), primary, missing, written=False)
    table = np.full((len(index), len(spec.members), 3), -1, dtype=np.int64)
    for m, member in enumerate(spec.members):
        locations = _member_locations(member)
        column = index.rows[:, m]
        present = column >= 0
        table[present, m] = locations[column[present]]
    header = JOIN_INDEX_MAGIC + np.array([len(spec.members)], dtype="<i8").tobytes()
    cache_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, header + table.astype("<i8").tobytes())
    return JoinIndexFile(path, len(index), primary, missing, written=True)


def join_cache_dir(metadataset_file: str) -> AnyPath:
    """Energon's cache folder of a metadataset file: ``<folder>/<name>.cache``."""
    path = as_path(metadataset_file)
    return path.parent / f"{path.name}.cache"


@dataclass(frozen=True)
class PreparedJoin:
    """One join of a metadataset that :func:`prepare_metadataset_joins` prepared."""

    split_part: str
    where: str  # "file.yaml: splits.train.blend[0]"
    spec: JoinSpec
    index_file: JoinIndexFile


def prepare_metadataset_joins(path: AnyPath) -> tuple[list[PreparedJoin], list[AnyPath]]:
    """``energon prepare meta.yaml``: builds every join of every split of the metadataset.

    Each join (also in blends and in metadatasets this one references) is computed, which checks
    its ``nonmatch`` rules (``nonmatch: error`` with a missing key raises), and Energon's join
    index file is written to the cache folder of the YAML file that defines the join
    (:func:`join_cache_dir`).  Files ``join_index_*.bin`` in those folders that no join uses any
    more are removed, as Energon does.  Returns the joins and the removed files.
    """
    path = as_path(path).resolve()
    raw = check_mapping(load_structured(path), file=path, key_path="", allowed=("__module__", "__class__", "splits"), required=("splits",))
    splits = check_mapping(raw["splits"], file=path, key_path="splits", allowed=None)
    prepared: list[PreparedJoin] = []
    seen: set[tuple] = set()
    for split_part in splits:
        for leaf in load_blend_plan(path, str(split_part), training=True).leaves:
            spec = leaf.join
            if spec is None or spec.file is None or (spec.file, spec) in seen:
                continue
            seen.add((spec.file, spec))
            prepared.append(PreparedJoin(str(split_part), leaf.where, spec, write_energon_join_index(spec, join_cache_dir(spec.file))))
    used = {str(p.index_file.path) for p in prepared}
    removed: list[AnyPath] = []
    for folder in {str(join_cache_dir(p.spec.file)) for p in prepared} | {str(join_cache_dir(str(path)))}:
        cache = as_path(folder)
        if not cache.is_dir():
            continue
        for stale in sorted(cache.glob("join_index_*.bin")):
            if str(stale) not in used:
                stale.unlink()
                removed.append(stale)
    return prepared, removed
