"""A join pairs samples by key: a member shard rewritten after prepare must stop the run, never
pair different keys silently (issue: 4 of 10 rows paired wrong keys)."""

from __future__ import annotations

import io
import re
import sqlite3
import tarfile
from pathlib import Path

import pytest

from megatron_energon_lite import (
    ConfigError,
    DatasetError,
    TextSample,
    WorkerConfig,
    get_loader,
    get_val_dataset,
)
from megatron_energon_lite.format.prepare import prepare_dataset

TEXT_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"
JOIN = f"""__module__: megatron.energon
__class__: MetadatasetV2
splits:
  train:
    join:
      primary: {{path: ./primary}}
      other: {{path: ./other}}
    joiner: {{__module__: {__name__}, __function__: pair}}
"""


def pair(primary: TextSample, other: TextSample) -> TextSample:
    keys = {name: getattr(primary, name) for name in ("__key__", "__restore_key__", "__subflavors__", "__sources__")}
    return TextSample(**keys, text=f"{primary.text} | {other.text}")


def write_shard(path: Path, keys: list[str], prefix: str) -> None:
    """Every member fits one 512-byte block, so any order of the same members has the same layout."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for key in keys:
            data = f"{prefix} {key}".encode()
            info = tarfile.TarInfo(f"{key}.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


@pytest.fixture
def joined(tmp_path: Path) -> Path:
    keys = [f"k{i:03d}" for i in range(10)]
    for name in ("primary", "other"):
        (tmp_path / name).mkdir()
        write_shard(tmp_path / name / "data-0.tar", keys, name)
        prepare_dataset(tmp_path / name, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=TEXT_YAML)
    (tmp_path / "join.yaml").write_text(JOIN)
    return tmp_path


def rows(root: Path, workers: int = 0) -> list:
    config = WorkerConfig(rank=0, world_size=1, num_workers=workers)
    return list(get_loader(get_val_dataset(root / "join.yaml", split_part="train", worker_config=config, batch_size=None)))


def test_an_intact_join_pairs_equal_keys(joined: Path) -> None:
    samples = rows(joined)
    assert len(samples) == 10
    assert [s.text for s in samples] == [f"primary {s.__key__} | other {s.__key__}" for s in samples]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_member_shard_rewritten_in_another_order_stops_the_run(joined: Path, workers: int) -> None:
    shard = joined / "other" / "data-0.tar"
    size = shard.stat().st_size
    write_shard(shard, [f"k{i:03d}" for i in reversed(range(10))], "other")
    assert shard.stat().st_size == size  # the same size: only the keys can tell
    with pytest.raises(DatasetError, match=r"(?s)does not have the primary sample's key.*other.*data-0\.tar.*energon-lite prepare"):
        rows(joined, workers)


@pytest.mark.parametrize(
    ("joiner", "message"),
    [
        ("{__module__: os, __function__: system}", "joiner function os.system comes from the standard library"),
        ("{__module__: builtins, __function__: print}", "joiner function builtins.print comes from the standard library"),
        ("{__module__: yaml, __function__: safe_dump}", "joiner function yaml.safe_dump comes from an installed package"),
    ],
)
def test_a_joiner_from_the_standard_library_or_a_package_is_refused(joined: Path, joiner: str, message: str, monkeypatch) -> None:
    monkeypatch.delenv("ENERGON_LITE_TRUST_DATASET_CODE", raising=False)
    (joined / "join.yaml").write_text(JOIN.replace(f"{{__module__: {__name__}, __function__: pair}}", joiner))
    with pytest.raises(ConfigError, match=rf"(?s){message}.*trust_dataset_code=True"):
        rows(joined)


def test_a_trusted_metadataset_may_name_any_joiner(joined: Path) -> None:
    (joined / "join.yaml").write_text(JOIN.replace(f"{{__module__: {__name__}, __function__: pair}}", "{__module__: builtins, __function__: dict}"))
    config = WorkerConfig(rank=0, world_size=1, num_workers=0)
    samples = list(get_loader(get_val_dataset(joined / "join.yaml", split_part="train", worker_config=config, batch_size=None, trust_dataset_code=True)))
    assert len(samples) == 10
    assert all(set(row) == {"primary", "other"} and row["primary"].__key__ == row["other"].__key__ for row in samples)


@pytest.mark.parametrize("sample_index", [99, -1, 10])
def test_a_join_member_index_row_outside_its_shard_names_the_file_and_row(joined: Path, sample_index: int) -> None:
    """A row past the shard's end was a bare IndexError naming no file; a negative one silently
    overwrote another sample's key."""
    database = joined / "other" / ".nv-meta" / "index.sqlite"
    with sqlite3.connect(database) as db:
        db.execute("UPDATE samples SET sample_index = ? WHERE sample_key = 'k003'", (sample_index,))
    db.close()
    with pytest.raises(DatasetError, match=rf"(?s)points outside its shard.*{re.escape(str(database))}.*k003.*0\.\.9.*sample_index {sample_index}.*energon-lite prepare"):
        rows(joined)
