"""Datasets on S3: prepared remotely, read by the loader with 2 workers, state saved and restored,
and compared key by key with the same dataset read from local disk (moto on 127.0.0.1)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from energon_lite_dev.prepared import prepared_content
from energon_lite_dev.synthetic import generate_captioning_dataset

from megatron_energon_lite import (
    WorkerConfig,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
)
from megatron_energon_lite.cli.main import cli
from megatron_energon_lite.errors import (
    DatasetError,
    MissingDependencyError,
    StorageError,
)
from megatron_energon_lite.format.prepare import FileRanks, prepare_across_ranks, prepare_dataset
from megatron_energon_lite.format.prepare.nodes import PARTS_DIR
from megatron_energon_lite.format.split_reader import SplitReader
from megatron_energon_lite.storage import (
    RemotePath,
    RemoteSettings,
    as_path,
    configure_storage,
    read_counters,
)

DATASET_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: CaptioningSample\nfield_map:\n  image: jpg\n  caption: txt\n"


@pytest.fixture
def remote(s3_server, s3_url, tmp_path, monkeypatch):
    """The captioning set written locally, uploaded unprepared; storage options set for s3://."""
    monkeypatch.setenv("ENERGON_LITE_CACHE_DIR", str(tmp_path / "cache"))
    local = tmp_path / "local"
    generate_captioning_dataset(local, num_shards=3, samples_per_shard=12, image_size=(16, 16), seed=3)
    s3_server.upload_dir(local, s3_url)
    configure_storage("s3", storage_options=s3_server.storage_options())
    yield local, s3_url
    configure_storage("s3", storage_options={})


def _keys(loader, steps: int) -> list[str]:
    keys = []
    for step, batch in enumerate(loader):
        keys += list(batch.__key__)
        if step + 1 == steps:
            break
    return keys


def _prepare_both(local: Path, url: str) -> None:
    for root in (local, url):
        prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, dataset_yaml=DATASET_YAML)


def test_prepare_remote_writes_what_local_prepare_writes(remote, s3_server) -> None:
    local, url = remote
    _prepare_both(local, url)
    fs = s3_server.filesystem()
    fs.invalidate_cache()
    for name in ["shards/data-0000.tar.idx", "shards/data-0002.tar.idx", ".nv-meta/split.yaml", ".nv-meta/dataset.yaml"]:
        assert fs.cat_file(f"{url}/{name}") == (local / name).read_bytes(), name
    remote_info = json.loads(fs.cat_file(f"{url}/.nv-meta/.info.json"))
    assert remote_info == json.loads((local / ".nv-meta/.info.json").read_bytes())
    assert fs.exists(f"{url}/.nv-meta/index.sqlite")


def test_prepare_across_ranks_on_s3_writes_what_one_process_writes(remote, s3_server, tmp_path) -> None:
    local, url = remote
    prepare_dataset(local, split_ratio=(2, 1, 0), progress=False, dataset_yaml=DATASET_YAML, num_workers=1)
    for rank in (1, 0):  # rank 1 writes its parts and returns; rank 0 indexes its share and merges
        prepare_across_ranks(url, FileRanks(rank, 2, 30), split_ratio=(2, 1, 0), progress=False, dataset_yaml=DATASET_YAML, num_workers=1)
    fs = s3_server.filesystem()
    fs.invalidate_cache()
    copy = tmp_path / "copy"
    fs.get(f"{url}/", f"{copy}/", recursive=True)
    assert not (copy / ".nv-meta" / PARTS_DIR).exists()  # removed once merged
    assert prepared_content(copy) == prepared_content(local)  # the start-up summary included (its name)


def test_remote_reprepare_skips_unchanged_shards(remote) -> None:
    local, url = remote
    first = prepare_dataset(url, split_ratio=(1, 0, 0), progress=False)
    assert len(first.scanned) == 3
    again = prepare_dataset(url, split_ratio=(1, 0, 0), progress=False, force_overwrite=True)
    assert again.scanned == [] and sorted(again.reused) == sorted(first.shard_counts)


def test_split_reader_reads_the_same_bytes(remote) -> None:
    local, url = remote
    _prepare_both(local, url)
    here, there = SplitReader(local, "train"), SplitReader(url, "train")
    assert len(here) == len(there) == 36
    for index in range(len(here)):
        a, b = here.read(index), there.read(index, read_until=len(there))
        assert (a.key, a.shard, a.parts) == (b.key, b.shard, b.parts)


def test_read_ahead_fetches_a_slice_in_few_requests(remote) -> None:
    local, url = remote
    _prepare_both(local, url)
    reader = SplitReader(url, "train")
    reader.read(0)  # the index is fetched and cached first
    before = read_counters.requests
    for index in range(12):  # one shard, read as one slice
        reader.read(index, read_until=12)
    assert read_counters.requests - before == 1
    reader.read(12)  # the next shard's index
    before = read_counters.requests
    for index in range(13, 24):  # without the hint: one GET per sample
        reader.read(index)
    assert read_counters.requests - before == 11


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_over_s3_matches_local_and_restores(remote, workers: int) -> None:
    local, url = remote
    _prepare_both(local, url)
    settings = dict(worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers), batch_size=3, shuffle_buffer_size=5, max_samples_per_sequence=4)
    local_keys = _keys(get_savable_loader(get_train_dataset(local, **settings)), 14)
    loader = get_savable_loader(get_train_dataset(url, **settings))
    first = _keys(loader, 5)
    state = loader.save_state_rank()
    rest = _keys(loader, 9)
    assert first + rest == local_keys
    restored = get_savable_loader(get_train_dataset(url, **settings))
    restored.restore_state_rank(state)
    assert _keys(restored, 9) == rest


def test_explicit_storage_options_reach_the_workers(remote, s3_server) -> None:
    local, url = remote
    _prepare_both(local, url)
    configure_storage("s3", storage_options={})  # only the argument names the server now
    ds = get_val_dataset(url, split_part="train", worker_config=WorkerConfig(rank=0, world_size=1, num_workers=2), batch_size=6, storage_options=s3_server.storage_options())
    keys = [k for batch in get_savable_loader(ds) for k in batch.__key__]
    assert sorted(keys) == sorted(SplitReader(local, "train").read(i).key for i in range(36))


def test_metadataset_yaml_on_s3_resolves_relative_paths(remote, s3_server) -> None:
    local, url = remote
    _prepare_both(local, url)
    yaml_text = "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n      - weight: 1\n        path: ../" + url.rsplit("/", 1)[-1] + "\n"
    s3_server.put_bytes(f"{url}-blends/blend.yaml", yaml_text.encode())
    ds = get_val_dataset(f"{url}-blends/blend.yaml", split_part="train", worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), batch_size=4)
    keys = [k for batch in get_savable_loader(ds) for k in batch.__key__]
    assert len(keys) == 36 and len(set(keys)) == 36


def test_cli_prepare_info_lint_preview_on_s3(remote, s3_server, monkeypatch) -> None:
    local, url = remote
    configure_storage("s3", storage_options={})
    # The CLI reads endpoint and credentials the AWS way, from the environment.
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    runner = CliRunner()
    prepared = runner.invoke(cli, ["prepare", url, "--split-ratio", "1,0,0", "--sample-type", "CaptioningSample", "--field-map", '{"image": "jpg", "caption": "txt"}', "--no-progress"], catch_exceptions=False)
    assert prepared.exit_code == 0, prepared.output
    info = runner.invoke(cli, ["info", url], catch_exceptions=False)
    assert info.exit_code == 0 and "36" in info.output, info.output
    lint = runner.invoke(cli, ["lint", url, "--no-progress"], catch_exceptions=False)
    assert lint.exit_code == 0 and "no problems" in lint.output, lint.output
    preview = runner.invoke(cli, ["preview", url, "-n", "2"], catch_exceptions=False)
    assert preview.exit_code == 0 and "0000_000000" in preview.output, preview.output


def test_stale_remote_index_is_detected(remote, s3_server) -> None:
    local, url = remote
    _prepare_both(local, url)
    shard = "shards/data-0001.tar"
    s3_server.put_bytes(f"{url}/{shard}", (local / shard).read_bytes() + bytes(64 * 1024))
    reader = SplitReader(url, "train")
    with pytest.raises(DatasetError, match=r"stale(.|\n)*data-0001.tar(.|\n)*prepare"):
        reader.read(12)


def test_a_changed_index_is_fetched_again(remote, s3_server) -> None:
    local, url = remote
    _prepare_both(local, url)
    SplitReader(url, "train").read(0)
    # A new index of the same size (its end entry moved by one block): the cache must not serve
    # the old copy, whose key has the old ETag.
    offsets = np.frombuffer((local / "shards/data-0000.tar.idx").read_bytes(), dtype="<u8").copy()
    offsets[-1] += 512
    s3_server.put_bytes(f"{url}/shards/data-0000.tar.idx", offsets.tobytes())
    cached = list((Path(RemoteSettings.from_env().resolved_cache_dir())).rglob("*data-0000.tar.idx"))
    assert len(cached) == 1
    SplitReader(url, "train").read(0)
    assert len(list(Path(RemoteSettings.from_env().resolved_cache_dir()).rglob("*data-0000.tar.idx"))) == 2


def test_missing_bucket_and_dataset_errors(remote) -> None:
    with pytest.raises(DatasetError, match="not a prepared dataset|does not exist"):
        get_val_dataset("s3://no-such-bucket-here/data", worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), batch_size=2)


def test_unknown_scheme_names_what_to_install() -> None:
    with pytest.raises(MissingDependencyError, match="nosuchfs://"):
        as_path("nosuchfs://bucket/data").exists()


def test_unwritable_cache_dir_is_a_clear_error(remote, tmp_path, monkeypatch) -> None:
    local, url = remote
    prepare_dataset(url, split_ratio=(1, 0, 0), progress=False, dataset_yaml=DATASET_YAML)
    blocked = tmp_path / "blocked"
    blocked.write_text("a file, not a folder")
    monkeypatch.setenv("ENERGON_LITE_CACHE_DIR", str(blocked / "cache"))
    with pytest.raises(StorageError, match="ENERGON_LITE_CACHE_DIR"):
        SplitReader(url, "train").read(0)


def test_remote_path_pickles_without_a_connection(s3_server) -> None:
    import pickle

    path = RemotePath("s3://bucket/a/b.tar", s3_server.storage_options())
    again = pickle.loads(pickle.dumps(path))
    assert again == path and again.storage_options == path.storage_options
    assert (again.parent / "c.tar").url == "s3://bucket/a/c.tar" and again.with_suffix(".tar.idx").name == "b.tar.idx"


def test_missing_credentials_are_a_clear_error(remote, s3_server, tmp_path, monkeypatch) -> None:
    local, url = remote
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance-metadata lookup off 127.0.0.1
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    options = s3_server.storage_options()
    del options["key"], options["secret"]
    configure_storage("s3", storage_options={**options, "skip_instance_cache": True})
    with pytest.raises(StorageError, match=r"no usable credentials(.|\n)*AWS_PROFILE"):
        prepare_dataset(url, split_ratio=(1, 0, 0), progress=False)


def test_interleaved_slices_each_keep_their_block(remote) -> None:
    """A worker reads several slices at once: each keeps its own block, nothing is fetched twice."""
    local, url = remote
    _prepare_both(local, url)
    reader = SplitReader(url, "train")
    for shard in range(3):
        reader.read(shard * 12)  # indexes cached; the first sample of each slice read alone
    before_requests, before_bytes = read_counters.requests, read_counters.bytes_fetched
    for step in range(1, 12):  # round-robin over three slices (one per shard)
        for shard in range(3):
            reader.read(shard * 12 + step, read_until=shard * 12 + 12)
    assert read_counters.requests - before_requests == 3
    used = sum(reader.byte_range(i)[2] - reader.byte_range(i)[1] for shard in range(3) for i in range(shard * 12 + 1, shard * 12 + 12))
    assert read_counters.bytes_fetched - before_bytes == used
