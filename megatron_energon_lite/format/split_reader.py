"""Random access to the samples of one split of a prepared WebDataset.

A sample is addressed by its index in the split (the shards of the split concatenated in
``split.yaml`` order, as Energon numbers them for restore keys and sharding).  Reading it costs
one ``pread`` of its byte range from the shard's ``.tar.idx`` locally, and at most one ranged
GET remotely (none when an earlier read fetched it ahead: callers pass the end of the slice they
read, and the remote pool reads ahead up to it).  Remotely, a caller that knows which ranges it
reads next hands them to :meth:`SplitReader.prefetch`: their shards' indexes and their bytes are
then requested in the background, a few slices ahead.
"""

from __future__ import annotations

import bisect
import functools
import logging
import os
import threading
import weakref
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from ..errors import DatasetError
from ..policy import PLAIN, Policy
from ..storage import (
    AnyPath,
    FileStat,
    LocalFilePool,
    RemoteFilePool,
    as_path,
    file_pool,
    file_stat,
)
from .metadata import (
    DatasetInfo,
    ResolvedSplit,
    index_name,
    missing_shard_error,
    read_info,
    resolve_split,
)
from .recorded_keys import RecordedKeys
from .tar_index import TAR_TRAILER_MAX, index_from_tar, read_tar_index
from .tar_reader import parse_sample

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class RawSample:
    """Undecoded parts of one sample and where it came from."""

    key: str
    shard: str
    index: int  # position in the split
    parts: dict[str, bytes]


class SplitReader:
    """Reads samples of ``split_part`` of the dataset at ``root`` by split index.

    Shard paths that point outside ``root`` (absolute, ``..``, URLs) are refused unless
    ``allow_outside_root``; a shard's index is checked against its tar when first used.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        split_part: str,
        *,
        split_config: str | None = None,
        info: DatasetInfo | None = None,
        allow_empty: bool = False,
        pool: LocalFilePool | RemoteFilePool | None = None,
        allow_outside_root: bool = False,
        split: ResolvedSplit | None = None,
        policy: Policy = PLAIN,
    ) -> None:
        """``split``: the split as the loader resolved it (then no metadata is read here);
        ``policy``: the loader's (shards outside the dataset folder, see ``check_shard_name``)."""
        self.root = as_path(root)
        self.split: ResolvedSplit = split or resolve_split(
            self.root, split_part, split_config=split_config,
            info=info or read_info(self.root, allow_outside_root=allow_outside_root, policy=policy),
            allow_empty=allow_empty, allow_outside_root=allow_outside_root,
        )
        self._starts = self.split.shard_starts
        self._indexes: list[np.ndarray | None] = [None] * len(self.split.names)
        self._paths: dict[int, AnyPath] = {}  # made on first use: a split may have 10,000s of shards
        self._pool = pool or file_pool(self.root)
        self._recorded_keys = RecordedKeys(self.root)
        self._reads_ahead = isinstance(self._pool, RemoteFilePool)  # local: the page cache does
        # Shards of unknown size read whole are first asked for whole (see _index_from_whole_tar),
        # until one turns out bigger than whole_shard_bytes: a dataset's shards are mostly alike.
        self._probe_whole = True
        self._refused: dict[int, DatasetError] = {}  # shards read whole that differ from their metadata
        self._start_process()

    def _start_process(self) -> None:
        """Index reads under way (a prefetch thread's, which a read may wait for) and the ranges
        planned: per process, empty after a fork."""
        self._pid = os.getpid()
        self._index_lock = threading.Lock()
        self._index_loads: dict[int, Future] = {}
        # Ranges handed to prefetch -> their planning task, until their last sample is read.
        self._planned: dict[tuple[int, int], Future] = {}

    def _own_process(self) -> None:
        if self._pid != os.getpid():
            self._start_process()  # a forked child: the parent's tasks never finish here

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_index_lock", "_index_loads", "_planned")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._start_process()

    @property
    def prefetch_depth(self) -> int:
        """How many slices ahead a caller should hand to :meth:`prefetch` (0: do not)."""
        return max(0, self._pool.settings.prefetch_slices) if self._reads_ahead else 0

    def __len__(self) -> int:
        return self._starts[-1]

    @property
    def shard_starts(self) -> list[int]:
        """Split index of the first sample of each shard, plus the total at the end."""
        return list(self._starts)

    def shard_path(self, shard: int) -> AnyPath:
        path = self._paths.get(shard)
        if path is None:
            path = self._paths[shard] = self.root / self.split.names[shard]
        return path

    def locate(self, index: int) -> tuple[int, int]:
        """Split index -> (shard position in the split, sample index inside the shard)."""
        if not 0 <= index < len(self):
            raise IndexError(f"sample index {index} out of range 0..{len(self) - 1}")
        shard = bisect.bisect_right(self._starts, index) - 1
        return shard, index - self._starts[shard]

    def _index(self, shard: int, *, whole: bool = False) -> np.ndarray:
        """The index of ``shard``, read once (``whole``: by a plan that reads the whole shard,
        see :meth:`_read_index`)."""
        offsets = self._indexes[shard]
        if offsets is not None:
            return offsets
        self._own_process()
        # One read per shard: a read that finds a prefetch thread reading this index waits for it
        # (and gets its error, if it fails); a failed read is not kept, the next use tries again.
        with self._index_lock:
            offsets = self._indexes[shard]
            if offsets is not None:
                return offsets
            loading = self._index_loads.get(shard)
            mine = loading is None
            if mine:
                loading = self._index_loads[shard] = Future()
        if not mine:
            return loading.result()
        try:
            offsets = self._read_index(shard, whole)
        except BaseException as exc:
            with self._index_lock:
                del self._index_loads[shard]
            loading.set_exception(exc)
            raise
        self._indexes[shard] = offsets
        with self._index_lock:
            del self._index_loads[shard]
        loading.set_result(offsets)
        return offsets

    def _read_index(self, shard: int, whole: bool = False) -> np.ndarray:
        """Reads and checks the index of ``shard`` against its tar.  Remotely, sizes the split
        does not give (a split from the start-up summary) cost no HEAD: the index is read whole,
        and the read of the tar's end-of-archive blocks states the tar's size; for a plan that
        reads the whole shard (``whole``) and a shard of about a block, that read is the one GET
        of its samples and trailer; a shard of at most ``whole_shard_bytes`` read whole needs no
        index read at all (:meth:`_index_from_whole_tar`)."""
        name = self.split.names[shard]
        path = self.shard_path(shard)
        stat = self.split.stats.get(name)
        refused = self._refused.get(shard)
        if refused is not None:
            raise refused
        if whole and self._reads_ahead:
            offsets = self._index_from_whole_tar(shard, stat)
            if offsets is not None:
                self._pool.limit_release(path, int(offsets[-1]))
                return offsets
        sized_read = None
        if stat is None and self._reads_ahead:
            sized_read = functools.partial(self._read_sized, path, whole=whole)
        elif stat is None:
            stat = file_stat(path)  # local: stat'ed on first read
            if stat is None:
                raise missing_shard_error(path)
        offsets = read_tar_index(
            path,
            expected_samples=self.split.counts[shard],
            tar_size=None if stat is None else stat.size,
            index_stat=self.split.stats.get(index_name(name)),
            read=lambda offset, size: self._pool.read(path, offset, size),
            sized_read=sized_read,
        )
        if self._reads_ahead:  # before any sample read can use it: see _prefetch_shard
            self._pool.limit_release(path, int(offsets[-1]))
        return offsets

    def _index_from_whole_tar(self, shard: int, stat: FileStat | None) -> np.ndarray | None:
        """A shard read whole and no bigger than ``whole_shard_bytes``: its tar in one GET, held
        for the reads of its samples, and its index from the tar's headers, checked against the
        split's sample count (:func:`index_from_tar`): no ``.tar.idx`` request. None for a bigger
        shard (its ``.tar.idx`` is read then). Of unknown size (a split from the start-up
        summary), the GET asks for the first ``whole_shard_bytes`` and its reply states the size;
        a shard found bigger lets those bytes go and ends the asking for this reader."""
        pool: RemoteFilePool = self._pool  # type: ignore[assignment]
        limit = pool.settings.whole_shard_bytes
        if stat is not None:
            if not 0 < stat.size <= limit:
                return None
            limit = stat.size
        elif not self._probe_whole or limit <= 0:
            return None
        path = self.shard_path(shard)
        entry = pool.prefetch(path, 0, limit, sized=True)
        try:
            data, size = pool.read_sized(path, 0, limit)
        except FileNotFoundError:
            raise missing_shard_error(path) from None
        if size > limit:
            if entry is not None:
                pool.release(path, entry)
            self._probe_whole = False
            logger.debug("%s: %d bytes, over ENERGON_LITE_WHOLE_SHARD_BYTES (%d): shards of this reader are read through their .tar.idx", path, size, limit)
            return None
        try:
            return index_from_tar(data, path, expected_samples=self.split.counts[shard])
        except DatasetError as exc:
            if entry is not None:
                pool.release(path, entry)
            # Kept: a later read of the shard must not go round it through the .tar.idx, which
            # describes a tar that is no longer there (a sample renamed in place reads fine there).
            self._refused[shard] = exc
            raise

    def _read_sized(self, path: AnyPath, data_end: int, size: int, *, whole: bool) -> tuple[bytes, int]:
        """The tar's bytes ``[data_end, data_end + size)`` (cut at its end) and its size; a shard
        read whole whose samples end within a block is read whole here, its samples held for
        their reads."""
        pool: RemoteFilePool = self._pool  # type: ignore[assignment]
        if whole and data_end <= pool.settings.block_size:
            pool.prefetch(path, 0, data_end + size, sized=True)
        try:
            return pool.read_sized(path, data_end, size)
        except FileNotFoundError:
            raise missing_shard_error(path) from None

    # --- reading ahead (remote) ------------------------------------------------------------------
    def prefetch(self, ranges: Iterable[tuple[int, int]]) -> None:
        """Starts reading the ``[start, end)`` split ranges the caller reads next, in that order:
        each shard's index (once per process) and the ranges' bytes, on the pool's threads, as
        far as its byte budget allows. Nothing for a local dataset. What is never read is
        dropped by :meth:`discard_prefetched` or :meth:`close`; a read error reaches the read
        of the sample that needs the bytes, as without prefetch."""
        if not self.prefetch_depth:
            return
        self._own_process()
        for start, end in ranges:
            while start < end:
                shard = bisect.bisect_right(self._starts, start) - 1
                stop = min(end, self._starts[shard + 1])
                if (start, stop) not in self._planned:
                    # A weak reference: a reader dropped mid-epoch is not kept alive by its queue.
                    task = self._pool.submit(_prefetch_shard, weakref.ref(self), shard, start, stop)
                    if task is None:
                        return  # closed
                    self._planned[(start, stop)] = task
                start = stop

    def _wait_for_plan(self, index: int) -> None:
        """Before reading sample ``index``: if a planning task covers it, waits until the task
        has requested its bytes (so the read uses them instead of fetching them a second time)."""
        for (start, stop), task in list(self._planned.items()):
            if start <= index < stop:
                try:
                    task.result()
                except BaseException:  # cancelled by close; the task itself raises nothing
                    pass
                if index == stop - 1:
                    self._planned.pop((start, stop), None)
                return

    def _prefetch_shard(self, shard: int, start: int, stop: int) -> None:
        """On a planning thread: the index of ``shard``, then split indexes ``[start, stop)`` of
        it as ranged GETs of at most ``block_size`` (cut at sample boundaries; a sample larger
        than that is one GET). A range that covers a whole shard of about a block is read with
        the tar's trailer in one GET (started with the index read when the split gives the tar's
        size, else once the index says where the samples end: :meth:`_read_sized`): the
        end-of-archive check of the index is then served from it (no request of its own)."""
        pool: RemoteFilePool = self._pool  # type: ignore[assignment]
        path = self.shard_path(shard)
        first, last = start - self._starts[shard], stop - self._starts[shard]
        stat = self.split.stats.get(self.split.names[shard])
        try:
            whole = first == 0 and last == self.split.counts[shard]
            # (a shard of at most whole_shard_bytes is read whole by the index read itself)
            if whole and self._indexes[shard] is None and stat is not None and pool.settings.whole_shard_bytes < stat.size <= pool.settings.block_size + TAR_TRAILER_MAX:
                pool.prefetch(path, 0, stat.size)
            offsets = self._index(shard, whole=whole)
        except Exception:
            return  # the read of a sample of this shard reads the index itself and reports the error
        begin = 0 if first == 0 else int(offsets[first])
        piece_start = begin
        for i in range(first + 1, last + 1):
            end = int(offsets[i])
            if i == last or int(offsets[i + 1]) - piece_start > pool.settings.block_size:
                if piece_start < end and pool.prefetch(path, piece_start, end) is None and pool.prefetched_bytes + end - piece_start > pool.settings.readahead_bytes:
                    self._planned.pop((start, stop), None)  # no room now: planned again while pending
                    return
                piece_start = end

    def discard_prefetched(self) -> None:
        """Drops ranges read ahead and the plan (the caller moves elsewhere: a restore)."""
        if self._reads_ahead:
            self._own_process()
            tasks = list(self._planned.values())
            self._planned.clear()
            for task in tasks:
                task.cancel()
            for task in tasks:  # a task under way may still request bytes: let it, then drop them
                try:
                    task.result()
                except BaseException:
                    pass
            self._pool.discard_prefetched()

    def byte_range(self, index: int) -> tuple[int, int, int]:
        """(shard position, start, end) of sample ``index``; sample 0 of a shard starts at 0."""
        shard, local = self.locate(index)
        offsets = self._index(shard)
        start = 0 if local == 0 else int(offsets[local])
        return shard, start, int(offsets[local + 1])

    def is_excluded(self, shard: int, key: str) -> bool:
        excluded = self.split.excluded_keys.get(self.split.names[shard])
        return excluded is not None and key in excluded

    def read(self, index: int, *, wanted: frozenset[str] | None = None, read_until: int | None = None, check_key: bool = False) -> RawSample | None:
        """Reads sample ``index``; None when ``split.yaml`` excludes it by key.

        ``read_until`` (a split index) says the caller will read the samples up to it next, so
        a remote read may fetch their bytes in the same request. ``check_key``: a read by
        position that must get the sample the index recorded there (a restore, a map view), not
        whatever a rewritten shard holds now.
        """
        if self._planned:
            self._own_process()
            self._wait_for_plan(index)
        shard, start, end = self.byte_range(index)
        name = self.split.names[shard]
        where = f"{self.shard_path(shard)} sample {index - self._starts[shard]} (bytes {start}..{end})"
        readahead_end = None
        if self._reads_ahead and read_until is not None and read_until > index:
            last = min(read_until, self._starts[shard + 1]) - self._starts[shard]
            readahead_end = int(self._index(shard)[last])
        data = self._pool.read(self.shard_path(shard), start, end - start, readahead_end)
        key, parts = parse_sample(data, where=where, wanted=wanted, base_offset=start)
        if check_key:
            self._recorded_keys.check(name, index - self._starts[shard], key, where=where)
        if self.is_excluded(shard, key):
            return None
        return RawSample(key=key, shard=name, index=index, parts=parts)

    def close(self) -> None:
        self._planned.clear()
        self._pool.close()
        self._recorded_keys.close()



def _prefetch_shard(reader: "weakref.ref[SplitReader]", shard: int, start: int, stop: int) -> None:
    live = reader()
    if live is not None:
        live._prefetch_shard(shard, start, stop)
