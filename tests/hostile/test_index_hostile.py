"""Broken or stale indexes and metadata files (issue 13, items 4 and 7).

A ``.tar.idx`` whose offsets go backwards or past the tar, a shard that grew after prepare by
less than its end-of-archive padding, a non-UTF-8 ``.nv-meta`` file and a corrupt
``index.sqlite`` must each end in our own error naming the file (or, for ``prepare``, in a
re-scan), never in a bare exception, a MemoryError or silently missing samples.
"""

from __future__ import annotations

import io
import logging
import os
import sqlite3
import tarfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from energon_lite_dev.synthetic import write_tar

from megatron_energon_lite.cli.main import cli
from megatron_energon_lite.errors import ConfigError, DatasetError
from megatron_energon_lite.format.metadata import read_info, read_split_config
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.format.split_reader import SplitReader
from megatron_energon_lite.format.tar_index import index_path, read_tar_index

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def prepared(tmp_path: Path) -> Path:
    root = tmp_path / "ds"
    for shard in range(2):
        write_tar(root / f"shards/{shard}.tar", [(f"s{shard}_{i:03d}", {"txt": f"text {shard} {i}".encode()}) for i in range(6)])
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1)
    return root


def _read_all(root: Path) -> list[str]:
    reader = SplitReader(root, "train")
    try:
        return [reader.read(i).key for i in range(len(reader))]
    finally:
        reader.close()


def _edit_index(root: Path, edit) -> None:
    path = index_path(root / "shards/0.tar")
    offsets = np.fromfile(path, dtype="<u8")
    edit(offsets)
    offsets.tofile(path)


# --- .tar.idx -----------------------------------------------------------------------------------


def test_offsets_going_backwards(prepared: Path) -> None:
    def swap(offsets):
        offsets[2], offsets[3] = offsets[3], offsets[2]

    _edit_index(prepared, swap)
    with pytest.raises(DatasetError, match=r"offsets are not increasing(.|\n)*shards/0.tar.idx, entries 2 and 3(.|\n)*found: 3072 then 2048(.|\n)*fix: run"):
        _read_all(prepared)


def test_offset_far_past_the_end_is_not_a_memory_error(prepared: Path) -> None:
    def huge(offsets):
        offsets[3] = 2**63 + 5  # used to make the reader allocate 8 EiB

    _edit_index(prepared, huge)
    with pytest.raises(DatasetError, match=r"not increasing(.|\n)*shards/0.tar.idx(.|\n)*found: 9223372036854775813 then"):
        _read_all(prepared)


def test_last_offset_past_the_end_of_the_tar(prepared: Path) -> None:
    size = (prepared / "shards/0.tar").stat().st_size

    def past(offsets):
        offsets[-1] = size + 512

    _edit_index(prepared, past)
    with pytest.raises(DatasetError, match=r"stale(.|\n)*shards/0.tar(.|\n)*found: \d+ bytes"):
        _read_all(prepared)


def _append_member(tar: Path, name: str, data: bytes) -> None:
    with tarfile.open(tar, "a", format=tarfile.USTAR_FORMAT) as archive:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))


def test_shard_that_grew_by_less_than_its_padding_is_stale(prepared: Path) -> None:
    tar = prepared / "shards/0.tar"
    before = tar.stat().st_size
    _append_member(tar, "s0_999.txt", b"appended after prepare")
    assert tar.stat().st_size - before < 11 * 1024  # inside the window the size check allows
    with pytest.raises(DatasetError, match=r"stale(.|\n)*shards/0.tar at byte \d+(.|\n)*found: non-zero bytes b's0_999.txt(.|\n)*prepare"):
        _read_all(prepared)
    # lint says the same, and re-running prepare is the fix the message gives
    result = CliRunner().invoke(cli, ["lint", str(prepared), "--no-progress"])
    assert result.exit_code == 1 and "members were added after prepare" in result.output, result.output
    prepare_dataset(prepared, tar_index_only=True, progress=False, num_workers=1)
    assert _read_all(prepared)[-7:-6] == ["s0_999"]


def test_same_size_tar_with_extra_zero_padding_is_still_fresh(prepared: Path) -> None:
    """Valid data is unchanged: zero blocks after the end of the archive are not a change."""
    tar = prepared / "shards/0.tar"
    tar.write_bytes(tar.read_bytes() + bytes(1024))
    assert len(_read_all(prepared)) == 12


def test_read_tar_index_checks_without_a_pool(prepared: Path) -> None:
    tar = prepared / "shards/1.tar"
    _append_member(tar, "s1_999.txt", b"x")
    with pytest.raises(DatasetError, match="members were added after prepare"):
        read_tar_index(tar, expected_samples=6, tar_size=tar.stat().st_size)


# --- .nv-meta files -----------------------------------------------------------------------------


def test_non_utf8_info_json_names_the_file(prepared: Path) -> None:
    (prepared / ".nv-meta/.info.json").write_bytes(b'{"shard_counts": {"shards/\xff.tar": 6}}')
    with pytest.raises(ConfigError, match=r"not valid UTF-8(.|\n)*\.nv-meta/\.info\.json, byte 26(.|\n)*fix: "):
        read_info(prepared)


def test_non_utf8_split_yaml_names_the_file(prepared: Path) -> None:
    (prepared / ".nv-meta/split.yaml").write_bytes(b"split_parts:\n  train: [shards/\xfe.tar]\n")
    with pytest.raises(ConfigError, match=r"not valid UTF-8(.|\n)*\.nv-meta/split\.yaml"):
        read_split_config(prepared)


# --- index.sqlite -------------------------------------------------------------------------------


def _corrupt_keeping_stamp(path: Path, stat: os.stat_result, data: bytes) -> None:
    """Writes ``data`` with the size and mtime ``path`` had: prepare's stamp still matches."""
    path.write_bytes(data[: stat.st_size] + bytes(max(0, stat.st_size - len(data))))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


@pytest.mark.parametrize("damage", ["header", "pages", "no tables"])
def test_reprepare_over_a_corrupt_index_rescans(prepared: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    """The previous index looks unchanged (same size and mtime) but cannot be read: prepare
    re-scans every shard instead of failing with a bare sqlite3 error."""
    index = prepared / ".nv-meta/index.sqlite"
    original, stat = index.read_bytes(), index.stat()
    if damage == "header":
        data = b"not a database!!" + original[16:]
    elif damage == "pages":
        data = original[:4096] + np.random.default_rng(1).integers(0, 256, len(original) - 4096, dtype=np.uint8).tobytes()
    else:
        index.unlink()
        db = sqlite3.connect(index)
        db.execute("CREATE TABLE unrelated (a)")
        db.commit()
        db.close()
        data = index.read_bytes()
    _corrupt_keeping_stamp(index, stat, data)
    with caplog.at_level(logging.WARNING):
        result = prepare_dataset(prepared, split_ratio=(1, 0, 0), progress=False, force_overwrite=True, num_workers=1)
    assert sorted(result.scanned) == ["shards/0.tar", "shards/1.tar"] and result.reused == []
    assert any("index.sqlite" in r.getMessage() and "scanned again" in r.getMessage() for r in caplog.records)
    assert len(_read_all(prepared)) == 12
    with sqlite3.connect(index) as db:
        assert db.execute("SELECT COUNT(*) FROM samples").fetchone() == (12,)


def test_info_on_a_corrupt_index_sqlite_names_the_file(tmp_path: Path) -> None:
    from energon_lite_dev.synthetic import generate_text_dataset

    from megatron_energon_lite.errors import DatasetError
    from megatron_energon_lite.format.media_metadata import media_counts

    root = tmp_path / "texts"
    generate_text_dataset(root, num_shards=1, samples_per_shard=4, seed=1)
    from megatron_energon_lite.format.prepare import prepare_dataset

    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1)
    index = root / ".nv-meta" / "index.sqlite"
    index.write_bytes(b"this is not a database" * 100)
    with pytest.raises(DatasetError, match=r"(?s)cannot read the dataset's sample index.*index\.sqlite.*energon-lite prepare"):
        media_counts(root)
