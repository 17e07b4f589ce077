"""Random access to the samples of one split of a prepared WebDataset.

A sample is addressed by its index in the split (the shards of the split concatenated in
``split.yaml`` order, as Energon numbers them for restore keys and sharding).  Reading it costs
one ``pread`` of its byte range from the shard's ``.tar.idx`` locally, and at most one ranged
GET remotely (none when an earlier read fetched it ahead: callers pass the end of the slice they
read, and the remote pool reads ahead up to it).
"""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass

import numpy as np

from ..policy import PLAIN, Policy
from ..storage import (
    AnyPath,
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
from .tar_index import read_tar_index
from .tar_reader import parse_sample


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

    def _index(self, shard: int) -> np.ndarray:
        offsets = self._indexes[shard]
        if offsets is None:
            name = self.split.names[shard]
            path = self.shard_path(shard)
            stat = self.split.stats.get(name) or file_stat(path)  # local: stat'ed on first read
            if stat is None:
                raise missing_shard_error(path)
            offsets = read_tar_index(
                path,
                expected_samples=self.split.counts[shard],
                tar_size=stat.size,
                index_stat=self.split.stats.get(index_name(name)),
                read=lambda offset, size: self._pool.read(path, offset, size),
            )
            self._indexes[shard] = offsets
        return offsets

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
        self._pool.close()
        self._recorded_keys.close()

