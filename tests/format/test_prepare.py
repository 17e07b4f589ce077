import json
import os
import sqlite3
import tarfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from energon_lite_dev.synthetic import write_tar
from hypothesis import given
from hypothesis import strategies as st

from megatron_energon_lite.errors import ConfigError, DatasetError, EmptyDatasetError
from megatron_energon_lite.format.metadata import read_info, read_split_config
from megatron_energon_lite.format.prepare import prepare_dataset, split_counts_by_ratio
from megatron_energon_lite.format.tar_index import read_tar_index

from conftest import tar_members, text_samples


def _expected_index(tar: Path) -> list[int]:
    """Energon's .tar.idx: first header offset of each key run, then tarfile's end offset."""
    with tarfile.open(tar, "r:") as handle:
        members = handle.getmembers()
        end = handle.offset
    offsets, last_key = [], None
    for member in members:
        key = member.name.split("/")[-1].split(".")[0]
        key = member.name[: len(member.name) - len(member.name.split("/")[-1])] + key
        if key != last_key:
            offsets.append(member.offset)
            last_key = key
    return offsets + [end]


def _meta_files(root: Path) -> list[str]:
    meta = root / ".nv-meta"
    return sorted(p.name for p in meta.iterdir()) if meta.exists() else []


def _db_rows(root: Path) -> tuple[list, list]:
    db = sqlite3.connect(root / ".nv-meta/index.sqlite")
    try:
        samples = db.execute("SELECT * FROM samples ORDER BY tar_file_id, sample_index").fetchall()
        parts = db.execute("SELECT * FROM sample_parts ORDER BY tar_file_id, sample_index, content_byte_offset").fetchall()
    finally:
        db.close()
    return samples, parts


def test_prepare_writes_energon_files(text_dataset: Path) -> None:
    result = prepare_dataset(text_dataset, split_ratio=(2, 1, 1), num_workers=2, progress=False)
    assert result.total_samples == 20
    for shard in result.shard_counts:
        assert list(read_tar_index(text_dataset / shard)) == _expected_index(text_dataset / shard)
    info_text = (text_dataset / ".nv-meta/.info.json").read_text()
    info = json.loads(info_text)
    assert list(info) == ["energon_version", "shard_counts"] and not info_text.endswith("\n")
    assert list(info["shard_counts"]) == sorted(info["shard_counts"])
    split = yaml.safe_load((text_dataset / ".nv-meta/split.yaml").read_text())
    assert list(split) == ["split_parts", "exclude"]
    # Consecutive numbered shards as one brace range, as Energon writes them.
    assert split["split_parts"]["train"] == ["shards/shard_{000..001}.tar"]
    config = read_split_config(text_dataset)
    assert [len(config.expanded_split(part)) for part in config.split_parts] == [2, 1, 1]
    assert len((text_dataset / ".nv-meta/index.uuid").read_text()) == 36
    samples, parts = _db_rows(text_dataset)
    assert len(samples) == 20 and len(parts) == 40
    # Part rows point at the member data exactly as tarfile sees it.
    shard0 = text_dataset / "shards/shard_000.tar"
    data = {(t.name, t.offset_data, t.size) for t in tar_members(shard0)}
    for tar_id, index, part, offset, size in parts:
        if tar_id == 0:
            key = samples[index][1]
            assert (f"{key}.{part}", offset, size) in data


def test_ratio_split_loses_no_shard(tmp_path: Path) -> None:
    for shard in range(10):
        write_tar(tmp_path / f"d/s{shard:02d}.tar", text_samples(f"k{shard}_", 2))
    result = prepare_dataset(tmp_path / "d", split_ratio=(7, 2, 1), progress=False, num_workers=1)
    assert {k: len(v) for k, v in result.splits.items()} == {"train": 7, "val": 2, "test": 1}
    assert sorted(s for v in result.splits.values() for s in v) == sorted(result.shard_counts)


@given(num=st.integers(0, 500), ratio=st.lists(st.floats(0, 100), min_size=1, max_size=5).filter(lambda r: sum(r) > 0))
def test_split_counts_are_exhaustive_and_close_to_ratio(num, ratio) -> None:
    counts = split_counts_by_ratio(num, ratio)
    assert sum(counts) == num and min(counts) >= 0
    for count, r in zip(counts, ratio):
        assert abs(count - num * r / sum(ratio)) < 2


def test_split_parts_by_pattern(tmp_path: Path) -> None:
    for part in ("train", "val"):
        for shard in range(2):
            write_tar(tmp_path / f"d/{part}/s{shard}.tar", text_samples(f"{part}{shard}_", 3))
    result = prepare_dataset(tmp_path / "d", split_parts=[("train", "train/.*"), ("val", "val/s{0..1}")], progress=False)
    assert result.splits == {"train": ["train/s0.tar", "train/s1.tar"], "val": ["val/s0.tar", "val/s1.tar"]}
    with pytest.raises(ConfigError, match="matches no shard"):
        prepare_dataset(tmp_path / "d", split_parts=[("test", "test/.*")], force_overwrite=True, progress=False)


def test_duplicate_keys_write_nothing(tmp_path: Path) -> None:
    root = tmp_path / "d"
    write_tar(root / "a.tar", text_samples("k", 3))
    write_tar(root / "b.tar", text_samples("k", 2, start=2))  # k000002 is in both shards
    with pytest.raises(DatasetError) as info:
        prepare_dataset(root, split_ratio=(1, 0, 0), progress=False)
    message = str(info.value)
    assert "'k000002'" in message and "a.tar" in message and "b.tar" in message
    assert _meta_files(root) == []
    assert not list(root.glob("*.idx"))


def test_empty_and_corrupt_shards_fail_cleanly(tmp_path: Path) -> None:
    root = tmp_path / "d"
    write_tar(root / "a.tar", text_samples("k", 3))
    (root / "empty.tar").write_bytes(b"")
    with pytest.raises(EmptyDatasetError, match="empty.tar"):
        prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1)
    (root / "empty.tar").write_bytes(b"\0" * 1024)
    with pytest.raises(EmptyDatasetError, match="no samples"):
        prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1)
    (root / "empty.tar").unlink()
    good = (root / "a.tar").read_bytes()
    (root / "b.tar").write_bytes(good[: len(good) // 2 + 100])
    with pytest.raises(DatasetError, match="b.tar"):
        prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=2)
    assert _meta_files(root) == []


def test_no_tars(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    with pytest.raises(DatasetError, match="no tar files"):
        prepare_dataset(tmp_path / "d", split_ratio=(1, 0, 0), progress=False)


def test_reprepare_needs_force_and_rescans_only_changed_shards(text_dataset: Path) -> None:
    first = prepare_dataset(text_dataset, split_ratio=(2, 1, 1), progress=False, num_workers=2)
    assert len(first.scanned) == 4
    with pytest.raises(ConfigError, match="already prepared"):
        prepare_dataset(text_dataset, split_ratio=(2, 1, 1), progress=False)
    again = prepare_dataset(text_dataset, split_ratio=(2, 1, 1), progress=False, force_overwrite=True)
    assert again.scanned == [] and len(again.reused) == 4
    assert _db_rows(text_dataset) == _db_rows_fresh(text_dataset, tmp_copy=text_dataset.parent / "fresh1")

    changed = text_dataset / "shards/shard_001.tar"
    write_tar(changed, text_samples("s1_", 7), tar_format="gnu")
    os.utime(changed, ns=(1, 1))  # a new mtime even on coarse clocks
    third = prepare_dataset(text_dataset, split_ratio=(2, 1, 1), progress=False, force_overwrite=True)
    assert third.scanned == ["shards/shard_001.tar"]
    assert read_info(text_dataset).shard_counts["shards/shard_001.tar"] == 7
    assert _db_rows(text_dataset) == _db_rows_fresh(text_dataset, tmp_copy=text_dataset.parent / "fresh2")


def _db_rows_fresh(root: Path, tmp_copy: Path):
    """The index a from-scratch prepare of the same tars gives."""
    import shutil

    shutil.copytree(root, tmp_copy, ignore=shutil.ignore_patterns(".nv-meta", "*.idx"))
    prepare_dataset(tmp_copy, split_ratio=(2, 1, 1), progress=False, num_workers=1)
    return _db_rows(tmp_copy)


def test_failed_reprepare_keeps_old_metadata(text_dataset: Path) -> None:
    prepare_dataset(text_dataset, split_ratio=(2, 1, 1), progress=False)
    before = {name: (text_dataset / ".nv-meta" / name).read_bytes() for name in _meta_files(text_dataset)}
    write_tar(text_dataset / "shards/shard_009.tar", text_samples("s0_", 1))  # duplicates a key
    with pytest.raises(DatasetError, match="duplicate"):
        prepare_dataset(text_dataset, split_ratio=(2, 1, 1), progress=False, force_overwrite=True)
    after = {name: (text_dataset / ".nv-meta" / name).read_bytes() for name in _meta_files(text_dataset)}
    assert after == before


def test_tar_index_only_keeps_splits_and_excludes(text_dataset: Path) -> None:
    prepare_dataset(text_dataset, split_ratio=(2, 1, 1), progress=False)
    split_path = text_dataset / ".nv-meta/split.yaml"
    config = yaml.safe_load(split_path.read_text())
    config["exclude"] = ["shards/shard_003.tar"]
    split_path.write_text(yaml.safe_dump(config))
    (text_dataset / "shards/shard_000.tar.idx").unlink()
    result = prepare_dataset(text_dataset, tar_index_only=True, progress=False)
    assert result.scanned == ["shards/shard_000.tar"]
    assert read_split_config(text_dataset).exclude == ["shards/shard_003.tar"]
    assert np.array_equal(read_tar_index(text_dataset / "shards/shard_000.tar"), _expected_index(text_dataset / "shards/shard_000.tar"))


def test_shards_are_ordered_like_energon(tmp_path: Path) -> None:
    root = tmp_path / "d"
    names = ["d/a.tar", "d/a/b.tar", "d/a-c.tar", "d/a_d.tar", "d/B.tar"]
    for i, name in enumerate(names):
        write_tar(root / name, text_samples(f"k{i}_", 1))
    result = prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1)
    # Energon sorts pathlib paths, i.e. component by component.
    assert list(result.shard_counts) == [p.as_posix() for p in sorted(Path(n) for n in names)]
