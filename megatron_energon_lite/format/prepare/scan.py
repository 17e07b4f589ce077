"""Indexing one shard: reading a tar's headers once, and the task the worker processes run."""

from __future__ import annotations

import itertools
import mmap
import os
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ...errors import EmptyDatasetError, format_message
from ...storage import AnyPath, create_temporary, local_file, reporting_no_room
from ..media_metadata import MediaFilter, MediaScan, scan_media
from ..tar_index import INDEX_DTYPE, index_name
from ..tar_reader import SampleEntry, TarMember, group_samples, iter_members


@dataclass
class ShardScan:
    """What scanning one tar found."""

    name: str
    offsets: np.ndarray  # N+1 uint64 entries, Energon's .tar.idx content
    samples: list[SampleEntry]
    media: MediaScan | None = None


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

    Locally the worker has also written the shard's new ``.tar.idx`` to a temporary file
    (``temporary``); it is renamed into place once the whole index is built.  Remotely ``index`` holds its bytes, uploaded at that point instead.
    """

    sample_rows: list[tuple]  # (tar_file_id, key, sample_index, byte_offset, byte_size)
    part_rows: list[tuple]  # (tar_file_id, sample_index, part, data_offset, size)
    index: bytes | None  # .tar.idx content, when not written by the worker
    tar_stamp: list | None  # [size, mtime_ns] of the tar as scanned (local only)
    index_stamp: list | None  # [size, mtime_ns] of the written temporary .tar.idx (local only)
    media: MediaScan | None
    temporary: str | None = None  # local: where the new .tar.idx was written


def _write_pending_index(final: str, owner: int, data: bytes) -> tuple[str, list]:
    """Writes the new ``.tar.idx`` for ``final`` to a fresh temporary file (made durable later,
    all at once: :func:`~.write._sync_files`) and returns its path and stamp; a full disk
    raises the storage error that names the file."""
    with reporting_no_room(final):
        fd, path = create_temporary(final, owner=owner)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            written = os.fstat(fd)
        finally:
            os.close(fd)
    return os.fspath(path), [written.st_size, str(written.st_mtime_ns)]


def _scan_task(args: tuple[AnyPath, str, int, MediaFilter | None, int | None]) -> _Scanned:
    root, name, shard_id, media_filter, owner = args
    samples, offsets, media, tar_stat = _scan(root, name, media_filter)
    tar_stamp = [tar_stat.st_size, str(tar_stat.st_mtime_ns)]
    return _scanned(root, name, shard_id, owner, _ShardColumns.of(samples, offsets), media, tar_stamp)


@dataclass
class _ShardColumns:
    """One shard's scan as columns: what its index rows are made of (and a prepare across
    ranks stores in its part files)."""

    keys: list[str]  # of each sample
    offsets: np.ndarray  # N+1: each sample's first header, then the end of the archive
    part_samples: list[int]  # of each part: its sample's index in the shard,
    part_names: list[str]  # its name ("jpg"),
    part_offsets: list[int]  # where its data starts
    part_sizes: list[int]  # and its size

    @classmethod
    def of(cls, samples: list[SampleEntry], offsets: np.ndarray) -> _ShardColumns:
        parts = [(i, *part) for i, s in enumerate(samples) for part in s.parts]
        part_samples, part_names, part_offsets, part_sizes = (list(column) for column in zip(*parts)) if parts else ([], [], [], [])
        return cls([s.key for s in samples], offsets, part_samples, part_names, part_offsets, part_sizes)


def _scanned(
    root: AnyPath,
    name: str,
    shard_id: int,
    owner: int | None,
    columns: _ShardColumns,
    media: MediaScan | None,
    tar_stamp: list | None,
) -> _Scanned:
    """One shard's scan as the index build takes it: its rows for ``shard_id`` and its new
    ``.tar.idx``, written to a temporary file for process ``owner`` locally, kept as bytes for
    the upload when ``owner`` is None (remotely)."""
    ids = itertools.repeat(shard_id)
    offsets = columns.offsets
    sample_rows = list(zip(ids, columns.keys, range(len(columns.keys)), offsets[:-1].tolist(), np.diff(offsets).tolist()))
    part_rows = list(zip(ids, columns.part_samples, columns.part_names, columns.part_offsets, columns.part_sizes))
    data = offsets.tobytes()
    if owner is None:  # remote: the main process uploads the index after the build
        return _Scanned(sample_rows, part_rows, data, None, None, media)
    temporary, index_stamp = _write_pending_index(os.path.join(os.fspath(root), index_name(name)), owner, data)
    return _Scanned(sample_rows, part_rows, None, tar_stamp, index_stamp, media, temporary)
