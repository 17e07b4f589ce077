"""JSONL datasets: ``<file>.jsonl.idx`` holds N+1 uint64 offsets (record starts, then file size).

One JSON object per line.  Blank lines belong to the record before them (a blank line before the
first record belongs to record 0), exactly as Energon indexes them.  A JSONL file is one virtual
shard; its samples are crude dicts keyed by line number.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ..errors import DatasetError, format_message
from ..storage import LocalFilePool, atomic_write_bytes
from .tar_index import INDEX_DTYPE


def jsonl_index_path(path: str | os.PathLike) -> Path:
    path = Path(path)
    return path.with_name(path.name + ".idx")


def build_jsonl_index(path: str | os.PathLike) -> np.ndarray:
    """Scans ``path`` and returns its record offsets; a line that is not an object is an error."""
    offsets = []
    position = 0
    with open(path, "rb") as f:
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

    def __init__(self, path: str | os.PathLike, *, file_pool: LocalFilePool | None = None) -> None:
        self.path = Path(path)
        index = jsonl_index_path(self.path)
        if not index.is_file():
            raise DatasetError(
                format_message(
                    "JSONL file has no index",
                    where=str(index),
                    fix=f"run `energon-lite prepare {self.path}`",
                )
            )
        self._offsets = np.fromfile(index, dtype=INDEX_DTYPE)
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
        self._pool = file_pool or LocalFilePool()

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def read(self, index: int) -> dict:
        """The parsed object of record ``index``."""
        start, end = int(self._offsets[index]), int(self._offsets[index + 1])
        data = self._pool.read(str(self.path), start, end - start)
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
