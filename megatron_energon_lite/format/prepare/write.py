"""Writing the outputs: ``index.sqlite`` built from the scans (and the previous index), the new
``.tar.idx`` files made durable and put in place, then the rest of ``.nv-meta/``."""

from __future__ import annotations

import logging
import os
import sqlite3
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from ...errors import DatasetError, format_message
from ...storage import (
    AnyPath,
    RemotePath,
    atomic_write_text,
    local_scratch,
    local_view,
    remove_scratch,
    remove_own_temporaries,
    reporting_no_room,
    replace_with,
)
from ..media_metadata import MediaFilter, MediaIndexWriter, MediaScan
from ..metadata import INDEX_SQLITE, INDEX_UUID, DatasetInfo, write_info
from ..process_pool import scan_in_order
from ..split_cache import write_split_cache
from ..sqlite_index import DuplicateKey, DuplicateSampleKeyError, IndexMismatchError, SqliteIndexWriter
from ..tar_index import INDEX_DTYPE, index_name, write_tar_index
from .incremental import _update_in_place, _write_prepare_state
from .scan import _Scanned, _scan_task
from .splits import _write_splits

# The package's name, the one prepare's log records had when it was a single module.
logger = logging.getLogger(__package__)

#: Scans of the changed shards, in order, from the jobs of :func:`~.scan._scan_task`.
ShardScans = Callable[[list[tuple]], Iterator[_Scanned]]

# Tables of index.sqlite that _write_media rebuilds (sqlite_sequence: media_filters' AUTOINCREMENT).
_MEDIA_TABLES = ("media_metadata", "media_filters", "sqlite_sequence")


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
    index_temporaries: dict[str, str] = field(default_factory=dict)  # local: where each was written
    tar_stamps: dict[str, list] = field(default_factory=dict)  # local: stamp of each scanned tar
    media_entries: int = 0
    media_failures: list[str] = field(default_factory=list)


def _build_and_install(
    root: AnyPath,
    meta: AnyPath,
    names: list[str],
    unchanged: dict[str, tuple[int, int]],
    state: dict,
    *,
    num_workers: int | None,
    progress: bool,
    media_filter: MediaFilter | None,
    shard_scans: ShardScans | None = None,
) -> tuple[_Built, dict[str, tuple[int, int]]]:
    """Builds the new ``index.sqlite`` and puts it and the new ``.tar.idx`` files in place.
    Returns what the build produced and the shards it kept (none when the previous index turned
    out to be unreadable: then every shard was scanned).

    SQLite needs local files: the new index is built next to the old one locally (so the final
    rename is atomic), in a temporary folder for a remote dataset (then uploaded).  Locally the
    workers write each new .tar.idx under a temporary name; they are renamed into place only
    once the whole index is built (and removed if it is not).  ``shard_scans``: see
    :func:`_build_index`.
    """
    local = not isinstance(root, RemotePath)
    base = os.fspath(root) if local else ""
    owner = os.getpid() if local else None
    pending: set[str] = set()  # shards whose temporary .tar.idx may exist
    scratch = local_scratch(meta / INDEX_SQLITE)
    done = False
    try:
        tmp_index = scratch / INDEX_SQLITE
        previous_index = local_view(meta / INDEX_SQLITE) if unchanged or media_filter is not None else None
        build = dict(num_workers=num_workers, progress=progress, media_filter=media_filter, owner=owner, pending=pending, shard_scans=shard_scans)
        with reporting_no_room(meta / INDEX_SQLITE):
            try:
                in_place = _update_in_place(names, unchanged, state)
                built = _build_index(tmp_index, previous_index, root, names, unchanged, in_place=in_place, **build)
            except _UnusablePreviousIndex as exc:
                logger.warning("%s", exc)
                unchanged = {}
                built = _build_index(tmp_index, previous_index, root, names, unchanged, **build)
        _install_tar_indexes(root, base, built, pending)
        replace_with(meta / INDEX_SQLITE, tmp_index)
        done = True
    finally:
        if not done and pending:  # the workers' temporary .tar.idx files
            remove_own_temporaries({os.path.dirname(os.path.join(base, index_name(name))) for name in pending}, owner)
        remove_scratch(scratch)
    return built, unchanged


def _install_tar_indexes(root: AnyPath, base: str, built: _Built, pending: set[str]) -> None:
    """Puts the scanned shards' new ``.tar.idx`` files in place: locally the temporaries the
    workers wrote, made durable and renamed (each leaves ``pending`` once renamed); remotely
    uploaded from the bytes the workers sent back."""
    if not isinstance(root, RemotePath):
        _sync_files(list(built.index_temporaries.values()))
        for name, temporary in built.index_temporaries.items():
            os.replace(temporary, os.path.join(base, index_name(name)))
            pending.discard(name)
    else:
        for name, data in built.index_data.items():
            write_tar_index(root / name, np.frombuffer(data, dtype=INDEX_DTYPE))


def _write_metadata(
    root: AnyPath,
    meta: AnyPath,
    names: list[str],
    built: _Built,
    *,
    splits: dict[str, list[str]],
    state: dict,
    unchanged: dict[str, tuple[int, int]],
    media_filter: MediaFilter | None,
    dataset_yaml: str | None,
    dataset_yaml_name: str,
) -> None:
    """Writes the rest of ``.nv-meta/`` once the index is in place, each file through a temporary
    and a rename: a new index UUID, ``split.yaml`` (when there are ``splits``: not with
    ``tar_index_only``), the dataset YAML if given, the prepare state, ``.info.json``, and the
    split cache made from it and ``split.yaml``."""
    atomic_write_text(meta / INDEX_UUID, str(uuid.uuid4()))
    split_record = _write_splits(root, splits, state) if splits else state.get("split")
    if dataset_yaml is not None:
        atomic_write_text(meta / dataset_yaml_name, dataset_yaml)
    _write_prepare_state(
        root,
        names,
        built.counts,
        media_filter,
        previous=state,
        unchanged=unchanged,
        tar_stamps=built.tar_stamps,
        index_stamps=built.index_stamps,
        split_record=split_record,
    )
    write_info(root, DatasetInfo(shard_counts=built.counts))
    write_split_cache(root)  # after both files it copies: every rank then starts without parsing them


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
    shard_scans: ShardScans | None = None,
    in_place: bool = False,
) -> _Built:
    """Scans the changed shards and writes the new index, one shard at a time.

    Each scan's rows go to SQLite as soon as it arrives and nothing of it is kept but its stamps
    (and, remotely, its .tar.idx bytes) and media rows, so memory does not grow with the
    dataset's sample count.  ``owner``: the process id in the temporary .tar.idx names that the
    workers write (None remotely); ``pending`` collects the shards that may have one.
    ``in_place``: update a copy of the previous index instead of building a new one.
    ``shard_scans``: where the scans come from, given the jobs of :func:`~.scan._scan_task` (the
    changed shards, in order); None scans them in a process pool.
    """
    to_scan = [n for n in names if n not in unchanged]
    if owner is not None:
        pending.update(to_scan)
    ids = {name: shard_id for shard_id, name in enumerate(names)}
    jobs = [(root, name, ids[name], media_filter, owner) for name in to_scan]
    if shard_scans is None:
        scans = scan_in_order(_scan_task, jobs, num_workers=num_workers, progress=progress, desc="Indexing shards", unit="shard")
    else:
        scans = shard_scans(jobs)
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

    With ``in_place`` (every shard keeps its id, few changed:
    :func:`~.incremental._update_in_place`), the new index is a copy of the previous one without
    the changed shards' rows, plus their new rows.
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
                    built.index_temporaries[name] = scan.temporary
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
