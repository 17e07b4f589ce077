"""``SqliteIndexWriter.update_copy``: a copy of a previous index with some shards' rows replaced.

What prepare gets from it is tested end to end in ``test_prepare_many_shards.py``; here, the
writer's own contract: the previous file is never changed, nothing is left behind when the copy
is refused or unusable, and the result holds the rows a fresh writer would hold.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from megatron_energon_lite.errors import ConfigError
from megatron_energon_lite.format.sqlite_index import (
    IndexMismatchError,
    IndexSample,
    SqliteIndexWriter,
)


def _rows(shard: int, count: int, tag: str = "") -> tuple[list[tuple], list[tuple]]:
    samples = [(shard, f"s{shard}_{i}{tag}", i, 1024 * i, 1024) for i in range(count)]
    parts = [(shard, i, part, 1024 * i + offset, 10) for i in range(count) for part, offset in (("txt", 512), ("cls", 1536))]
    return samples, parts


def _write(path: Path, counts: dict[int, int], tags: dict[int, str] | None = None) -> None:
    writer = SqliteIndexWriter(path, scratch=True)
    for shard, count in counts.items():
        assert writer.add_rows(*_rows(shard, count, (tags or {}).get(shard, ""))) == []
    writer.finish()


def _content(path: Path) -> dict[str, list]:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {
            "schema": db.execute("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY name").fetchall(),
            "samples": db.execute("SELECT * FROM samples ORDER BY tar_file_id, rowid").fetchall(),
            "sample_parts": db.execute("SELECT * FROM sample_parts ORDER BY tar_file_id, rowid").fetchall(),
        }
    finally:
        db.close()


@pytest.fixture
def previous(tmp_path: Path) -> Path:
    path = tmp_path / "previous.sqlite"
    _write(path, {0: 3, 1: 2, 2: 4, 3: 1})
    return path


def test_update_holds_what_a_fresh_writer_writes(previous: Path, tmp_path: Path) -> None:
    before = previous.read_bytes()
    writer = SqliteIndexWriter.update_copy(tmp_path / "new.sqlite", previous, keep={0: 3, 2: 4, 3: 1}, shard_count=4)
    assert writer is not None
    assert writer.add_rows(*_rows(1, 5, "x")) == []  # shard 1 changed: five other samples
    writer.finish()
    fresh = tmp_path / "fresh.sqlite"
    _write(fresh, {0: 3, 1: 5, 2: 4, 3: 1}, {1: "x"})
    assert _content(tmp_path / "new.sqlite") == _content(fresh)
    assert previous.read_bytes() == before


def test_another_layout_is_refused_and_leaves_no_file(previous: Path, tmp_path: Path) -> None:
    db = sqlite3.connect(previous)
    db.execute("CREATE INDEX idx_extra ON sample_parts(part_name)")
    db.commit()
    db.close()
    target = tmp_path / "new.sqlite"
    assert SqliteIndexWriter.update_copy(target, previous, keep={0: 3, 1: 2, 2: 4, 3: 1}, shard_count=4) is None
    assert not target.exists()
    # Tables the caller rebuilds itself are allowed.
    db = sqlite3.connect(previous)
    db.execute("DROP INDEX idx_extra")
    db.execute("CREATE TABLE media_metadata (entry_key TEXT PRIMARY KEY, metadata_type TEXT, metadata_json TEXT)")
    db.commit()
    db.close()
    assert SqliteIndexWriter.update_copy(target, previous, keep={0: 3}, shard_count=4) is None
    writer = SqliteIndexWriter.update_copy(target, previous, keep={0: 3}, shard_count=4, other_tables=("media_metadata",))
    assert writer is not None
    writer.abort()
    assert not target.exists()


def test_a_kept_shard_with_other_rows_raises_and_leaves_no_file(previous: Path, tmp_path: Path) -> None:
    target = tmp_path / "new.sqlite"
    with pytest.raises(IndexMismatchError, match="tar_file_id 2") as info:
        SqliteIndexWriter.update_copy(target, previous, keep={0: 3, 2: 5}, shard_count=4)
    assert str(previous) in str(info.value) and "5 samples" in str(info.value)
    assert not target.exists()
    previous.write_bytes(b"not a database" * 100)
    with pytest.raises(sqlite3.DatabaseError):
        SqliteIndexWriter.update_copy(target, previous, keep={0: 3}, shard_count=4)
    assert not target.exists()


def test_rows_of_unknown_shards_go_and_a_failed_batch_cannot_be_undone(previous: Path, tmp_path: Path) -> None:
    # Shard ids 2 and 3 are gone from the dataset (shard_count 2): their rows are deleted too.
    writer = SqliteIndexWriter.update_copy(tmp_path / "new.sqlite", previous, keep={0: 3}, shard_count=2)
    assert writer is not None
    duplicates = writer.add_rows(*_rows(1, 1, "y"))
    assert duplicates == []
    # The writer keeps no rollback journal, so Energon's all-or-nothing batches are refused.
    with pytest.raises(ConfigError, match="update_copy"):
        writer.append_samples([IndexSample(tar_file_id=1, sample_key="k", sample_index=1, byte_offset=0, byte_size=1)])
    writer.finish()
    content = _content(tmp_path / "new.sqlite")
    assert sorted({row[0] for row in content["samples"]}) == [0, 1]
    assert [row[1] for row in content["samples"]] == ["s0_0", "s0_1", "s0_2", "s1_0y"]
    assert {row[0] for row in content["sample_parts"]} == {0, 1}
