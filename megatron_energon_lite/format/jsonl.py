"""JSONL datasets: ``<file>.jsonl.idx`` holds N+1 uint64 offsets (record starts, then file size).

One JSON object per line.  Blank lines belong to the record before them (a blank line before the
first record belongs to record 0), exactly as Energon indexes them.  A JSONL file is one virtual
shard; its samples are crude dicts keyed by line number.
"""

from __future__ import annotations

import json
import os

import numpy as np

from ..errors import DatasetError, format_message
from ..storage import (
    AnyPath,
    LocalFilePool,
    RemoteFilePool,
    RemotePath,
    as_path,
    atomic_write_bytes,
    cached_copy,
    file_pool,
    file_stat,
    local_file,
)
from .tar_index import INDEX_DTYPE


def jsonl_index_path(path: str | os.PathLike) -> AnyPath:
    path = as_path(path)
    return path.with_name(path.name + ".idx")


def build_jsonl_index(path: str | os.PathLike) -> np.ndarray:
    """Scans ``path`` and returns its record offsets; a line that is not an object is an error."""
    offsets = []
    position = 0
    with local_file(as_path(path)) as local, open(local, "rb") as f:
        for line_number, line in enumerate(f, start=1):
            stripped = line.strip()
            if stripped:
                if not (stripped.startswith(b"{") and stripped.endswith(b"}")):
                    raise DatasetError(
                        format_message(
                            "JSONL line is not a JSON object",
                            where=f"{path}:{line_number}",
                            expected="one object per line, starting with '{' and ending with '}'",
                            found=repr(stripped[:60].decode("utf-8", "replace")),
                            fix="fix or remove the line, then run `energon-lite prepare` again",
                        )
                    )
                offsets.append(0 if not offsets else position)
            position += len(line)
    offsets.append(position)
    return np.asarray(offsets, dtype=INDEX_DTYPE)


def write_jsonl_index(path: str | os.PathLike) -> int:
    """Writes ``<path>.idx``; returns the number of records."""
    offsets = build_jsonl_index(path)
    atomic_write_bytes(jsonl_index_path(path), offsets.tobytes())
    return len(offsets) - 1


class JsonlReader:
    """Random access to the records of a prepared JSONL file."""

    def __init__(self, path: str | os.PathLike, *, pool: LocalFilePool | RemoteFilePool | None = None) -> None:
        self.path = as_path(path)
        index = jsonl_index_path(self.path)
        index_stat = file_stat(index)
        if index_stat is None:
            raise DatasetError(
                format_message(
                    "JSONL file has no index",
                    where=str(index),
                    fix=f"run `energon-lite prepare {self.path}`",
                )
            )
        local_index = cached_copy(index, index_stat) if isinstance(index, RemotePath) else index
        self._offsets = np.fromfile(local_index, dtype=INDEX_DTYPE)
        size = self.path.stat().st_size
        if len(self._offsets) < 1 or int(self._offsets[-1]) != size:
            raise DatasetError(
                format_message(
                    "JSONL index does not fit the file (the file changed after prepare)",
                    where=str(self.path),
                    expected=f"file size {int(self._offsets[-1]) if len(self._offsets) else '?'}",
                    found=f"file size {size}",
                    fix=f"run `energon-lite prepare {self.path}` to regenerate the index",
                )
            )
        self._pool = pool or file_pool(self.path)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def read(self, index: int) -> dict:
        """The parsed object of record ``index``."""
        start, end = int(self._offsets[index]), int(self._offsets[index + 1])
        data = self._pool.read(self.path, start, end - start)
        try:
            return json.loads(data)
        except json.JSONDecodeError as exc:
            raise DatasetError(
                format_message(
                    "JSONL record is not valid JSON",
                    where=f"{self.path} record {index} (bytes {start}..{end})",
                    found=str(exc),
                    fix="fix the line, then run `energon-lite prepare` again",
                )
            ) from None
