"""``prepare-media``: media metadata for a plain folder of files (what ``aux:`` folders read).

Writes what Energon 7.4's ``energon prepare-media FOLDER`` writes, and nothing else Energon
reads: ``FOLDER/.nv-meta/index.sqlite`` with the two media tables of
:mod:`~megatron_energon_lite.format.media_metadata` (no sample tables, no ``.info.json``: that is
how Energon tells a folder from a prepared tar dataset).  One ``media_metadata`` row per media
file, keyed by its path relative to the folder with ``/`` separators (``"sub/b.JPG"``), and one
``media_filters`` row for the filter.  Files are chosen as Energon chooses them: every file under
the folder, hidden ones included, except what lies in a ``.nv-meta`` folder; by extension, by
glob (matched against the file name, as Energon does, or against the relative path) or by
header.  A file that cannot be decoded gets no row.

Differences from Energon, on purpose:

* Files are read in parallel processes with a progress bar, and a re-run reads only files whose
  size or modification time changed, or that are new; rows of unchanged files are copied from the
  previous index and rows of removed files are dropped (Energon re-reads every file and keeps the
  rows of removed ones).  What was read is remembered in ``.nv-meta/.lite-prepare-media.json``,
  a file Energon ignores; it is trusted only while ``index.sqlite`` is the file it describes and
  the filter is the same, otherwise every file is read again.
* The index is built in a temporary file and renamed into place (uploaded in one PUT on object
  storage), so an interrupted run leaves the previous index; ``media_filters`` holds the filter
  of this run only.
* A file that cannot be decoded is logged with its path and counted, not fatal (Energon logs at
  debug level, or its worker dies and the run hangs); symlinks that point outside the folder,
  and dangling ones, are not followed (Energon follows every link).
* ``--media-metadata-by-glob`` and ``--media-metadata-by-header`` work (in Energon 7.4.1 a
  worker fails on the first matching file and the run hangs).

A folder on object storage (``s3://bucket/prefix``, any URL of :func:`~megatron_energon_lite.storage.as_path`)
is prepared in place and gets the same rows as a local copy of it.  Its files are found with one
recursive listing and told apart by size and ETag (instead of size and modification time); a
worker copies each file it reads to a local temporary file in ranged GETs of a few MiB (retried,
so a large video is never held in memory; by header only the first 64 bytes are fetched first)
and reads it there.  A request that still fails after its retries stops the run (the file is not
recorded as undecodable, so the next run reads it again).  The index is built in a local
temporary folder (``tmp_path``) and uploaded in one write; the previous one is read from a cached
local copy.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

from ...errors import (
    ConfigError,
    DatasetError,
    EmptyDatasetError,
    MissingDependencyError,
    StorageError,
    format_message,
)
from ...format.media_metadata import (
    MediaFilter,
    MediaIndexWriter,
    MediaRow,
    MediaStrategy,
    extract_metadata_of_file,
    read_media_filter,
)
from ...format.metadata import INDEX_SQLITE, META_DIR, is_prepared
from ...format.process_pool import scan_in_order
from ...format.safe_parse import parse_json
from ...storage import (
    AnyPath,
    RemotePath,
    as_path,
    atomic_write_text,
    cached_copy,
    file_stat,
    local_scratch,
    remove_scratch,
    remove_stale_temporaries,
    reporting_no_room,
)
from ...storage.remote import fetch_range, refresh_session

__all__ = ["MediaPrepareResult", "prepare_filesystem_dataset", "prepare_media_folder"]

logger = logging.getLogger(__name__)

STATE_FILE = ".lite-prepare-media.json"
STATE_VERSION = 1

# What reading one file found (the last field of a state entry).
_ROW = "row"  # a media_metadata row
_NOT_MEDIA = "none"  # not media under the filter (only by header: the name alone does not tell)
_FAILED = "failed"  # media that cannot be decoded

# Tables a folder's index may hold; any other means it is a tar dataset's sample index.
_MEDIA_TABLES = {"media_metadata", "media_filters", "sqlite_sequence"}
_ROWS_PER_WRITE = 1000

# Reading a remote file: bytes fetched first to tell its type by header, then pieces of this size.
_HEAD_BYTES = 64
_FETCH_PIECE = 8 << 20


@dataclass
class MediaPrepareResult:
    """Summary of a ``prepare-media`` run, for the CLI and tests."""

    root: AnyPath
    media_filter: MediaFilter
    index: AnyPath  # the index.sqlite written
    files: int  # media files found (candidates under the filter)
    scanned: list[str]  # files read in this run
    reused: list[str]  # unchanged files whose previous result was kept
    removed: list[str]  # files of the previous run that are gone (their rows were dropped)
    entries: int  # rows in media_metadata
    skipped: list[str] = field(default_factory=list)  # files that cannot be decoded
    failures: list[str] = field(default_factory=list)  # messages for the files of ``skipped`` read now
    ignored: list[str] = field(default_factory=list)  # symlinks not followed, folders not readable


@dataclass(frozen=True)
class _Listed:
    rel: str  # path relative to the folder, "/" separators: the entry key
    name: str  # what the filter matches: the file name, or ``rel`` for a glob naming folders
    stamp: tuple[int, int | str]  # size, and mtime in ns (local) or version/ETag (remote)


@dataclass(frozen=True)
class _FileScan:
    rel: str
    outcome: str  # _ROW, _NOT_MEDIA or _FAILED
    metadata_type: str | None = None
    metadata_json: str | None = None
    failure: str | None = None


def prepare_filesystem_dataset(
    root_path: Any,
    media_filter: MediaFilter | None,
    *,
    progress: bool,
    workers: int = 16,
    index_sqlite_tmp_path: Path | None = None,
) -> int:
    """Energon's function: stores the metadata of the media files under ``root_path`` in
    ``root_path/.nv-meta/index.sqlite`` and returns the number of entries.

    ``index_sqlite_tmp_path`` is, as in Energon, the local file a remote folder's index is built
    in before the upload: here the build happens in a temporary folder inside the folder that
    holds it.  Local folders ignore it, as there.  See :func:`prepare_media_folder` for the
    details of a run.
    """
    tmp_path = None if index_sqlite_tmp_path is None else Path(index_sqlite_tmp_path).parent
    return prepare_media_folder(root_path, media_filter, progress=progress, num_workers=workers, tmp_path=tmp_path).entries


def prepare_media_folder(
    root: Any,
    media_filter: MediaFilter | None,
    *,
    progress: bool = True,
    num_workers: int | None = None,
    tmp_path: Path | None = None,
) -> MediaPrepareResult:
    """Stores the metadata of the media files under ``root`` (incrementally, in parallel).

    ``tmp_path``: for a folder on object storage, the local folder to build the index and hold
    the files being read in (a temporary folder inside it, removed at the end; created when
    missing); by default a new temporary folder.  Local folders ignore it.
    """
    root = _check_root(root)
    remote = isinstance(root, RemotePath)
    media_filter = _check_filter(root, media_filter)
    meta = root / META_DIR
    index = meta / INDEX_SQLITE
    if remote:
        # One look at the remote index: its version decides whether the state holds, and the
        # cached local copy of that version is what is checked and copied from.
        index_stat = file_stat(index)
        previous = None if index_stat is None else cached_copy(index, index_stat)
        index_stamp = None if index_stat is None else [index_stat.size, index_stat.version]
    else:
        previous = index
    _check_previous_index(root, index, previous)

    listed, ignored = _list_remote_files(root, media_filter) if remote else _list_files(root, media_filter)
    for message in ignored:
        logger.warning("%s", message)
    if not listed:
        raise EmptyDatasetError(
            format_message(
                "no media files found to process",
                where=str(root),
                expected=f"files selected by {_describe(media_filter)} (searched in every subfolder "
                f"except {META_DIR})",
                fix="check the folder, or choose another --media-metadata-by-... option",
            )
        )

    meta.mkdir(exist_ok=True)  # nothing to do on object storage
    if not remote:
        remove_stale_temporaries([meta])  # what a killed run left
        index_stamp = _stamp(index)
    state = _load_state(meta, index_stamp, media_filter)
    reused = {f.rel: state[f.rel][2] for f in listed if f.rel in state and tuple(state[f.rel][:2]) == f.stamp}
    removed = sorted(set(state) - {f.rel for f in listed})

    with reporting_no_room(index):  # SQLite's "database or disk is full" too
        scratch = _make_scratch(tmp_path) if remote else local_scratch(index)
        tmp = scratch / INDEX_SQLITE
        try:
            writer, reused = _start_index(tmp, previous, index, reused)
            try:
                to_scan = [f for f in listed if f.rel not in reused]
                outcomes = dict(reused)
                failures: list[str] = []
                for rel in sorted(rel for rel, outcome in reused.items() if outcome == _FAILED):
                    logger.warning("no media metadata for %r: it could not be decoded in an earlier run and has not changed since", rel)
                rows: list[MediaRow] = []
                scans = _scan_all(root, to_scan, media_filter, num_workers=num_workers, progress=progress, scratch=scratch)
                for scan in scans:
                    outcomes[scan.rel] = scan.outcome
                    if scan.outcome == _ROW:
                        rows.append(MediaRow(scan.rel, scan.metadata_type, scan.metadata_json))
                        if len(rows) >= _ROWS_PER_WRITE:
                            writer.add(rows)
                            rows.clear()
                    elif scan.outcome == _FAILED:
                        logger.warning("%s", scan.failure)
                        failures.append(scan.failure)
                writer.add(rows)
            except BaseException:
                writer.abort()
                raise
            entries = writer.finish(media_filter)
            if remote:
                refresh_session(index)  # the scan's forked workers shared this process's connections
                index.upload(tmp)  # one write: the object is replaced whole
            else:
                os.replace(tmp, index)
        finally:
            remove_scratch(scratch)
    if not remote:
        _copy_permissions(root, meta, index)
    _write_state(meta, index, media_filter, listed, outcomes)
    return MediaPrepareResult(
        root=root,
        media_filter=media_filter,
        index=index,
        files=len(listed),
        scanned=[f.rel for f in to_scan],
        reused=sorted(reused),
        removed=removed,
        entries=entries,
        skipped=sorted(rel for rel, outcome in outcomes.items() if outcome == _FAILED),
        failures=failures,
        ignored=ignored,
    )


def _make_scratch(tmp_path: Path | None) -> Path:
    """A new local folder for a remote folder's index build and the files being read."""
    if tmp_path is not None:
        try:
            Path(tmp_path).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(
                format_message(
                    "the local folder for building the index cannot be made",
                    where=str(tmp_path),
                    found=f"{type(exc).__name__}: {exc}",
                    fix="give --tmp-path a writable local folder",
                )
            ) from None
    return Path(tempfile.mkdtemp(prefix="energon-lite-media-", dir=tmp_path))


# ---------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------


def _check_root(root: Any) -> AnyPath:
    path = as_path(root)
    if isinstance(path, RemotePath):
        try:
            found, is_dir = True, path.stat().is_dir
        except FileNotFoundError:
            found, is_dir = False, False
    else:
        found = path.exists()
        is_dir = found and path.is_dir()
    if not found:
        raise DatasetError(
            format_message(
                "folder not found",
                where=str(path),
                expected="a folder of media files (images, audio, video)",
                fix="check the path",
            )
        )
    if not is_dir:
        raise DatasetError(
            format_message(
                "prepare-media takes a folder of media files",
                where=str(path),
                expected="a folder",
                found="a file",
                fix="give the folder that holds the media files; tar shards and .jsonl files are "
                "prepared with `energon-lite prepare`",
            )
        )
    if is_prepared(path):
        raise ConfigError(
            format_message(
                "this folder is a prepared tar dataset, not a plain folder of media files",
                where=str(path),
                fix=f"run `energon-lite prepare-media {path} --media-metadata-by-...` on the command "
                "line (it adds media metadata to the tar dataset's index), or "
                "`energon-lite prepare --tar-index-only` after preparing with --media-metadata-by-...",
            )
        )
    return path


def _check_filter(root: AnyPath, media_filter: MediaFilter | None) -> MediaFilter:
    if media_filter is not None:
        return media_filter
    try:
        recorded = read_media_filter(root / META_DIR / INDEX_SQLITE)
    except DatasetError:
        recorded = None
    fix = "pass exactly one of them"
    if recorded is not None:
        fix += f"; the existing index was built {_describe(recorded)}"
    raise ConfigError(
        format_message(
            "no media filter chosen",
            where=str(root),
            expected="one of --media-metadata-by-extension, --media-metadata-by-glob PATTERNS, "
            "--media-metadata-by-header (Energon also requires one)",
            fix=fix,
        )
    )


def _describe(media_filter: MediaFilter) -> str:
    if media_filter.strategy is MediaStrategy.GLOB:
        return f"with --media-metadata-by-glob '{media_filter.patterns_text}'"
    return f"with --media-metadata-by-{media_filter.strategy.value.lower()}"


def _check_previous_index(root: AnyPath, index: AnyPath, local: Path | None) -> None:
    """Refuses to replace an index.sqlite that holds more than media metadata.

    ``local`` is the index itself for a local folder, its cached local copy (None when there
    is none) for a remote one.
    """
    if local is None or not local.is_file():
        return
    try:
        db = sqlite3.connect(f"file:{local}?mode=ro", uri=True)
        try:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            db.close()
    except sqlite3.DatabaseError:
        return  # unreadable: it is rebuilt
    other = sorted(tables - _MEDIA_TABLES)
    if other:
        raise DatasetError(
            format_message(
                "the folder's index.sqlite holds more than media metadata; prepare-media would replace it",
                where=str(index),
                expected="an index with only the media_metadata and media_filters tables",
                found="tables " + ", ".join(other),
                fix=f"if {root} is a tar dataset, prepare it with `energon-lite prepare "
                "--media-metadata-by-...`; otherwise move the file away",
            )
        )


# ---------------------------------------------------------------------------------------------
# Listing
# ---------------------------------------------------------------------------------------------


def _filter_name(media_filter: MediaFilter, rel: str) -> str | None:
    """The name the filter selects the file by (its file name first, as Energon), or None."""
    base = rel.rsplit("/", 1)[-1]
    if media_filter.wants(base):
        return base
    if media_filter.strategy is MediaStrategy.GLOB and media_filter.wants(rel):
        return rel
    return None


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _list_files(root: Path, media_filter: MediaFilter) -> tuple[list[_Listed], list[str]]:
    """The files the filter may select, sorted by relative path, and what was not followed.

    Every folder is walked once, by its real path (a chain of folders each holding two symlinks
    to the next would otherwise be walked 2^N times): a symlinked folder inside the root is not
    walked again (its files are listed under the folder's own path), one pointing outside is not
    followed, and a folder met twice (a bind mount) is walked once.  A symlink to a file inside
    the root is listed under its own name.  ``.nv-meta`` folders are not entered.
    """
    real_root = os.path.realpath(root)
    listed: list[_Listed] = []
    ignored: list[str] = []
    walked: set[tuple[int, int]] = set()  # (device, inode) of each folder walked

    def add(rel: str, path: str) -> None:
        name = _filter_name(media_filter, rel)
        if name is None:
            return
        try:
            st = os.stat(path)
        except OSError as exc:
            ignored.append(f"not readable, ignored: {rel} ({exc.strerror or exc})")
            return
        listed.append(_Listed(rel, name, (st.st_size, st.st_mtime_ns)))

    folders = [(str(root), "")]  # a stack, not recursion: folders may nest thousands deep
    while folders:
        folder, prefix = folders.pop()
        try:
            st = os.stat(folder)
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            ignored.append(f"folder not readable, ignored: {prefix or '.'} ({exc.strerror or exc})")
            continue
        if (st.st_dev, st.st_ino) in walked:
            ignored.append(f"folder reached a second time (a bind mount?), walked once: {prefix or '.'}")
            continue
        walked.add((st.st_dev, st.st_ino))
        for entry in entries:
            rel = prefix + entry.name
            if entry.is_symlink():
                target = os.path.realpath(entry.path)
                if not _inside(target, real_root):
                    ignored.append(f"symlink pointing outside the folder, not followed: {rel} -> {target}")
                elif any(part == META_DIR for part in Path(os.path.relpath(target, real_root)).parts):
                    continue
                elif os.path.isdir(target):
                    ignored.append(f"symlinked folder not walked again: {rel} -> {os.path.relpath(target, real_root)} (its files are listed under that path)")
                elif os.path.isfile(target):
                    add(rel, entry.path)
                else:
                    ignored.append(f"dangling symlink, ignored: {rel} -> {target}")
            elif entry.is_dir(follow_symlinks=False):
                if entry.name != META_DIR:
                    folders.append((entry.path, rel + "/"))
            elif entry.is_file(follow_symlinks=False):
                add(rel, entry.path)
    listed.sort(key=lambda f: f.rel)
    return listed, ignored


def _list_remote_files(root: RemotePath, media_filter: MediaFilter) -> tuple[list[_Listed], list[str]]:
    """As :func:`_list_files` for a folder on object storage: one recursive listing, files
    stamped with their size and version (ETag); nothing under a ``.nv-meta`` folder."""
    listed = []
    for rel, stat in root.list_files().items():
        if META_DIR in rel.split("/")[:-1]:
            continue
        name = _filter_name(media_filter, rel)
        if name is not None:
            listed.append(_Listed(rel, name, (stat.size, stat.version)))
    listed.sort(key=lambda f: f.rel)
    return listed, []


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------


def _scan_file(root: Path, listed: _Listed, media_filter: MediaFilter) -> _FileScan:
    """Reads one file: its metadata row, or why it has none."""
    path = root / listed.rel
    try:
        head = b""
        if media_filter.strategy is not MediaStrategy.EXTENSION:
            with open(path, "rb") as file:
                head = file.read(_HEAD_BYTES)
        media_type = media_filter.media_type(listed.name, head)
        if media_type is None:
            return _FileScan(listed.rel, _NOT_MEDIA)
        values = extract_metadata_of_file(media_type, path)
    except MissingDependencyError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure to read or parse means "no metadata"
        return _failed(listed, path, exc)
    return _FileScan(listed.rel, _ROW, media_type, json.dumps(values, separators=(",", ":")))


def _scan_remote_file(root: RemotePath, listed: _Listed, media_filter: MediaFilter, scratch: Path) -> _FileScan:
    """:func:`_scan_file` of a file on object storage: copied to a local temporary file in
    ranged GETs of :data:`_FETCH_PIECE` bytes (never held whole in memory), read there, removed.

    A request that fails after its retries (:class:`StorageError`) stops the run: it says
    nothing about the file, and recording the file as undecodable would keep it from being read
    again.  A file that is gone or may not be read is recorded as a local one would be.
    """
    path = root / listed.rel
    size = int(listed.stamp[0])
    try:
        head = b""
        if media_filter.strategy is not MediaStrategy.EXTENSION and size:
            head = fetch_range(path, 0, min(_HEAD_BYTES, size))
    except (FileNotFoundError, PermissionError) as exc:
        return _failed(listed, path, exc)
    try:
        media_type = media_filter.media_type(listed.name, head)
    except Exception as exc:  # noqa: BLE001 - as in _scan_file
        return _failed(listed, path, exc)
    if media_type is None:
        return _FileScan(listed.rel, _NOT_MEDIA)
    fd, local = tempfile.mkstemp(prefix=".media-", suffix=PurePosixPath(listed.rel).suffix, dir=scratch)
    try:
        try:
            with reporting_no_room(local), os.fdopen(fd, "wb") as file:
                file.write(head)
                for start in range(len(head), size, _FETCH_PIECE):
                    file.write(fetch_range(path, start, min(size, start + _FETCH_PIECE)))
        except (FileNotFoundError, PermissionError) as exc:  # the object (not the local copy)
            return _failed(listed, path, exc)
        try:
            values = extract_metadata_of_file(media_type, local)
        except MissingDependencyError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure to parse means "no metadata"
            return _failed(listed, path, exc)
    finally:
        try:
            os.unlink(local)
        except FileNotFoundError:
            pass
    return _FileScan(listed.rel, _ROW, media_type, json.dumps(values, separators=(",", ":")))


def _failed(listed: _Listed, path: AnyPath, exc: BaseException) -> _FileScan:
    return _FileScan(
        listed.rel,
        _FAILED,
        failure=format_message(
            f"no media metadata for {listed.rel!r}: it cannot be read or decoded",
            where=str(path),
            found=f"{type(exc).__name__}: " + " ".join(str(exc).split()),
            fix="re-encode or remove the file; it is stored without metadata",
        ),
    )


def _scan_task(args: tuple[Path, _Listed, MediaFilter]) -> _FileScan:
    return _scan_file(*args)


def _scan_remote_task(args: tuple[RemotePath, _Listed, MediaFilter, Path]) -> _FileScan:
    return _scan_remote_file(*args)


def _scan_all(
    root: AnyPath,
    files: list[_Listed],
    media_filter: MediaFilter,
    *,
    num_workers: int | None,
    progress: bool,
    scratch: Path | None = None,
) -> Iterator[_FileScan]:
    """Reads ``files`` (in parallel processes) and yields the results in the order of ``files``.

    A remote folder's files are copied to ``scratch`` one at a time per worker to be read.
    """
    if isinstance(root, RemotePath):
        task, jobs = _scan_remote_task, [(root, listed, media_filter, scratch) for listed in files]
    else:
        task, jobs = _scan_task, [(root, listed, media_filter) for listed in files]
    return scan_in_order(task, jobs, num_workers=num_workers, progress=progress, desc="Reading media files", unit="file", max_chunk=64)


# ---------------------------------------------------------------------------------------------
# Index and state
# ---------------------------------------------------------------------------------------------


def _start_index(
    tmp: Path, previous: Path | None, index: AnyPath, reused: dict[str, str]
) -> tuple[MediaIndexWriter, dict[str, str]]:
    """A writer on a new index at ``tmp`` holding the rows of the reused files, copied from
    ``previous`` (``index`` itself, or the local copy of a remote ``index``).

    When the previous index does not hold them (or cannot be read), nothing is reused.
    """
    sqlite3.connect(tmp).close()
    writer = MediaIndexWriter(tmp)
    keys = [rel for rel, outcome in reused.items() if outcome == _ROW]
    if not keys:
        return writer, reused
    try:
        if previous is None:
            problem = "no index"
        else:
            copied = writer.copy_entries(previous, keys)
            problem = None if copied == len(keys) else f"{copied} of the {len(keys)} rows it should hold"
    except sqlite3.Error as exc:
        problem = f"{type(exc).__name__}: {exc}"
    except BaseException:
        writer.abort()
        raise
    if problem is None:
        return writer, reused
    logger.warning(
        "%s",
        format_message(
            "the previous index cannot be reused; every file is read again",
            where=str(index),
            found=problem,
        ),
    )
    writer.abort()
    tmp.unlink(missing_ok=True)
    sqlite3.connect(tmp).close()
    return MediaIndexWriter(tmp), {}


def _stamp(path: AnyPath) -> list[int | str] | None:
    """``[size, mtime_ns]`` of a local file, ``[size, version]`` of a remote one; None if missing."""
    if isinstance(path, RemotePath):
        stat = file_stat(path)
        return None if stat is None else [stat.size, stat.version]
    try:
        st = path.stat()
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]


def _load_state(meta: AnyPath, index_stamp: list[int | str] | None, media_filter: MediaFilter) -> dict[str, list]:
    """The previous run's ``{rel: [size, mtime_ns or version, outcome]}``, or {} when it cannot
    be trusted (``index_stamp``: the :func:`_stamp` of the index now)."""
    try:
        state = parse_json((meta / STATE_FILE).read_text(), str(meta / STATE_FILE))
    except (OSError, ValueError):  # also ConfigError (nesting): then every file is scanned again
        return {}
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        return {}
    if state.get("index_stamp") != index_stamp or state.get("media_filter") != media_filter.to_json():
        return {}
    files = state.get("files")
    if not isinstance(files, dict):
        return {}
    return {
        rel: entry
        for rel, entry in files.items()
        if isinstance(entry, list) and len(entry) == 3 and entry[2] in (_ROW, _NOT_MEDIA, _FAILED)
    }


def _write_state(
    meta: AnyPath, index: AnyPath, media_filter: MediaFilter, listed: list[_Listed], outcomes: dict[str, str]
) -> None:
    state = {
        "version": STATE_VERSION,
        "index_stamp": _stamp(index),
        "media_filter": media_filter.to_json(),
        "files": {f.rel: [*f.stamp, outcomes[f.rel]] for f in listed},
    }
    atomic_write_text(meta / STATE_FILE, json.dumps(state, separators=(",", ":")))


def _copy_permissions(root: Path, meta: Path, index: Path) -> None:
    """As Energon: .nv-meta gets the folder's permissions (plus rwx for the owner), the index
    the folder's read/write bits (plus rw for the owner)."""
    try:
        mode = root.stat().st_mode
        meta.chmod(mode | 0o700)
        index.chmod((mode | 0o600) & 0o666)
    except OSError:
        pass
