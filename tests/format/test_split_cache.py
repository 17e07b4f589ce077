"""``.nv-meta/.lite-split-cache.json``: prepare's start-up summary (the counts of every split).

The loader resolves a split from the summary only while the split file and ``.info.json`` hold
the bytes it was made from; it must then give exactly what resolving the files gives, and
anything else (a stale, corrupt or tampered summary, a split it does not hold) falls back to the
files, so the files stay the truth.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from energon_lite_dev.synthetic import write_numbered_shards

from megatron_energon_lite.errors import DatasetError, EmptyDatasetError
from megatron_energon_lite.format import metadata, split_cache
from megatron_energon_lite.format.metadata import resolve_split
from megatron_energon_lite.format.metadataset import LeafDataset
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.format.resolved import resolve_dataset
from megatron_energon_lite.format.split_cache import (
    SPLIT_CACHE,
    cached_split,
    write_split_cache,
)

DATASET_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"
SPLITS = [("train", r"parts/data-[0-3]\.tar"), ("val", r"parts/data-4\.tar"), ("test", r"parts/data-5\.tar")]


def _write_split_yaml(root: Path, text: str) -> None:
    (root / ".nv-meta" / "split.yaml").write_text(text)


@pytest.fixture()
def dataset(tmp_path: Path) -> Path:
    root = tmp_path / "ds"
    write_numbered_shards(root, shards=6, per_shard=3)
    prepare_dataset(root, split_parts=SPLITS, progress=False, dataset_yaml=DATASET_YAML)
    # Excludes: a whole shard, two sample keys, and one entry that names nothing.
    split = (root / ".nv-meta" / "split.yaml").read_text()
    _write_split_yaml(root, split.replace("exclude: []", "exclude:\n- parts/data-2.tar\n- parts/data-0.tar/000001\n- parts/data-1.tar/000004\n- parts/nothing.tar"))
    assert write_split_cache(root)
    return root


def _leaf(root: Path, split: str) -> LeafDataset:
    return LeafDataset(path=str(root), split_part=split, where="test")


def _from_files(root: Path, split: str, **kwargs):
    return resolve_split(root, split, **kwargs)


def _same(a, b) -> None:
    assert (a.split_part, list(a.names), list(a.counts), a.excluded_keys) == (b.split_part, list(b.names), list(b.counts), b.excluded_keys)


def test_prepare_writes_the_cache(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    write_numbered_shards(root, shards=6, per_shard=3)
    prepare_dataset(root, split_parts=SPLITS, progress=False)
    data = json.loads((root / ".nv-meta" / SPLIT_CACHE).read_text())
    assert sorted(data["splits"]) == ["test", "train", "val"]
    assert data["splits"]["train"]["counts"] == [[3, 4]]  # four shards of three samples, run-length encoded
    assert "names" not in data["splits"]["train"]  # the names are the split file's
    # split.yaml in Energon's spelling: a brace range per run of numbered shards.
    assert "- parts/data-{0..3}.tar" in (root / ".nv-meta" / "split.yaml").read_text()
    assert cached_split(root, "train", None).names == [f"parts/data-{i}.tar" for i in range(4)]


@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_cache_gives_what_the_files_give(dataset: Path, split: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        from_files = _from_files(dataset, split)
    warned = [r.getMessage() for r in caplog.records]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        cached = cached_split(dataset, split, None)
    assert cached is not None
    _same(cached, from_files)
    assert [r.getMessage() for r in caplog.records] == warned  # the exclude that names nothing, again
    assert any("parts/nothing.tar" in message for message in warned)
    if split == "train":
        assert "parts/data-2.tar" not in cached.names
        assert cached.excluded_keys == {"parts/data-0.tar": frozenset({"000001"}), "parts/data-1.tar": frozenset({"000004"})}


def test_loader_resolves_from_the_cache_without_parsing_the_info_file(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The split file is read (the names are its); .info.json is not parsed."""
    expected = _from_files(dataset, "train")

    def refuse(*args, **kwargs):
        raise AssertionError(".info.json was parsed although the cache is valid")

    monkeypatch.setattr(metadata, "read_info", refuse)
    monkeypatch.setattr(split_cache, "parse_info", refuse)
    monkeypatch.setattr(metadata, "resolve_unchecked", refuse)
    resolved = resolve_dataset(_leaf(dataset, "train"), dataset_config=None, split_config=None, trust_dataset_code=False)
    _same(resolved.split, expected)
    assert resolved.total == sum(expected.counts)


def test_an_edited_split_file_is_read_instead(dataset: Path) -> None:
    text = (dataset / ".nv-meta" / "split.yaml").read_text()
    _write_split_yaml(dataset, text.replace("exclude:\n- parts/data-2.tar\n", "exclude:\n"))  # no longer excluded
    assert cached_split(dataset, "train", None) is None
    resolved = resolve_dataset(_leaf(dataset, "train"), dataset_config=None, split_config=None, trust_dataset_code=False)
    assert "parts/data-2.tar" in resolved.split.names


def test_an_edited_info_file_is_read_instead(dataset: Path) -> None:
    info = dataset / ".nv-meta" / ".info.json"
    info.write_text(info.read_text().replace('"parts/data-0.tar": 3', '"parts/data-0.tar": 2'))
    assert cached_split(dataset, "train", None) is None
    assert _from_files(dataset, "train").counts[0] == 2


@pytest.mark.parametrize(
    "tamper",
    [
        lambda d: d["splits"]["train"].update(counts=[[-1, 1], [3, 2]]),
        lambda d: d["splits"]["train"].update(counts=[["3", 3]]),
        lambda d: d["splits"]["train"].update(counts=[[3, 2]]),
        lambda d: d["splits"]["train"].update(counts=[[3, 4]]),
        lambda d: d["splits"]["train"].update(counts=[[3, 10**12]]),
        lambda d: d["splits"]["train"].update(counts=[3, 3, 3]),
        lambda d: d.update(unknown_excludes="x"),
        lambda d: d.update(version=99),
        lambda d: d.pop("splits"),
    ],
    ids=["negative", "string-count", "short", "long", "huge-run", "not-runs", "unknown-not-list", "version", "no-splits"],
)
def test_a_tampered_cache_is_ignored(dataset: Path, tamper) -> None:
    path = dataset / ".nv-meta" / SPLIT_CACHE
    data = json.loads(path.read_text())
    tamper(data)
    path.write_text(json.dumps(data))
    assert cached_split(dataset, "train", None) is None
    resolved = resolve_dataset(_leaf(dataset, "train"), dataset_config=None, split_config=None, trust_dataset_code=False)
    _same(resolved.split, _from_files(dataset, "train"))


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe", b"[]", b"null"])
def test_a_corrupt_cache_is_ignored(dataset: Path, content: bytes) -> None:
    (dataset / ".nv-meta" / SPLIT_CACHE).write_bytes(content)
    assert cached_split(dataset, "train", None) is None


def test_another_split_file_is_not_served_from_the_cache(dataset: Path) -> None:
    (dataset / ".nv-meta" / "other.yaml").write_text("split_parts:\n  train:\n  - parts/data-5.tar\nexclude: []\n")
    assert cached_split(dataset, "train", "other.yaml") is None
    assert cached_split(dataset, "train", "split.yaml") is not None


def test_a_split_the_cache_lacks_is_resolved_from_the_files(dataset: Path) -> None:
    assert cached_split(dataset, "holdout", None) is None
    with pytest.raises(Exception, match="holdout"):
        _from_files(dataset, "holdout")


def test_an_empty_split_is_refused_from_the_cache_as_from_the_files(dataset: Path) -> None:
    text = (dataset / ".nv-meta" / "split.yaml").read_text()
    _write_split_yaml(dataset, text.replace("exclude:\n", "exclude:\n- parts/data-5.tar\n"))
    assert write_split_cache(dataset)
    with pytest.raises(EmptyDatasetError) as from_files:
        _from_files(dataset, "test")
    with pytest.raises(EmptyDatasetError) as from_cache:
        cached_split(dataset, "test", None)
    assert str(from_cache.value) == str(from_files.value)
    assert cached_split(dataset, "test", None, allow_empty=True).names == []


def test_no_cache_when_the_files_do_not_resolve(dataset: Path) -> None:
    text = (dataset / ".nv-meta" / "split.yaml").read_text()
    _write_split_yaml(dataset, text.replace("  val:\n", "  val:\n  - parts/unknown.tar\n"))
    assert not write_split_cache(dataset)
    assert not (dataset / ".nv-meta" / SPLIT_CACHE).exists()  # the stale one is gone too
    with pytest.raises(DatasetError, match="parts/unknown.tar"):
        resolve_dataset(_leaf(dataset, "val"), dataset_config=None, split_config=None, trust_dataset_code=False)


def test_energon_reads_a_dataset_with_the_cache(dataset: Path) -> None:
    energon = pytest.importorskip("megatron.energon")
    ds = energon.get_train_dataset(
        str(dataset),
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=energon.WorkerConfig(rank=0, world_size=1, num_workers=0),
        split_part="val",
    )
    assert len(ds) == 3
