"""index.sqlite writer: Energon's row-batch interface, duplicate keys, and the on-disk format."""

from __future__ import annotations

import pickle
import sqlite3
from pathlib import Path

import pytest
from conftest import text_samples
from energon_lite_dev.synthetic import write_tar

from megatron_energon_lite.energon.epathlib import EPath
from megatron_energon_lite.errors import ConfigError, DatasetError
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.format.sqlite_index import (
    DuplicateKey,
    DuplicateSampleKeyError,
    IndexMediaMetadata,
    IndexSample,
    IndexSamplePart,
    SqliteIndexWriter,
)


def samples(tar_file_id: int, keys: list[str], start: int = 0) -> list[IndexSample]:
    return [
        IndexSample(tar_file_id=tar_file_id, sample_key=key, sample_index=start + i, byte_offset=100 * i, byte_size=100)
        for i, key in enumerate(keys)
    ]


def parts(tar_file_id: int, count: int) -> list[IndexSamplePart]:
    return [
        IndexSamplePart(tar_file_id=tar_file_id, sample_index=i, part_name=name, content_byte_offset=100 * i + off, content_byte_size=10)
        for i in range(count)
        for name, off in (("txt", 512), ("json", 1536))
    ]


def dump(path: Path) -> dict:
    """Schema objects (names, not SQL text) and all rows, ordered."""
    db = sqlite3.connect(path)
    try:
        objects = sorted(db.execute("SELECT type, name, tbl_name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"))
        tables = {
            name: sorted(db.execute(f"SELECT * FROM {name}")) for kind, name, _ in objects if kind == "table" and name != "media_filters"
        }
        columns = {
            name: [(c[1], c[2], c[3]) for c in db.execute(f"PRAGMA table_info({name})")] for kind, name, _ in objects if kind == "table"
        }
        return {"objects": objects, "tables": tables, "columns": columns}
    finally:
        db.close()


def write_rows(writer) -> None:
    writer.append_samples(samples(0, ["a", "b", "c"]))
    writer.append_samples(samples(1, ["d", "e"]))
    writer.append_parts(parts(0, 3))
    writer.append_parts(parts(1, 2))


def test_rows_written_in_batches_are_indexed(tmp_path: Path) -> None:
    path = tmp_path / "nested/index.sqlite"
    with SqliteIndexWriter(EPath(path)) as writer:
        write_rows(writer)
    assert writer.db is None
    content = dump(path)
    assert [row[1] for row in content["tables"]["samples"]] == ["a", "b", "c", "d", "e"]
    assert len(content["tables"]["sample_parts"]) == 10
    assert {name for kind, name, _ in content["objects"] if kind == "index"} == {
        "idx_samples_by_tar_and_idx",
        "idx_sample_parts_seq",
        "idx_sample_parts_full",
    }


def test_duplicate_in_one_batch_writes_none_of_it(tmp_path: Path) -> None:
    path = tmp_path / "index.sqlite"
    with SqliteIndexWriter(path) as writer:
        writer.append_samples(samples(0, ["kept"]))
        with pytest.raises(DuplicateSampleKeyError) as info:
            writer.append_samples(samples(1, ["x", "dup", "y"]) + samples(2, ["dup"]))
        keys = [row[0] for row in writer.db.execute("SELECT sample_key FROM samples")]
    error = info.value
    assert error.sample_key == "dup" and keys == ["kept"]
    assert isinstance(error, DatasetError) and isinstance(error, RuntimeError)
    message = str(error)
    assert "'dup'" in message and "tar_file_id 1 sample 1" in message and "tar_file_id 2 sample 0" in message
    assert str(path) in message and "fix:" in message


def test_duplicate_of_an_earlier_batch_names_both_places(tmp_path: Path) -> None:
    with SqliteIndexWriter(tmp_path / "index.sqlite") as writer:
        writer.append_samples(samples(0, ["a", "b"]))
        with pytest.raises(DuplicateSampleKeyError, match="already indexed at tar_file_id 0 sample 1") as info:
            writer.append_samples(samples(3, ["c", "b"]))
    assert info.value.sample_key == "b"
    assert [row[1] for row in dump(tmp_path / "index.sqlite")["tables"]["samples"]] == ["a", "b"]


def test_duplicate_error_survives_pickling() -> None:
    error = DuplicateSampleKeyError.from_duplicates([DuplicateKey("k", (0, 1), (2, 3))], ["a.tar", "b", "c.tar"])
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is DuplicateSampleKeyError and again.sample_key == "k"
    assert again.duplicates == error.duplicates and str(again) == str(error)
    assert "'k': a.tar sample 1 and c.tar sample 3" in str(again)


def test_prepare_reports_duplicates_with_the_energon_error(tmp_path: Path) -> None:
    root = tmp_path / "d"
    write_tar(root / "a.tar", text_samples("k", 3))
    write_tar(root / "b.tar", text_samples("k", 2, start=2))
    with pytest.raises(DuplicateSampleKeyError) as info:
        prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1)
    assert info.value.sample_key == "k000002"
    assert [(d.first, d.again) for d in info.value.duplicates] == [((0, 2), (1, 0))]


def test_misuse_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="rebuilt from scratch"):
        SqliteIndexWriter(tmp_path / "a.sqlite", reset_tables=False)
    writer = SqliteIndexWriter(tmp_path / "b.sqlite")
    with pytest.raises(ConfigError, match="enable_media_metadata=True"):
        writer.append_media_metadata_batch([IndexMediaMetadata(entry_key="a.jpg", metadata_type="image", metadata_json="{}")])
    writer.close()
    writer.close()  # a second close does nothing
    with pytest.raises(DatasetError, match="already closed"):
        writer.append_samples(samples(0, ["a"]))

    class Remote:
        def __fspath__(self) -> str:
            raise TypeError("remote")

        def __str__(self) -> str:
            return "s3://bucket/index.sqlite"

    with pytest.raises(ConfigError, match="local file system"):
        SqliteIndexWriter(Remote())


def test_media_tables_can_be_added_to_an_existing_index(tmp_path: Path) -> None:
    path = tmp_path / "index.sqlite"
    with SqliteIndexWriter(path) as writer:
        write_rows(writer)
    with SqliteIndexWriter(path, enable_sample_tables=False, enable_media_metadata=True) as writer:
        writer.append_media_metadata_batch([IndexMediaMetadata(entry_key="a.jpg", metadata_type="image", metadata_json='{"w": 1}')])
        writer.append_media_filter(strategy="glob", patterns="*.jpg")
        writer.append_media_filter(strategy="glob", patterns="*.jpg")  # one row per distinct filter
    content = dump(path)
    assert len(content["tables"]["samples"]) == 5  # sample tables left alone
    assert content["tables"]["media_metadata"] == [("a.jpg", "image", '{"w": 1}')]
    db = sqlite3.connect(path)
    assert db.execute("SELECT strategy, patterns FROM media_filters").fetchall() == [("glob", "*.jpg")]
    db.close()


@pytest.mark.energon
def test_same_file_as_energons_writer(tmp_path: Path) -> None:
    indexing = pytest.importorskip("megatron.energon.flavors.webdataset.indexing")
    energon_prepare = pytest.importorskip("megatron.energon.flavors.webdataset.prepare")
    from megatron.energon.epathlib import EPath as EnergonPath

    class Rows:
        """Our row objects are the same shape as Energon's; build Energon's for its writer."""

        def __init__(self, writer) -> None:
            self.writer = writer

        def append_samples(self, rows) -> None:
            self.writer.append_samples([energon_prepare.IndexSample(**{f: getattr(r, f) for f in r.__slots__}) for r in rows])

        def append_parts(self, rows) -> None:
            self.writer.append_parts([energon_prepare.IndexSamplePart(**{f: getattr(r, f) for f in r.__slots__}) for r in rows])

    with indexing.SqliteIndexWriter(EnergonPath(tmp_path / "energon.sqlite")) as theirs:
        write_rows(Rows(theirs))
    with SqliteIndexWriter(tmp_path / "ours.sqlite") as ours:
        write_rows(ours)
    assert dump(tmp_path / "ours.sqlite") == dump(tmp_path / "energon.sqlite")
