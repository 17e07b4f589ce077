"""Start-up on object storage: what one rank of a large job sends to the store to build its
dataset, and what each dataloader worker sends before its first read (issue 39).

A rank (4095 of 4096, 2 workers) builds from the start-up summary that prepare writes: one HEAD of
``.info.json`` to recognise the prepared folder, one HEAD of it to check the summary's stamp, and
one GET each of ``dataset.yaml``, the summary and ``split.yaml`` (brace ranges): five requests and
under a kilobyte, the same at 2,000 and at 10,000 shards, no listing.  Workers read no metadata:
every request after the build is a read of one of the rank's shards.

Requests are counted by the :class:`FaultProxy` in front of the local S3 server.  The 10,000-shard
metadata is written with prepare's own writers (``write_info``, ``collapse_shard_names``,
``write_split_config``, ``write_split_cache``; the same bytes a real prepare writes, checked at 20
shards), and every shard is the same real 10-sample tar with its index, stored straight into the
server's backend, so a dataset of 10,000 shards takes a second to set up.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from energon_lite_dev.s3server import REQUEST_KINDS, FaultProxy, LocalS3Server

from megatron_energon_lite import WorkerConfig, get_loader, get_train_dataset
from megatron_energon_lite.format.metadata import DatasetInfo, SplitConfig, collapse_shard_names, write_info, write_split_config
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.format.split_cache import SPLIT_CACHE, write_split_cache
from megatron_energon_lite.storage import RemotePath
from megatron_energon_lite.synthetic import write_tar

TEXT_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"
PER_SHARD = 10
#: The target of issue 39 for one rank's build.
MAX_BUILD_REQUESTS, MAX_BUILD_BYTES = 6, 64 * 1024


def _shard_samples(shard: int) -> list[tuple[str, dict[str, bytes]]]:
    return [(f"{shard:06d}_{i:02d}", {"txt": f"shard {shard} sample {i}".encode()}) for i in range(PER_SHARD)]


def _write_metadata(root: Path, shards: int) -> list[str]:
    """``.nv-meta`` of a dataset of ``shards`` shards of PER_SHARD samples, as prepare writes it."""
    names = [f"shards/{i:06d}.tar" for i in range(shards)]
    (root / ".nv-meta").mkdir(parents=True)
    write_info(root, DatasetInfo(shard_counts=dict.fromkeys(names, PER_SHARD)))
    write_split_config(root, SplitConfig(split_parts={"train": collapse_shard_names(names), "val": [], "test": []}))
    (root / ".nv-meta" / "dataset.yaml").write_text(TEXT_YAML)
    assert write_split_cache(root)
    return names


@pytest.fixture(scope="module")
def one_shard(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes]:
    """A real shard of PER_SHARD text samples and its ``.tar.idx``, made by prepare."""
    root = tmp_path_factory.mktemp("one")
    write_tar(root / "shards/000000.tar", _shard_samples(0))
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, dataset_yaml=TEXT_YAML)
    return (root / "shards/000000.tar").read_bytes(), (root / "shards/000000.tar.idx").read_bytes()


def _upload(server: LocalS3Server, root: Path, url: str, names: list[str], shard: tuple[bytes, bytes]) -> None:
    server.upload_dir(root, url, in_process=True)
    tar, index = shard
    for name in names:
        server.put_bytes(f"{url}/{name}", tar, in_process=True)
        server.put_bytes(f"{url}/{name}.idx", index, in_process=True)


@pytest.fixture
def counted(s3_server: LocalS3Server, fault_proxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("ENERGON_LITE_CACHE_DIR", str(tmp_path / "cache"))
    proxy = fault_proxy()
    proxy.recorded = []
    return proxy, s3_server.storage_options(proxy.endpoint_url)


def _build(url: str, options: dict, workers: int = 2, world_size: int = 4096):
    return get_train_dataset(
        url,
        batch_size=2,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=world_size - 1, world_size=world_size, num_workers=workers),
        storage_options=options,
    )


def _objects(proxy: FaultProxy, bucket: str) -> list[str]:
    return [path.split("?")[0].removeprefix(f"/{bucket}/") for _kind, path, _range in proxy.recorded]


def test_the_metadata_helper_writes_what_prepare_writes(tmp_path: Path) -> None:
    prepared, written = tmp_path / "prepared", tmp_path / "written"
    for shard in range(20):
        write_tar(prepared / f"shards/{shard:06d}.tar", _shard_samples(shard))
    prepare_dataset(prepared, split_ratio=(1, 0, 0), progress=False, dataset_yaml=TEXT_YAML)
    _write_metadata(written, 20)
    for name in (".info.json", "split.yaml", SPLIT_CACHE):
        assert (written / ".nv-meta" / name).read_bytes() == (prepared / ".nv-meta" / name).read_bytes(), name
    assert "shards/{000000..000019}.tar" in (prepared / ".nv-meta/split.yaml").read_text()


def test_the_proxy_counts_requests_and_bytes_by_kind(s3_server: LocalS3Server, s3_url: str, fault_proxy) -> None:
    proxy = fault_proxy()
    fs = s3_server.filesystem(proxy.endpoint_url)
    path = s3_url.removeprefix("s3://")
    fs.pipe_file(f"{path}/a.bin", b"x" * 1000)
    fs.invalidate_cache()
    fs.ls(path)
    fs.cat_file(f"{path}/a.bin", start=10, end=110)
    fs.call_s3("head_object", Bucket=path.split("/")[0], Key=f"{path.split('/', 1)[1]}/a.bin")
    fs.call_s3("get_object", Bucket=path.split("/")[0], Key=f"{path.split('/', 1)[1]}/a.bin")["Body"].close()
    stats = proxy.stats
    assert (stats["requests_put"], stats["requests_list"], stats["requests_ranged_get"], stats["requests_head"], stats["requests_get"]) == (1, 1, 1, 1, 1)
    assert stats["requests"] == sum(stats[f"requests_{kind}"] for kind in REQUEST_KINDS) == 5
    assert stats["bytes_put"] == 1000 and stats["bytes_ranged_get"] == 100 and stats["bytes_list"] > 0
    proxy.reset_stats()
    assert not any(proxy.stats.values())


def test_a_rank_builds_in_the_same_few_requests_at_2000_and_10000_shards(s3_server, s3_url, fault_proxy, tmp_path, one_shard, monkeypatch) -> None:
    monkeypatch.setenv("ENERGON_LITE_CACHE_DIR", str(tmp_path / "cache"))
    bucket = s3_url.removeprefix("s3://").split("/")[0]
    seen = {}
    for shards in (2000, 10000):
        local, url = tmp_path / f"d{shards}", f"{s3_url}/d{shards}"
        names = _write_metadata(local, shards)
        _upload(s3_server, local, url, names, one_shard)
        # A proxy (an endpoint, so a filesystem and connections) per size: a fresh job each.
        proxy = fault_proxy()
        proxy.recorded = []
        options = s3_server.storage_options(proxy.endpoint_url)
        dataset = _build(url, options)
        build = dict(proxy.stats)
        read = _objects(proxy, bucket)
        prefix = f"{url.removeprefix(f's3://{bucket}/')}/.nv-meta/"
        assert sorted(read) == sorted(prefix + name for name in (".info.json", ".info.json", "dataset.yaml", SPLIT_CACHE, "split.yaml")), read
        assert build["requests_list"] == 0
        assert build["requests"] <= MAX_BUILD_REQUESTS and build["bytes_forwarded"] <= MAX_BUILD_BYTES, build
        seen[shards] = {k: build[k] for k in ("requests", *(f"requests_{kind}" for kind in REQUEST_KINDS))}

        # The workers: nothing but reads of the rank's own shards (their index, then their bytes).
        proxy.reset_stats()
        loader = iter(get_loader(dataset))
        batches = [next(loader) for _ in range(2)]  # one from each worker
        del loader
        after = [o.removeprefix(prefix.removesuffix(".nv-meta/")) for o in _objects(proxy, bucket)]
        assert after and all(o.startswith("shards/") for o in after), after
        assert proxy.stats["requests_list"] == 0
        assert f"shards/{shards - 1:06d}.tar" in after  # rank 4095 of 4096 reads the end of the split
        assert all(len(batch.__key__) == 2 for batch in batches)
    assert seen[2000] == seen[10000], seen


def test_the_summary_gives_the_samples_the_files_give(s3_server, s3_url, counted, tmp_path, one_shard, caplog) -> None:
    """With and without the summary (as for a dataset Energon prepared): the same samples; without
    it one INFO line says how to make start-up O(1), and the files are read and listed."""
    proxy, options = counted
    local, url = tmp_path / "d", f"{s3_url}/d"
    names = _write_metadata(local, 30)
    _upload(s3_server, local, url, names, one_shard)

    def first_keys() -> list[str]:
        ds = get_train_dataset(url, batch_size=5, shuffle_buffer_size=None, max_samples_per_sequence=None,
                               worker_config=WorkerConfig(rank=1, world_size=4, num_workers=0), storage_options=options)
        loader = iter(get_loader(ds))
        return [key for _ in range(3) for key in next(loader).__key__]

    with_summary = first_keys()
    RemotePath(f"{url}/.nv-meta/{SPLIT_CACHE}", options).unlink()
    proxy.reset_stats()
    with caplog.at_level(logging.INFO, logger="megatron_energon_lite"):
        without = first_keys()
    assert without == with_summary
    assert proxy.stats["requests_list"] > 0  # the slow path lists the shards
    told = [r.getMessage() for r in caplog.records if "no start-up summary" in r.getMessage()]
    assert len(told) == 1 and "energon-lite prepare" in told[0]


def test_a_stale_or_forged_summary_is_not_trusted(s3_server, s3_url, counted, tmp_path, one_shard, caplog) -> None:
    """``.info.json`` rewritten after the summary (as Energon's prepare would): its ETag no longer
    matches, the files are read.  A summary forged to match the stamps but counting shards the
    split file does not list: ignored with a warning."""
    proxy, options = counted
    local, url = tmp_path / "d", f"{s3_url}/d"
    names = _write_metadata(local, 30)
    _upload(s3_server, local, url, names, one_shard)
    info = RemotePath(f"{url}/.nv-meta/.info.json", options)
    info.write_bytes(info.read_bytes() + b"\n")  # same counts, another file: the summary is stale
    with caplog.at_level(logging.INFO, logger="megatron_energon_lite"):
        ds = _build(url, options, workers=0, world_size=4)
    assert len(ds) > 0
    assert any("is stale" in r.getMessage() for r in caplog.records)
    assert proxy.stats["requests_list"] > 0

    # Forged: the summary rewritten with its stamps kept but a count for one shard more.
    shutil.rmtree(local / ".nv-meta")
    _write_metadata(local, 30)
    summary = (local / ".nv-meta" / SPLIT_CACHE).read_text().replace('"counts":[[10,30]]', '"counts":[[10,31]]')
    for name in (".info.json", "split.yaml"):
        RemotePath(f"{url}/.nv-meta/{name}", options).write_bytes((local / ".nv-meta" / name).read_bytes())
    RemotePath(f"{url}/.nv-meta/{SPLIT_CACHE}", options).write_text(summary)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="megatron_energon_lite"):
        ds = _build(url, options, workers=0, world_size=4)
    assert any("ignoring" in r.getMessage() and "31 shards" in r.getMessage() for r in caplog.records)


def test_prepare_on_object_storage_writes_the_summary(s3_server, s3_url, counted, tmp_path) -> None:
    """Prepared in place on S3: the summary records the store's ETag of .info.json, split.yaml
    has brace ranges, and a rank then builds in five requests."""
    proxy, options = counted
    local, url = tmp_path / "raw", f"{s3_url}/raw"
    for shard in range(12):
        write_tar(local / f"shards/{shard:06d}.tar", _shard_samples(shard))
    s3_server.upload_dir(local, url, in_process=True)
    prepare_dataset(RemotePath(url, options), split_ratio=(1, 0, 0), progress=False, dataset_yaml=TEXT_YAML)
    assert "shards/{000000..000011}.tar" in RemotePath(f"{url}/.nv-meta/split.yaml", options).read_text()
    assert '"etag"' in RemotePath(f"{url}/.nv-meta/{SPLIT_CACHE}", options).read_text()
    proxy.reset_stats()
    ds = _build(url, options, workers=0, world_size=4)
    assert proxy.stats["requests"] == 5 and proxy.stats["requests_list"] == 0
    assert len(ds) > 0
