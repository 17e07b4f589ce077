"""Datasets behind ``msc://profile/path`` URLs (NVIDIA Multi-Storage Client over fsspec), with an
MSC profile that points at the local moto S3 server: prepared remotely, read sample by sample and
through the loader with 2 workers, and compared with the same dataset read from local disk.

MSC keeps one ``StorageClient`` per *profile name* for the whole process (``multistorageclient.
shortcuts._STORAGE_CLIENT_CACHE``), not per ``MSC_CONFIG`` file, so each test gets empty caches:
otherwise the profile ``lite`` would keep pointing at an earlier test's prefix.  Forked dataloader
workers clear those caches themselves and read ``MSC_CONFIG`` from the inherited environment.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("multistorageclient")
pytest.importorskip("boto3")  # MSC's S3 provider (the ``boto3`` extra of multi-storage-client)

import multistorageclient.shortcuts as msc_shortcuts  # noqa: E402
from energon_lite_dev.synthetic import generate_captioning_dataset  # noqa: E402

from megatron_energon_lite import WorkerConfig, get_savable_loader, get_val_dataset  # noqa: E402
from megatron_energon_lite.format.prepare import prepare_dataset  # noqa: E402
from megatron_energon_lite.format.split_reader import SplitReader  # noqa: E402
from megatron_energon_lite.storage import RemotePath, list_files  # noqa: E402

DATASET_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: CaptioningSample\nfield_map:\n  image: jpg\n  caption: txt\n"
PROFILE = "lite"
SUB = "captions"
NUM_SAMPLES = 3 * 12


@pytest.fixture
def msc(s3_server, s3_url, tmp_path, monkeypatch):
    """An MSC profile ``lite`` rooted at this test's S3 prefix, the captioning set generated locally
    and uploaded (unprepared) under ``<prefix>/captions``; yields ``(local_dir, "msc://lite/captions")``."""
    _use_profile(s3_server, tmp_path, monkeypatch, base_path=s3_url.removeprefix("s3://"))  # bucket/prefix
    local = tmp_path / "local"
    generate_captioning_dataset(local, num_shards=3, samples_per_shard=12, image_size=(16, 16), seed=5)
    s3_server.upload_dir(local, f"{s3_url}/{SUB}")
    yield local, f"msc://{PROFILE}/{SUB}"


def _use_profile(s3_server, tmp_path: Path, monkeypatch, *, base_path: str) -> None:
    """MSC_CONFIG with the profile ``PROFILE`` rooted at ``base_path`` on the moto server, and
    fresh per-process MSC caches for this test (restored, and so dropped, afterwards)."""
    monkeypatch.setenv("ENERGON_LITE_CACHE_DIR", str(tmp_path / "cache"))
    config = {
        "profiles": {
            PROFILE: {
                "storage_provider": {
                    "type": "s3",
                    "options": {"base_path": base_path, "endpoint_url": s3_server.endpoint_url, "region_name": "us-east-1"},
                },
                "credentials_provider": {
                    "type": "S3Credentials",
                    "options": {"access_key": s3_server.access_key, "secret_key": s3_server.secret_key},
                },
            }
        }
    }
    config_file = tmp_path / "msc_config.json"
    config_file.write_text(json.dumps(config))
    monkeypatch.setenv("MSC_CONFIG", str(config_file))
    monkeypatch.setattr(msc_shortcuts, "_STORAGE_CLIENT_CACHE", {})
    monkeypatch.setattr(msc_shortcuts, "_PATH_MAPPING_CACHE", {}, raising=False)  # keyed by MSC_CONFIG


def test_a_dataset_that_is_a_whole_bucket_of_a_root_profile(s3_server, tmp_path, monkeypatch) -> None:
    """A profile with an empty base path, the dataset a bucket: its parent (the profile's root)
    cannot be listed, so nothing may need that listing (Energon's test_prepare_dataset_s3_cmdline)."""
    _use_profile(s3_server, tmp_path, monkeypatch, base_path="")
    bucket = "lite-whole-bucket"
    s3_server.create_bucket(bucket)
    local = tmp_path / "local"
    generate_captioning_dataset(local, num_shards=2, samples_per_shard=3, image_size=(8, 8), seed=1)
    s3_server.upload_dir(local, f"s3://{bucket}")
    url = f"msc://{PROFILE}/{bucket}"
    _prepare_both(local, url)
    ds = get_val_dataset(url, split_part="train", worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), batch_size=2)
    keys = [k for batch in get_savable_loader(ds) for k in batch.__key__]
    reader = SplitReader(local, "train")
    assert sorted(keys) == sorted(reader.read(i).key for i in range(len(reader)))


def _prepare_both(local: Path, url: str) -> None:
    for root in (local, url):
        prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, dataset_yaml=DATASET_YAML)


def test_msc_path_lists_stats_and_reads_ranges(msc) -> None:
    local, url = msc
    root = RemotePath(url)
    shard = root / "shards/data-0000.tar"
    data = (local / "shards/data-0000.tar").read_bytes()
    assert shard.exists() and shard.is_file() and root.is_dir()
    stat = shard.stat()
    assert stat.size == len(data) and stat.version
    assert shard.read_range(100, 1000) == data[100:1000]
    assert shard.read_bytes() == data
    names = sorted(p.relative_to(root).as_posix() for p in (root / "shards").iterdir())
    assert names == sorted(f"shards/{p.name}" for p in (local / "shards").iterdir())
    assert sorted(root.list_files()) == sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file())
    found = list_files(root, ["shards/data-0001.tar", "shards/missing.tar"])
    assert list(found) == ["shards/data-0001.tar"]
    assert found["shards/data-0001.tar"].size == (local / "shards/data-0001.tar").stat().st_size


def test_prepare_over_msc_writes_what_local_prepare_writes(msc, s3_server, s3_url) -> None:
    local, url = msc
    _prepare_both(local, url)
    fs = s3_server.filesystem()
    fs.invalidate_cache()
    for name in ["shards/data-0000.tar.idx", "shards/data-0002.tar.idx", ".nv-meta/split.yaml", ".nv-meta/dataset.yaml"]:
        assert fs.cat_file(f"{s3_url}/{SUB}/{name}") == (local / name).read_bytes(), name
    assert json.loads(fs.cat_file(f"{s3_url}/{SUB}/.nv-meta/.info.json")) == json.loads((local / ".nv-meta/.info.json").read_bytes())
    assert fs.exists(f"{s3_url}/{SUB}/.nv-meta/index.sqlite")


def test_split_reader_over_msc_reads_the_same_bytes(msc) -> None:
    local, url = msc
    _prepare_both(local, url)
    here, there = SplitReader(local, "train"), SplitReader(url, "train")
    assert len(here) == len(there) == NUM_SAMPLES
    for index in range(len(here)):
        a, b = here.read(index), there.read(index, read_until=len(there))
        assert (a.key, a.shard, a.parts) == (b.key, b.shard, b.parts)


def test_loader_over_msc_with_workers_matches_local(msc) -> None:
    local, url = msc
    _prepare_both(local, url)
    ds = get_val_dataset(url, split_part="train", worker_config=WorkerConfig(rank=0, world_size=1, num_workers=2), batch_size=4)
    keys = [k for batch in get_savable_loader(ds) for k in batch.__key__]
    reader = SplitReader(local, "train")
    assert sorted(keys) == sorted(reader.read(i).key for i in range(len(reader)))
