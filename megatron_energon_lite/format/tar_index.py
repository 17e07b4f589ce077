"""``<shard>.tar.idx``: N+1 little-endian uint64 offsets, no header (Energon's layout).

Entry ``i`` is the offset of the first header of sample ``i``; the last entry is the end of the
last member (the start of the end-of-archive blocks), *not* the file size.  Sample ``i`` spans
``[idx[i], idx[i+1])``; sample 0 is read from offset 0 so leading non-sample members are
tolerated, as Energon does.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import DatasetError, format_message
from ..storage import atomic_write_bytes

INDEX_DTYPE = np.dtype("<u8")


def index_path(tar_path: str | os.PathLike) -> Path:
    """``shards/a.tar`` -> ``shards/a.tar.idx``."""
    return Path(tar_path).with_suffix(".tar.idx")


def write_tar_index(tar_path: str | os.PathLike, offsets: np.ndarray | list[int]) -> None:
    """Writes the index of ``tar_path`` atomically."""
    data = np.asarray(offsets, dtype=INDEX_DTYPE).tobytes()
    atomic_write_bytes(index_path(tar_path), data)


def read_tar_index(tar_path: str | os.PathLike, *, expected_samples: int | None = None) -> np.ndarray:
    """Maps the index of ``tar_path`` read-only; checks its length against ``expected_samples``."""
    path = index_path(tar_path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise DatasetError(
            format_message(
                "missing .tar.idx index file",
                where=str(path),
                fix="run `energon-lite prepare --tar-index-only` on the dataset",
            )
        ) from None
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
    offsets = np.memmap(path, dtype=INDEX_DTYPE, mode="r")
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
    return offsets
