"""``prepare``: index tar shards and write ``.nv-meta/`` the way Energon 7.4 does.

Differences from Energon, on purpose:

* Shards are scanned in parallel processes with a progress bar, and a re-run only re-scans shards
  whose size or modification time changed (rows of unchanged shards are copied from the previous
  ``index.sqlite``).  What was scanned is remembered in ``.nv-meta/.lite-prepare.json``, a file
  Energon ignores.
* Split ratios use Energon's cut points, except that the last split always ends at the last
  shard: Energon's float rounding can leave a shard in no split (7,2,1 over 10 shards gives
  7/2/0; we give 7/2/1, and the same splits as Energon wherever it loses nothing).
* Nothing is written when a duplicate key, an empty shard or a corrupt tar is found: every
  metadata file is written through a temporary file and a rename, ``.info.json`` last.  A
  previous ``index.sqlite`` that cannot be read is not an error: every shard is scanned again.
* Memory does not grow with the dataset: each shard's rows go to SQLite as soon as its scan
  arrives, and the mapped pages of a tar are released behind the parser.
* Many small shards (measured with 10,000: benchmarks/bench_prepare_many.py): the workers send
  back ready-made SQLite rows and write each new ``.tar.idx`` under a temporary name, renamed
  into place once the index is built (after one ``syncfs`` rather than an ``fsync`` per file);
  a re-run takes one ``stat`` per tar and ``.tar.idx`` (the tree walk takes none), and leaves
  ``split.yaml`` alone when it is the file the previous run wrote and would not change.  When
  the shards are the ones of the previous run, in the same order, and at most a quarter of them
  changed, the new ``index.sqlite`` is a copy of the previous one with the changed shards' rows
  replaced (their lookup indexes are kept, not rebuilt); otherwise it is built afresh, runs of
  unchanged shards copied from the previous index with one statement each.  Both hold the same
  rows, in each shard in the order a scan inserts them; only the rowids of an in-place update
  differ (its new rows come last), which no reader of ours or Energon's depends on.
* Media metadata (``media_filter``) is extracted in the same pass over each tar.  A re-prepare
  without a filter keeps the one the index was built with (Energon keeps the old tables, stale
  or not); a different filter re-scans every shard.
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import operator
import os
import random
import re
import sqlite3
import stat as stat_module
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
from braceexpand import braceexpand

from ..errors import ConfigError, DatasetError, EmptyDatasetError, format_message
from ..storage import (
    AnyPath,
    RemotePath,
    as_path,
    atomic_write_text,
    is_no_room,
    list_files,
    local_file,
    local_scratch,
    local_view,
    no_room_error,
    remove_scratch,
    remove_stale_temporaries,
    replace_with,
    temporary_basename,
    temporary_name,
)
from .media_metadata import (
    MediaFilter,
    MediaIndexWriter,
    MediaScan,
    read_media_filter,
    scan_media,
)
from .metadata import (
    INDEX_SQLITE,
    INDEX_UUID,
    META_DIR,
    SPLIT_YAML,
    DatasetInfo,
    SplitConfig,
    is_prepared,
    meta_dir,
    read_info,
    read_split_config,
    write_info,
    write_split_config,
)
from .process_pool import scan_in_order
from .split_cache import write_split_cache
from .sqlite_index import (
    DuplicateKey,
    DuplicateSampleKeyError,
    IndexMismatchError,
    SqliteIndexWriter,
)
from .tar_index import INDEX_DTYPE, index_name, write_tar_index
from .tar_reader import SampleEntry, TarMember, group_samples, iter_members

logger = logging.getLogger(__name__)

PREPARE_STATE = ".lite-prepare.json"
PREPARE_STATE_VERSION = 2  # 2: stamps are [size, version string] (mtime or ETag)
DEFAULT_SPLIT_NAMES = ("train", "val", "test")


@dataclass
class ShardScan:
    """What scanning one tar found."""

    name: str
    offsets: np.ndarray  # N+1 uint64 entries, Energon's .tar.idx content
    samples: list[SampleEntry]
    media: MediaScan | None = None


@dataclass
class PrepareResult:
    """Summary of a prepare run, for the CLI and tests."""

    root: AnyPath
    shard_counts: dict[str, int]
    scanned: list[str]  # shards that were (re-)indexed in this run
    reused: list[str]  # shards whose previous index was kept
    splits: dict[str, list[str]] = field(default_factory=dict)
    media_filter: MediaFilter | None = None
    media_entries: int = 0  # rows in media_metadata
    media_skipped: int = 0  # media parts of scanned shards that could not be parsed

    @property
    def total_samples(self) -> int:
        return sum(self.shard_counts.values())


def discover_shards(root: AnyPath, exclude: str | None = None) -> list[str]:
    """Tar paths under ``root``, relative and posix, in Energon's order."""
    return _discover(root, exclude)


def _discover(root: AnyPath, exclude: str | None, dotted: set[str] | None = None) -> list[str]:
    """:func:`discover_shards`; locally, ``dotted`` (if given) gets the folders (relative, ""
    for the root) that hold a name starting with "." (a temporary file is ``.NAME.tmp-PID``)."""
    if isinstance(root, RemotePath):  # one recursive listing
        found = [name for name in root.list_files() if name.endswith((".tar", ".tgz"))]
        # Energon sorts Path objects, i.e. component by component: "d/a/b.tar" < "d/a-c.tar".
        names = sorted(found, key=lambda n: PurePosixPath(n).parts)
    else:
        names = []
        _walk_tars(os.fspath(root), "", names, dotted)  # in that order already
    names = [n for n in names if not n.startswith(META_DIR + "/")]
    if exclude:
        pattern = _compile(exclude, "--exclude")
        names = [n for n in names if not pattern.search(n)]
    return names


def _walk_tars(folder: str, prefix: str, found: list[str], dotted: set[str] | None = None) -> None:
    """Appends the ``*.tar`` / ``*.tgz`` files under ``folder`` (names relative, ``prefix`` +
    name) to ``found``: what ``root.glob("**/*.tar")`` plus ``is_file()`` gives, from one
    ``scandir`` per folder and no ``stat`` for plain files.  As ``glob("**")``, it does not descend
    into symlinked folders and skips folders it cannot list; a symlink to a tar file counts.

    Each folder's entries are taken in name order, so the names come out in Energon's order
    (component by component) without sorting them all.  ``dotted``: see :func:`_discover`."""
    try:
        with os.scandir(folder) as listing:
            entries = sorted(listing, key=_entry_name)
    except OSError:
        return
    for entry in entries:
        name = entry.name
        try:
            if name.endswith((".tar", ".tgz")) and entry.is_file():
                found.append(prefix + name)
            elif entry.is_dir() and not entry.is_symlink():
                _walk_tars(entry.path, f"{prefix}{name}/", found, dotted)
        except OSError:
            pass
        if dotted is not None and name.startswith("."):
            dotted.add(prefix[:-1])


_entry_name = operator.attrgetter("name")


def _compile(regex: str, option: str) -> re.Pattern:
    try:
        return re.compile(regex)
    except re.error as exc:
        raise ConfigError(
            format_message(
                f"invalid regular expression for {option}",
                found=f"{regex!r} ({exc})",
                fix="pass a Python regular expression, e.g. 'shards/train/.*'",
            )
        ) from None


# While scanning, mapped pages behind the parser are handed back to the kernel every few MiB,
# so that a big tar does not count towards the process's resident memory as a whole.
_RELEASE_STEP = 8 << 20


def _release_pages(mapped: mmap.mmap, start: int, upto: int) -> int:
    """Drops the mapping's pages in ``[start, upto)`` (page-aligned) from this process; returns
    the new start.  The data stays in the page cache; a later read maps it again."""
    upto -= upto % mmap.PAGESIZE
    if upto > start and hasattr(mapped, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
        mapped.madvise(mmap.MADV_DONTNEED, start, upto - start)
        return upto
    return start


def _stream_members(mapped: mmap.mmap, where: str, found: dict[str, int]) -> Iterator[TarMember]:
    """``iter_members`` over the whole tar, without keeping the members: ``found`` gets the
    member count and the end-of-archive offset (``"end"``) once the tar is read."""
    members = iter_members(mapped, where=where, verify_checksums=True)
    released = 0
    try:
        while True:
            try:
                member = next(members)
            except StopIteration as stop:
                found["end"] = stop.value
                return
            found["members"] += 1
            if member.header_offset - released >= _RELEASE_STEP:
                released = _release_pages(mapped, released, member.header_offset)
            yield member
    finally:
        members.close()


def scan_shard(root: AnyPath, name: str, media_filter: MediaFilter | None = None) -> ShardScan:
    """Reads every header of one tar once and groups members into samples.

    With a ``media_filter``, the media parts' metadata is extracted from the same mapping.  A
    remote tar is streamed once into a temporary local file and mapped from there.
    """
    samples, offsets, media, _ = _scan(root, name, media_filter)
    return ShardScan(name, offsets, samples, media)


def _scan(
    root: AnyPath, name: str, media_filter: MediaFilter | None
) -> tuple[list[SampleEntry], np.ndarray, MediaScan | None, os.stat_result]:
    """:func:`scan_shard`'s work; also returns the tar's ``fstat`` (of the local copy remotely)."""
    path = root / name
    found = {"members": 0, "end": 0}
    with local_file(path) as local, open(local, "rb") as f:
        tar_stat = os.fstat(f.fileno())
        if tar_stat.st_size == 0:
            raise EmptyDatasetError(
                format_message(
                    "empty shard", where=str(path), fix="remove the file or re-create it"
                )
            )
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            samples = list(group_samples(_stream_members(mapped, str(path), found)))
            media = None
            if media_filter is not None and samples:
                media = scan_media(media_filter, mapped, samples, where=str(path))
    if not samples:
        raise EmptyDatasetError(
            format_message(
                "shard holds no samples",
                where=str(path),
                expected="members named KEY.PART (e.g. 000001.jpg)",
                found=f"{found['members']} regular files, none named like a sample part",
                fix="remove the shard or exclude it with --exclude",
            )
        )
    bounds = [s.offset for s in samples]
    bounds.append(found["end"])
    offsets = np.asarray(bounds, dtype=INDEX_DTYPE)
    return samples, offsets, media, tar_stat


@dataclass
class _Scanned:
    """What a worker sends back for one shard: rows ready for SQLite, nothing else per sample.

    Locally the worker has also written the shard's new ``.tar.idx`` to its temporary name
    (:func:`_pending_index`); it is renamed into place once the whole index is built.  Remotely
    ``index`` holds its bytes, uploaded at that point instead.
    """

    sample_rows: list[tuple]  # (tar_file_id, key, sample_index, byte_offset, byte_size)
    part_rows: list[tuple]  # (tar_file_id, sample_index, part, data_offset, size)
    index: bytes | None  # .tar.idx content, when not written by the worker
    tar_stamp: list | None  # [size, mtime_ns] of the tar as scanned (local only)
    index_stamp: list | None  # [size, mtime_ns] of the written temporary .tar.idx (local only)
    media: MediaScan | None


def _pending_index(root: str, name: str, owner: int) -> str:
    """Where the worker writes a shard's new ``.tar.idx`` before the rename: the temporary name
    :func:`~megatron_energon_lite.storage.temporary_name` gives, with the preparing process's id,
    so that :func:`remove_stale_temporaries` recognises leftovers of a killed run."""
    final = os.path.join(root, index_name(name))
    folder, base = os.path.split(final)
    return os.path.join(folder, temporary_basename(base, owner))


def _write_pending_index(path: str, data: bytes) -> list:
    """Writes a temporary ``.tar.idx`` (made durable later, all at once: :func:`_sync_files`)
    and returns its stamp; a full disk raises the storage error that names the file."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            written = os.fstat(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        if is_no_room(exc):
            raise no_room_error(path, exc) from None
        raise
    return [written.st_size, str(written.st_mtime_ns)]


def _scan_task(args: tuple[AnyPath, str, int, MediaFilter | None, int | None]) -> _Scanned:
    root, name, shard_id, media_filter, owner = args
    samples, offsets, media, tar_stat = _scan(root, name, media_filter)
    bounds = offsets.tolist()
    sample_rows = [(shard_id, s.key, i, bounds[i], bounds[i + 1] - bounds[i]) for i, s in enumerate(samples)]
    part_rows = [(shard_id, i, part, offset, size) for i, s in enumerate(samples) for part, offset, size in s.parts]
    data = offsets.tobytes()
    if owner is None:  # remote: the main process uploads the index after the build
        return _Scanned(sample_rows, part_rows, data, None, None, media)
    index_stamp = _write_pending_index(_pending_index(os.fspath(root), name, owner), data)
    tar_stamp = [tar_stat.st_size, str(tar_stat.st_mtime_ns)]
    return _Scanned(sample_rows, part_rows, None, tar_stamp, index_stamp, media)


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
        regexes = [_compile(p, f"--split-parts {split_name}") for p in braceexpand(pattern)]
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


def _load_prepare_state(root: AnyPath) -> dict:
    path = meta_dir(root) / PREPARE_STATE
    try:
        state = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return state if state.get("version") == PREPARE_STATE_VERSION else {}


def _stamps(root: AnyPath, names: Iterable[str]) -> dict[str, list]:
    """``[size, version]`` (mtime locally, ETag remotely) of each existing file, listed at once."""
    if isinstance(root, RemotePath):
        return {name: [stat.size, stat.version] for name, stat in list_files(root, list(names)).items()}
    # Locally: what list_files gives, from one stat per file relative to the open root folder
    # (10,000 shards: no path objects, no lookup of the root's own path per file).
    base, found = os.fspath(root), {}
    folder = os.open(base, os.O_RDONLY) if os.stat in os.supports_dir_fd else None
    try:
        for name in names:
            try:
                stat = os.stat(name, dir_fd=folder) if folder is not None else os.stat(os.path.join(base, name))
            except (FileNotFoundError, NotADirectoryError):
                continue
            if not stat_module.S_ISDIR(stat.st_mode):
                found[name] = [stat.st_size, str(stat.st_mtime_ns)]
    finally:
        if folder is not None:
            os.close(folder)
    return found


def _unchanged_shards(
    root: Path, names: Iterable[str], media_filter: MediaFilter | None, state: dict
) -> dict[str, tuple[int, int]]:
    """Shards whose tar and index are as the previous run left them -> (old shard id, count).

    The previous run's record (``state``) is trusted only if ``index.sqlite`` is the very file
    it wrote, so an interrupted run or an index rebuilt by another tool leads to a full re-scan;
    so does a media filter other than the previous run's.  One ``stat`` per tar and per
    ``.tar.idx``, compared with the record: no index file is read.
    """
    index_stamp = _stamps(root, [f"{META_DIR}/{INDEX_SQLITE}"]).get(f"{META_DIR}/{INDEX_SQLITE}")
    if not state or index_stamp is None or state.get("index_stamp") != index_stamp:
        return {}
    if media_filter is not None and state.get("media_filter") != media_filter.to_json():
        return {}
    recorded = state.get("shards", {})
    names = [name for name in names if name in recorded]
    if not isinstance(root, RemotePath):
        return _unchanged_local(os.fspath(root), names, recorded)
    stamps = _stamps(root, [n for name in names for n in (name, index_name(name))])
    unchanged = {}
    for name in names:
        entry = recorded[name]
        tar, index = stamps.get(name), stamps.get(index_name(name))
        if tar is not None and index is not None and entry["stamps"] == tar + index:
            unchanged[name] = (entry["id"], entry["count"])
    return unchanged


def _unchanged_local(base: str, names: list[str], recorded: dict) -> dict[str, tuple[int, int]]:
    """:func:`_unchanged_shards` for a local dataset: what :func:`_stamps` gives, in one loop
    without intermediate lists (10,000 shards: the ``stat`` calls themselves are most of it).
    The ``.tar.idx`` of a changed tar is not looked at."""
    stat, is_dir = os.stat, stat_module.S_ISDIR
    folder = os.open(base, os.O_RDONLY) if stat in os.supports_dir_fd else None
    prefix = "" if folder is not None else base + os.sep  # names are relative to the open folder
    unchanged = {}
    try:
        for name in names:
            entry = recorded[name]
            stamps = entry["stamps"]
            if not isinstance(stamps, list) or len(stamps) != 4:
                continue
            try:
                found = stat(prefix + name, dir_fd=folder)
                if [found.st_size, str(found.st_mtime_ns)] != stamps[:2] or is_dir(found.st_mode):
                    continue
                found = stat(prefix + _index_name(name), dir_fd=folder)
            except (FileNotFoundError, NotADirectoryError):
                continue
            if [found.st_size, str(found.st_mtime_ns)] == stamps[2:] and not is_dir(found.st_mode):
                unchanged[name] = (entry["id"], entry["count"])
    finally:
        if folder is not None:
            os.close(folder)
    return unchanged


def _index_name(name: str) -> str:
    """:func:`index_name`, with a shortcut for the usual ``x.tar`` (not a bare ``.tar``)."""
    return name + ".idx" if name.endswith(".tar") and name[-5:-4] not in ("", "/") else index_name(name)


#: A re-prepare updates a copy of the previous index when at most this share of the shards
#: changed (and every shard keeps its id), and builds a new one otherwise.  An update costs a
#: file copy plus a few B-tree changes per changed row; a build costs a copy of every row and a
#: sort per lookup index.  Index work alone, 2,000 shards x 500 samples (212 MB): update 0.26 s
#: for 1% changed, 2.5 s for 20%, 3.7 s for 30%, 6.1 s for 50%; build 4.0 to 5.7 s.  A quarter
#: stays clear of that break-even (about 40%, less with an index bigger than the page cache),
#: and a build from time to time also gives back the room that updates leave in pages.
_IN_PLACE_SHARE = 0.25
# Tables of index.sqlite that _write_media rebuilds (sqlite_sequence: media_filters' AUTOINCREMENT).
_MEDIA_TABLES = ("media_metadata", "media_filters", "sqlite_sequence")


def _update_in_place(names: list[str], unchanged: dict[str, tuple[int, int]], state: dict) -> bool:
    """Whether the new index is a copy of the previous one with the changed shards' rows
    replaced (:meth:`SqliteIndexWriter.update_copy`) rather than a new file: when every shard
    has the id it had in the previous run (the same shards in the same order) and few changed."""
    if not unchanged or len(names) - len(unchanged) > _IN_PLACE_SHARE * len(names):
        return False
    recorded = state.get("shards", {})
    if len(recorded) != len(names):
        return False
    for shard_id, name in enumerate(names):
        entry = recorded.get(name)
        if not isinstance(entry, dict) or entry.get("id") != shard_id:
            return False
    return True


def _duplicate_error(duplicates: list[DuplicateKey], names: list[str]) -> DuplicateSampleKeyError:
    return DuplicateSampleKeyError.from_duplicates(_in_shard_order(duplicates), names)


def _in_shard_order(duplicates: list[DuplicateKey]) -> list[DuplicateKey]:
    """The duplicates as a prepare that inserts every row in shard order finds them: each
    later place of a key paired with its first place, ordered by the later place.

    A full build finds them so already.  An in-place update inserts the changed shards' rows
    after the kept rows of every other shard, so it meets a key's places in another order
    (its first place may be a row it inserts later); every place is still in some pair.
    """
    places: dict[str, set[tuple[int, int]]] = {}
    for duplicate in duplicates:
        places.setdefault(duplicate.key, set()).update((duplicate.first, duplicate.again))
    ordered = []
    for key, found in places.items():
        first, *later = sorted(found)
        ordered.extend(DuplicateKey(key, first, again) for again in later)
    return sorted(ordered, key=lambda duplicate: duplicate.again)


def prepare_dataset(
    root: str | os.PathLike,
    *,
    split_ratio: Sequence[float] | None = None,
    split_parts: Sequence[tuple[str, str]] | None = None,
    exclude: str | None = None,
    num_workers: int | None = None,
    progress: bool = True,
    tar_index_only: bool = False,
    shuffle_tars: bool = False,
    force_overwrite: bool = False,
    dataset_yaml: str | None = None,
    dataset_yaml_name: str = "dataset.yaml",
    confirm_overwrite: Callable[[], bool] | None = None,
    media_filter: MediaFilter | None = None,
    shards: Sequence[str] | None = None,
) -> PrepareResult:
    """Indexes the tars under ``root`` and writes Energon-compatible metadata.

    Exactly one of ``split_ratio`` (e.g. ``(8, 1, 1)`` for train/val/test) and ``split_parts``
    (``[(name, regex), ...]``) is needed unless ``tar_index_only`` keeps the existing splits.
    ``dataset_yaml`` is the text of ``.nv-meta/<dataset_yaml_name>`` to write, if any.
    ``shards``: the tar paths (relative to ``root``) to index instead of every tar found there.
    ``media_filter`` stores media metadata (Energon's ``--media-metadata-by-*``); None keeps the
    filter of an existing index, if it has one.
    """
    root = as_path(root)
    if not root.is_dir():
        raise DatasetError(format_message("dataset folder not found", where=str(root)))
    dotted: set[str] | None = set() if shards is None and not tar_index_only else None  # see _discover
    if tar_index_only:
        if not is_prepared(root):
            raise DatasetError(
                format_message(
                    "--tar-index-only needs a prepared dataset",
                    where=str(root),
                    fix="run prepare without --tar-index-only first",
                )
            )
        names = list(read_info(root).shard_counts)
    else:
        if (split_ratio is None) == (split_parts is None):
            raise ConfigError(
                format_message(
                    "give either a split ratio or split patterns",
                    expected="--split-ratio 8,1,1 or --split-parts train:REGEX (repeatable)",
                    found="both" if split_ratio is not None else "neither",
                )
            )
        if is_prepared(root) and not force_overwrite:
            if confirm_overwrite is None or not confirm_overwrite():
                raise ConfigError(
                    format_message(
                        "the dataset is already prepared",
                        where=str(meta_dir(root)),
                        fix="pass --force-overwrite to prepare it again (unchanged shards are "
                        "not re-indexed), or --tar-index-only to keep splits and dataset.yaml",
                    )
                )
        names = [str(name) for name in shards] if shards is not None else _discover(root, exclude, dotted)
    if not names:
        raise DatasetError(
            format_message(
                "no tar files found",
                where=str(root),
                expected="*.tar files in the folder or its subfolders",
                fix="point prepare at the folder that holds the shards",
            )
        )

    # Splits first: a bad pattern must fail before any work is done.
    splits: dict[str, list[str]] = {}
    if not tar_index_only:
        if split_parts is not None:
            splits = splits_by_patterns(names, split_parts)
        else:
            splits = splits_by_ratio(names, split_ratio, shuffle=shuffle_tars)

    meta = meta_dir(root)
    meta.mkdir(exist_ok=True)
    local = not isinstance(root, RemotePath)
    base = os.fspath(root) if local else ""
    if local:  # what a killed or out-of-room prepare left behind
        folders = {name.rpartition("/")[0] for name in names}  # ~100 for 10,000 shards
        if dotted is not None:  # the walk just listed them: only where it saw a ".NAME"
            folders &= dotted
        remove_stale_temporaries({os.fspath(meta), *(os.path.join(base, folder) for folder in folders)})
    if media_filter is None:
        media_filter = read_media_filter(meta / INDEX_SQLITE)
        if media_filter is not None:
            logger.info("keeping the media metadata of %s (%s)", meta / INDEX_SQLITE, media_filter.to_json())
    state = _load_prepare_state(root)
    unchanged = _unchanged_shards(root, names, media_filter, state)

    # SQLite needs local files: the new index is built next to the old one locally (so the final
    # rename is atomic), in a temporary folder for a remote dataset (then uploaded).  Locally the
    # workers write each new .tar.idx under a temporary name; they are renamed into place only
    # once the whole index is built (and removed if it is not).
    owner = os.getpid() if local else None
    pending: set[str] = set()  # shards whose temporary .tar.idx may exist
    scratch, owned = local_scratch(meta)
    done = False
    try:
        tmp_index = temporary_name(scratch / INDEX_SQLITE)
        previous_index = local_view(meta / INDEX_SQLITE) if unchanged or media_filter is not None else None
        build = dict(num_workers=num_workers, progress=progress, media_filter=media_filter, owner=owner, pending=pending)
        try:
            try:
                in_place = _update_in_place(names, unchanged, state)
                built = _build_index(tmp_index, previous_index, root, names, unchanged, in_place=in_place, **build)
            except _UnusablePreviousIndex as exc:
                logger.warning("%s", exc)
                unchanged = {}
                built = _build_index(tmp_index, previous_index, root, names, unchanged, **build)
        except (OSError, sqlite3.OperationalError) as exc:
            if is_no_room(exc):
                raise no_room_error(tmp_index, exc) from None
            raise
        if local:
            written = {name: _pending_index(base, name, owner) for name in built.index_stamps}
            _sync_files(list(written.values()))
            for name, temporary in written.items():
                os.replace(temporary, os.path.join(base, index_name(name)))
                pending.discard(name)
        else:
            for name, data in built.index_data.items():
                write_tar_index(root / name, np.frombuffer(data, dtype=INDEX_DTYPE))
        replace_with(meta / INDEX_SQLITE, tmp_index)
        done = True
    finally:
        if not done and pending:
            for name in pending:
                _unlink_quietly(_pending_index(base, name, owner))
        remove_scratch(scratch, owned)
    counts = built.counts
    to_scan = [n for n in names if n not in unchanged]
    failures = built.media_failures
    atomic_write_text(meta / INDEX_UUID, str(uuid.uuid4()))
    split_record = _write_splits(root, splits, state) if splits else state.get("split")
    if dataset_yaml is not None:
        atomic_write_text(meta / dataset_yaml_name, dataset_yaml)
    _write_prepare_state(
        root, names, counts, media_filter, previous=state, unchanged=unchanged, scanned=built, split_record=split_record
    )
    write_info(root, DatasetInfo(shard_counts=counts))
    write_split_cache(root)  # after both files it copies: every rank then starts without parsing them
    return PrepareResult(
        root,
        counts,
        scanned=to_scan,
        reused=list(unchanged),
        splits=splits,
        media_filter=media_filter,
        media_entries=built.media_entries,
        media_skipped=len(failures),
    )


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _sync_files(paths: Sequence[str]) -> None:
    """Makes freshly written local files durable before they are renamed into place.

    A few are ``fsync``-ed one by one; many (a full prepare) by one ``syncfs`` per filesystem
    they are on (Linux): with 10,000 shards, one flush instead of 10,000 journal commits.  Where
    ``syncfs`` is missing or fails, every file is ``fsync``-ed.
    """
    syncfs = _syncfs_function() if len(paths) > _FSYNC_EACH_UP_TO else None
    if syncfs is not None:
        folders: dict[int, str] = {}
        for folder in {os.path.dirname(path) for path in paths}:
            folders.setdefault(os.stat(folder).st_dev, folder)
        synced = True
        for folder in folders.values():
            fd = os.open(folder, os.O_RDONLY)
            try:
                synced = syncfs(fd) == 0 and synced
            finally:
                os.close(fd)
        if synced:
            return
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


#: Up to this many new .tar.idx files are fsync-ed one by one, more by a syncfs.
_FSYNC_EACH_UP_TO = 64


def _syncfs_function() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None


class _UnusablePreviousIndex(DatasetError):
    """The previous ``index.sqlite`` cannot be read: its shards are scanned again instead."""


def _previous_index_error(path: Path | None, exc: Exception) -> _UnusablePreviousIndex:
    return _UnusablePreviousIndex(
        format_message(
            "the previous index cannot be read; every shard is scanned again",
            where=str(path),
            expected="a readable SQLite index written by prepare",
            found=f"{type(exc).__name__}: " + " ".join(str(exc).split()),
        )
    )


@dataclass
class _Built:
    """What building the new index produced besides the file itself."""

    counts: dict[str, int]  # samples per shard, in shard order
    index_data: dict[str, bytes] = field(default_factory=dict)  # remote: .tar.idx of each scanned shard
    index_stamps: dict[str, list] = field(default_factory=dict)  # local: stamp of each new temporary .tar.idx
    tar_stamps: dict[str, list] = field(default_factory=dict)  # local: stamp of each scanned tar
    media_entries: int = 0
    media_failures: list[str] = field(default_factory=list)


def _build_index(
    tmp_index: Path,
    previous_index: Path | None,
    root: AnyPath,
    names: list[str],
    unchanged: dict[str, tuple[int, int]],
    *,
    num_workers: int | None,
    progress: bool,
    media_filter: MediaFilter | None,
    owner: int | None,
    pending: set[str],
    in_place: bool = False,
) -> _Built:
    """Scans the changed shards and writes the new index, one shard at a time.

    Each scan's rows go to SQLite as soon as it arrives and nothing of it is kept but its stamps
    (and, remotely, its .tar.idx bytes) and media rows, so memory does not grow with the
    dataset's sample count.  ``owner``: the process id in the temporary .tar.idx names that the
    workers write (None remotely); ``pending`` collects the shards that may have one.
    ``in_place``: update a copy of the previous index instead of building a new one.
    """
    to_scan = [n for n in names if n not in unchanged]
    if owner is not None:
        pending.update(to_scan)
    ids = {name: shard_id for shard_id, name in enumerate(names)}
    jobs = [(root, name, ids[name], media_filter, owner) for name in to_scan]
    scans = scan_in_order(_scan_task, jobs, num_workers=num_workers, progress=progress, desc="Indexing shards", unit="shard")
    try:
        built, media = _write_index(tmp_index, previous_index, names, scans, unchanged, in_place=in_place, media_filter=media_filter)
    finally:
        scans.close()
    built.media_failures = [f for scan in media.values() for f in scan.failures]
    for failure in built.media_failures:
        logger.warning("%s", failure)
    built.media_entries = _write_media(tmp_index, previous_index, media_filter, names, media, unchanged)
    return built


def _write_index(
    tmp_index: Path,
    previous_index: Path | None,
    names: list[str],
    scans: Iterator[_Scanned],
    unchanged: dict[str, tuple[int, int]],
    *,
    in_place: bool,
    media_filter: MediaFilter | None,
) -> tuple[_Built, dict[str, MediaScan]]:
    """Writes the samples table of the new index from ``scans`` (the changed shards, in order).

    With ``in_place`` (every shard keeps its id, few changed: :func:`_update_in_place`), the new
    index is a copy of the previous one without the changed shards' rows, plus their new rows.
    Otherwise it is built afresh, and runs of consecutive unchanged shards are copied from the
    previous index with one statement per table and run.
    """
    writer = None
    if in_place:
        # The media tables are rebuilt by _write_media; any other object means rebuild.
        media_tables = _MEDIA_TABLES if media_filter is not None else ()
        keep = dict(unchanged.values())
        try:
            writer = SqliteIndexWriter.update_copy(tmp_index, previous_index, keep=keep, shard_count=len(names), other_tables=media_tables)
        except (sqlite3.DatabaseError, IndexMismatchError) as exc:
            raise _previous_index_error(previous_index, exc) from None
    rebuild = writer is None  # a new file, unchanged shards' rows copied from the previous one
    if rebuild:
        writer = SqliteIndexWriter(tmp_index, scratch=True)
    duplicates: list[DuplicateKey] = []
    built = _Built(counts={})
    media: dict[str, MediaScan] = {}
    run: list = []  # [old first id, new first id, [counts]]: unchanged shards not yet copied

    def copy_run() -> None:
        if run:
            old_first, new_first, counts = run
            try:
                duplicates.extend(writer.copy_shards(old_first, new_first, counts))
            except (sqlite3.DatabaseError, IndexMismatchError) as exc:
                raise _previous_index_error(previous_index, exc) from None
            run.clear()

    try:
        if unchanged and rebuild:
            try:
                writer.attach_previous(previous_index)
            except sqlite3.Error as exc:
                raise _previous_index_error(previous_index, exc) from None
        for shard_id, name in enumerate(names):
            if name in unchanged and not rebuild:  # its rows are in the copy already
                built.counts[name] = unchanged[name][1]
            elif name in unchanged:
                old_id, built.counts[name] = unchanged[name]
                if run and run[0] + len(run[2]) == old_id and run[1] + len(run[2]) == shard_id:
                    run[2].append(built.counts[name])
                else:
                    copy_run()
                    run.extend((old_id, shard_id, [built.counts[name]]))
            else:
                copy_run()
                scan = next(scans)
                duplicates.extend(writer.add_rows(scan.sample_rows, scan.part_rows))
                built.counts[name] = len(scan.sample_rows)
                if scan.index is not None:
                    built.index_data[name] = scan.index
                else:
                    built.index_stamps[name] = scan.index_stamp
                    built.tar_stamps[name] = scan.tar_stamp
                if scan.media is not None:
                    media[name] = scan.media
                del scan  # the rows of one shard at a time
        copy_run()
        if duplicates:
            raise _duplicate_error(duplicates, names)
        writer.finish()
    except BaseException:
        writer.abort()
        raise
    return built, media


def _write_media(
    index: Path,
    previous: Path | None,
    media_filter: MediaFilter | None,
    names: list[str],
    media: dict[str, MediaScan],
    unchanged: dict[str, tuple[int, int]],
) -> int:
    """Adds the media tables to the new index: fresh rows, and copies for unchanged shards."""
    if media_filter is None:
        return 0
    writer = MediaIndexWriter(index)
    try:
        if previous is not None:
            try:
                writer.copy_shards(previous, [unchanged[n][0] for n in names if n in unchanged])
            except sqlite3.DatabaseError as exc:
                raise _previous_index_error(previous, exc) from None
        for name in names:
            if name in media:
                writer.add(media[name].rows)
    except BaseException:
        writer.abort()
        raise
    return writer.finish(media_filter)


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
    digest = hashlib.sha256(json.dumps([splits, exclude]).encode()).hexdigest()
    if not ours or record.get("digest") != digest:
        write_split_config(root, SplitConfig(split_parts=splits, exclude=exclude))
        stamp = _stamps(root, [split_name]).get(split_name)
    return {"stamp": stamp, "digest": digest, "exclude": exclude}


def _write_prepare_state(
    root: AnyPath,
    names: list[str],
    counts: dict[str, int],
    media_filter: MediaFilter | None,
    *,
    previous: dict,
    unchanged: dict[str, tuple[int, int]],
    scanned: _Built,
    split_record: dict | None,
) -> None:
    """Records what this run indexed: the stamps of each tar and .tar.idx, to compare next time.

    Locally no file is listed again: an unchanged shard keeps the stamps it was found with, a
    scanned one gets those its worker took (of the tar as it was read, of the .tar.idx it wrote).
    """
    sqlite_name = f"{META_DIR}/{INDEX_SQLITE}"
    recorded = previous.get("shards", {}) if unchanged else {}
    if isinstance(root, RemotePath):
        stamps = _stamps(root, [n for name in names for n in (name, index_name(name))])
        shard_stamps = {name: stamps[name] + stamps[index_name(name)] for name in names}
    else:
        shard_stamps = {
            name: recorded[name]["stamps"] if name in unchanged else scanned.tar_stamps[name] + scanned.index_stamps[name]
            for name in names
        }
    shards = {
        name: {"id": shard_id, "count": counts[name], "stamps": shard_stamps[name]}
        for shard_id, name in enumerate(names)
    }
    state = {
        "version": PREPARE_STATE_VERSION,
        "index_stamp": _stamps(root, [sqlite_name])[sqlite_name],
        "shards": shards,
        "media_filter": media_filter.to_json() if media_filter is not None else None,
        "split": split_record,
    }
    # No indent: the C encoder (json's indented output is pure Python, slow for 10,000 shards).
    atomic_write_text(meta_dir(root) / PREPARE_STATE, json.dumps(state, separators=(",", ":")))
