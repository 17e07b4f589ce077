"""``<shard>.tar.idx``: N+1 little-endian uint64 offsets, no header (Energon's layout).

Entry ``i`` is the offset of the first header of sample ``i``; the last entry is the end of the
last member (the start of the end-of-archive blocks), *not* the file size.  Sample ``i`` spans
``[idx[i], idx[i+1])``; sample 0 is read from offset 0 so leading non-sample members are
tolerated, as Energon does.

Remote indexes are fetched once into the local cache (keyed by URL, ETag and size) and mapped
from there.  Reading one checks that its offsets increase and that it still describes its tar:
no shorter, not much longer, and nothing but zero blocks where it says the archive ends.
"""

from __future__ import annotations

import os
from typing import Callable

import numpy as np

from ..errors import DatasetError, format_message
from ..storage import (
    AnyPath,
    FileStat,
    RemotePath,
    as_path,
    atomic_write_bytes,
    cached_copy,
    file_pool,
    file_stat,
)
# index_name (shards/a.tar -> shards/a.tar.idx) is defined with the dataset's other file names in
# metadata, which lists shards with their indexes; prepare and lint import it from here.
from .metadata import index_name  # noqa: F401
from .sqlite_index import shard_sample_keys
from .tar_reader import TarFormatError, sample_offsets

INDEX_DTYPE = np.dtype("<u8")


# After the last member a tar holds two zero blocks, padded to a 20-block record (GNU tar and
# Python's tarfile): a tar longer than this past the index's end was changed after prepare.
TAR_TRAILER_MAX = 2 * 512 + 20 * 512
_BLOCK = 512

#: Reads ``size`` bytes at ``offset`` of the tar (a file pool's read, bound to one path).
TailReader = Callable[[int, int], bytes]
#: Reads ``size`` bytes at ``offset`` of a remote tar of unknown size, cut at its end, with the
#: size the store stated (``RemoteFilePool.read_sized``, bound to one path).
SizedTailReader = Callable[[int, int], tuple[bytes, int]]


def index_path(tar_path: str | os.PathLike) -> AnyPath:
    """``shards/a.tar`` -> ``shards/a.tar.idx``."""
    return as_path(tar_path).with_suffix(".tar.idx")


def write_tar_index(tar_path: str | os.PathLike, offsets: np.ndarray | list[int]) -> None:
    """Writes the index of ``tar_path`` atomically."""
    data = np.asarray(offsets, dtype=INDEX_DTYPE).tobytes()
    atomic_write_bytes(index_path(tar_path), data)


def read_tar_index(
    tar_path: str | os.PathLike,
    *,
    expected_samples: int | None = None,
    tar_size: int | None = None,
    index_stat: FileStat | None = None,
    read: TailReader | None = None,
    sized_read: SizedTailReader | None = None,
) -> np.ndarray:
    """Maps the index of ``tar_path`` read-only.

    Checks its length against ``expected_samples``, that its offsets increase and, given the
    tar's size, that the index still describes that tar: a tar that is shorter than the index,
    much longer, or that holds a header where the index says the archive ends (a member appended
    after prepare) was changed after prepare.  That last check reads one block of the tar, with
    ``read(offset, size)`` when given (the caller's file pool) or a one-off read.  ``index_stat``
    is the index's stat when a listing already gave it (remotely it saves a request per shard);
    without it a remote index is read whole in one GET, whose length is its size.  A remote tar
    whose size is not known (``tar_size`` None) is checked with ``sized_read``: one read of the
    blocks where the index says the archive ends states the tar's size too.
    """
    path = index_path(tar_path)
    remote_data = None
    if index_stat is None and isinstance(path, RemotePath):
        try:
            remote_data = path.read_bytes()
        except FileNotFoundError:
            raise _missing_index(path) from None
        size = len(remote_data)
    else:
        stat = index_stat or file_stat(path)
        if stat is None:
            raise _missing_index(path)
        size = stat.size
    if size % 8 != 0 or size < 16:
        raise DatasetError(
            format_message(
                "corrupt .tar.idx index file",
                where=str(path),
                expected="a multiple of 8 bytes, at least 16",
                found=f"{size} bytes",
                fix="run `energon-lite prepare --tar-index-only` on the dataset",
            )
        )
    if remote_data is not None:
        offsets = np.frombuffer(remote_data, dtype=INDEX_DTYPE)
    else:
        local = cached_copy(path, stat) if isinstance(path, RemotePath) else path
        offsets = np.memmap(local, dtype=INDEX_DTYPE, mode="r")
    if expected_samples is not None and len(offsets) - 1 != expected_samples:
        raise DatasetError(
            format_message(
                ".tar.idx disagrees with .nv-meta/.info.json",
                where=str(path),
                expected=f"{expected_samples} samples ({expected_samples + 1} offsets)",
                found=f"{len(offsets) - 1} samples",
                fix="the shard changed after prepare; run `energon-lite prepare` again",
            )
        )
    _check_increasing(offsets, str(path))
    if tar_size is None and sized_read is not None:
        end = int(offsets[-1])
        tail, tar_size = sized_read(end, _BLOCK)  # the size comes with the reply, not from its length
        fallback = read
        read = _reading_from(tail, end, lambda offset, size: _read(tar_path, offset, size, fallback))
    if tar_size is not None:
        _check_fresh(offsets, tar_size, tar_path, read)
    return offsets


def index_from_tar(data: bytes, tar_path: str | os.PathLike, *, expected_samples: int) -> np.ndarray:
    """The index of a whole tar held in memory (``data``), from its headers as ``prepare`` reads
    them: for a shard small enough to fetch whole in one GET, whose ``.tar.idx`` is then not read.

    The tar may have changed since prepare, and nothing else here says what prepare found: it must
    parse, hold the sample count the dataset's metadata gives, and end as that index would (only
    end-of-archive blocks after its last sample); else :class:`DatasetError` names the shard. A
    sample renamed in place (same count, same offsets) is not seen here, as a read through the
    ``.tar.idx`` does not see it either."""
    where = str(as_path(tar_path))
    try:
        keys, bounds = sample_offsets(data, where=where)
    except TarFormatError as exc:
        raise _differs_from_prepare(where, expected_samples, f"a tar that does not parse ({str(exc).splitlines()[0]})") from None
    if len(keys) != expected_samples:
        named = f" (keys {keys[0]!r}..{keys[-1]!r})" if keys else ""
        raise _differs_from_prepare(where, expected_samples, f"{len(keys)} samples{named}")
    offsets = np.asarray(bounds, dtype=INDEX_DTYPE)
    _check_fresh(offsets, len(data), tar_path, lambda offset, size: data[offset : offset + size])
    return offsets


def _differs_from_prepare(where: str, expected_samples: int, found: str) -> DatasetError:
    return DatasetError(
        format_message(
            "the shard does not hold the samples the dataset's metadata counts (it changed after prepare)",
            where=where,
            expected=f"{expected_samples} samples (as .nv-meta/.info.json or the start-up summary counts them)",
            found=found,
            fix="run `energon-lite prepare` on the dataset again",
        )
    )


def _missing_index(path: AnyPath) -> DatasetError:
    return DatasetError(
        format_message(
            "missing .tar.idx index file",
            where=str(path),
            fix="run `energon-lite prepare --tar-index-only` on the dataset",
        )
    )


def _reading_from(data: bytes, at: int, read: TailReader) -> TailReader:
    """A reader that answers from ``data`` (the tar's bytes from ``at``) what it holds, the rest
    with ``read``."""

    def reader(offset: int, size: int) -> bytes:
        if at <= offset and offset + size <= at + len(data):
            return data[offset - at : offset - at + size]
        return read(offset, size)

    return reader


def _check_increasing(offsets: np.ndarray, where: str) -> None:
    """Each sample starts after the previous one: anything else is a corrupt or foreign index."""
    not_after = np.flatnonzero(offsets[1:] <= offsets[:-1])
    if len(not_after) == 0:
        return
    i = int(not_after[0])
    raise DatasetError(
        format_message(
            "corrupt .tar.idx index file: offsets are not increasing",
            where=f"{where}, entries {i} and {i + 1}",
            expected="strictly increasing byte offsets (one per sample, then the end of the last sample)",
            found=f"{int(offsets[i])} then {int(offsets[i + 1])}",
            fix="run `energon-lite prepare --tar-index-only` on the dataset",
        )
    )


def _check_fresh(offsets: np.ndarray, tar_size: int, tar_path: str | os.PathLike, read: TailReader | None) -> None:
    where = str(as_path(tar_path))
    end = int(offsets[-1])
    # A tar cut short ends in the middle of data; an intact one ends with zero blocks, and then
    # it is the index that is wrong (stale or corrupt): the general message below applies.
    if tar_size < end and (tar_size < 2 * _BLOCK or _read(tar_path, tar_size - 2 * _BLOCK, 2 * _BLOCK, read).count(0) != 2 * _BLOCK):
        raise _truncated(offsets, tar_size, tar_path)
    if not end <= tar_size <= end + TAR_TRAILER_MAX:
        raise DatasetError(
            format_message(
                ".tar.idx is stale: the tar changed after it was indexed",
                where=where,
                expected=f"a tar of {end}..{end + TAR_TRAILER_MAX} bytes (the index ends at byte {end})",
                found=f"{tar_size} bytes",
                fix="run `energon-lite prepare` on the dataset again",
            )
        )
    if tar_size == end:
        return  # no end-of-archive blocks: nothing can hide there
    # Where the index says the archive ends, a tar reader (and prepare) stops at a zero block;
    # a member appended after prepare puts its header exactly there.
    tail = _read(tar_path, end, min(_BLOCK, tar_size - end), read)
    if tail.count(0) != len(tail):
        raise DatasetError(
            format_message(
                ".tar.idx is stale: the tar holds data where its index says the archive ends "
                "(members were added after prepare)",
                where=f"{where} at byte {end}",
                expected="zero blocks (end of archive) after the last indexed sample",
                found=f"non-zero bytes {bytes(tail[:24])!r}",
                fix="run `energon-lite prepare` on the dataset again",
            )
        )


def _truncated(offsets: np.ndarray, tar_size: int, tar_path: str | os.PathLike) -> DatasetError:
    """The tar ends before its index does: the shard is damaged (cut short by a failed copy or a
    full disk), and the samples whose bytes lie past its end are lost. Re-running prepare would
    only hide that; the error names them, from the index."""
    samples = len(offsets) - 1
    first_lost = int(np.searchsorted(offsets[1:], tar_size, side="right"))
    keys = shard_sample_keys(tar_path, first_lost, limit=10)
    named = f": keys {', '.join(map(repr, keys))}{', ...' if samples - first_lost > len(keys) else ''}" if keys else ""
    return DatasetError(
        format_message(
            f"the shard is truncated (damaged): {samples - first_lost} of its {samples} samples lie past its end and are lost",
            where=f"{as_path(tar_path)} (samples {first_lost}..{samples - 1} of the shard{named})",
            expected=f"{int(offsets[-1])} bytes or more (where its index ends)",
            found=f"{tar_size} bytes",
            fix="restore the shard from its source (copy it again); if the lost samples are acceptable, "
            "exclude the shard in split.yaml or re-run prepare to index what is left",
        )
    )


def _read(tar_path: str | os.PathLike, offset: int, size: int, read: TailReader | None) -> bytes:
    if read is not None:
        return read(offset, size)
    path = as_path(tar_path)
    pool = file_pool(path)
    try:
        return pool.read(path, offset, size)
    finally:
        pool.close()
