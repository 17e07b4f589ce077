"""``.nv-meta/index.sqlite`` in Energon's schema: one row per sample and one per part.

Plain train/val loading does not need it (``.tar.idx`` suffices); joins, aux sources and media
metadata do.  ``sample_key`` is unique over the whole dataset, so this is also where duplicate
keys are found at prepare time.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .tar_reader import SampleEntry

_SCHEMA = (
    "CREATE TABLE samples (tar_file_id INTEGER NOT NULL, sample_key TEXT NOT NULL UNIQUE, "
    "sample_index INTEGER NOT NULL, byte_offset INTEGER, byte_size INTEGER)",
    "CREATE TABLE sample_parts (tar_file_id INTEGER, sample_index INTEGER, part_name TEXT, "
    "content_byte_offset INTEGER, content_byte_size INTEGER)",
)
_INDEXES = (
    "CREATE INDEX idx_samples_by_tar_and_idx ON samples(tar_file_id, sample_index)",
    "CREATE INDEX idx_sample_parts_seq ON sample_parts(tar_file_id, sample_index, content_byte_offset)",
    "CREATE INDEX idx_sample_parts_full ON sample_parts(tar_file_id, sample_index, part_name, "
    "content_byte_offset, content_byte_size)",
)


@dataclass(frozen=True)
class DuplicateKey:
    """A sample key found twice: where it was first and where it appeared again."""

    key: str
    first: tuple[int, int]  # (tar_file_id, sample_index)
    again: tuple[int, int]


class SqliteIndexWriter:
    """Builds a new index file; rows of unchanged shards can be copied from an old index."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.unlink(missing_ok=True)
        self._db = sqlite3.connect(f"file:{path}", uri=True)  # uri: ATTACH read-only
        self._db.execute("PRAGMA journal_mode=OFF")
        self._db.execute("PRAGMA synchronous=OFF")
        for statement in _SCHEMA:
            self._db.execute(statement)

    def add_shard(
        self, tar_file_id: int, samples: Sequence[SampleEntry], offsets: Sequence[int]
    ) -> list[DuplicateKey]:
        """Inserts one shard's rows; returns the keys that were already present."""
        rows = [
            (tar_file_id, s.key, i, int(offsets[i]), int(offsets[i + 1]) - int(offsets[i]))
            for i, s in enumerate(samples)
        ]
        before = self._db.total_changes
        self._db.executemany("INSERT OR IGNORE INTO samples VALUES (?, ?, ?, ?, ?)", rows)
        duplicates: list[DuplicateKey] = []
        if self._db.total_changes - before != len(rows):
            duplicates = self._find_duplicates(rows)
        self._db.executemany(
            "INSERT INTO sample_parts VALUES (?, ?, ?, ?, ?)",
            (
                (tar_file_id, i, part, offset, size)
                for i, s in enumerate(samples)
                for part, offset, size in s.parts
            ),
        )
        return duplicates

    def _find_duplicates(self, rows: list[tuple]) -> list[DuplicateKey]:
        found = []
        for tar_file_id, key, index, _, _ in rows:
            first = self._db.execute(
                "SELECT tar_file_id, sample_index FROM samples WHERE sample_key = ?", (key,)
            ).fetchone()
            if first != (tar_file_id, index):
                found.append(DuplicateKey(key, tuple(first), (tar_file_id, index)))
        return found

    def attach_previous(self, old_index: Path) -> None:
        """Makes a previous index readable as ``prev`` for :meth:`copy_shard`."""
        self._db.execute("ATTACH DATABASE ? AS prev", (f"file:{old_index}?mode=ro",))

    def copy_shard(self, old_id: int, new_id: int) -> list[DuplicateKey]:
        """Copies an unchanged shard's rows from the attached previous index, renumbering it."""
        rows = [
            (new_id, *row)
            for row in self._db.execute(
                "SELECT sample_key, sample_index, byte_offset, byte_size FROM prev.samples "
                "WHERE tar_file_id = ? ORDER BY sample_index",
                (old_id,),
            )
        ]
        before = self._db.total_changes
        self._db.executemany("INSERT OR IGNORE INTO samples VALUES (?, ?, ?, ?, ?)", rows)
        duplicates = [] if self._db.total_changes - before == len(rows) else self._find_duplicates(rows)
        self._db.execute(
            "INSERT INTO sample_parts SELECT ?, sample_index, part_name, content_byte_offset, "
            "content_byte_size FROM prev.sample_parts WHERE tar_file_id = ?",
            (new_id, old_id),
        )
        return duplicates

    def finish(self) -> None:
        for statement in _INDEXES:
            self._db.execute(statement)
        self._db.commit()
        self._db.close()

    def abort(self) -> None:
        self._db.close()
        self.path.unlink(missing_ok=True)


def shard_row_count(index: Path, tar_file_id: int) -> int:
    """How many samples an existing index holds for one shard (0 if the file is unusable)."""
    try:
        db = sqlite3.connect(f"file:{index}?mode=ro", uri=True)
        try:
            return db.execute(
                "SELECT COUNT(*) FROM samples WHERE tar_file_id = ?", (tar_file_id,)
            ).fetchone()[0]
        finally:
            db.close()
    except sqlite3.Error:
        return 0
