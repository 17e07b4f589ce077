"""aux: sources on S3 (moto on 127.0.0.1): a prepared dataset (``s3://``) and a folder
(``filesystem+s3://``) read by cookers through the storage layer, with and without a cache pool,
under injected faults, resumed exactly; compared with the same sources read from local disk."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import re
from pathlib import Path

import pytest
from energon_lite_dev.s3server import FaultProxy
from energon_lite_dev.synthetic import write_numbered_shards

from megatron_energon_lite import (
    Cooker,
    DefaultTaskEncoder,
    Sample,
    TextSample,
    WorkerConfig,
    basic_sample_keys,
    cooker,
    get_loader,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
    stateless,
)
from megatron_energon_lite.cache import FileStoreCachePool, SystemFileStore
from megatron_energon_lite.errors import AuxFileNotFoundError
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.storage import configure_storage, read_counters

CRUDE = "__module__: megatron.energon\n__class__: CrudeWebdataset\n"
N = 12


def _mds(root: Path, dataset: str, folder: str) -> Path:
    path = root / f"mds-{len(list(root.glob('mds-*')))}.yaml"
    path.write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    path: ds1\n"
        f"    aux:\n      other: {dataset}\n      files: {folder}\n"
    )
    return path


@pytest.fixture
def sources(s3_server, s3_url, tmp_path, monkeypatch):
    """ds1 (crude, local, the primary); ds2 (crude, prepared on S3 and locally) and files/ (a
    folder, on S3 and locally) as aux sources. Returns (local yaml, remote yaml)."""
    monkeypatch.setenv("ENERGON_LITE_CACHE_DIR", str(tmp_path / "index-cache"))
    monkeypatch.setenv("ENERGON_LITE_BACKOFF_S", "0.001")
    write_numbered_shards(tmp_path / "ds1", offset=0)
    prepare_dataset(tmp_path / "ds1", split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=CRUDE)
    write_numbered_shards(tmp_path / "ds2", offset=100)
    for i in range(N):
        (tmp_path / f"files/sub/{i}.bin").parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f"files/sub/{i}.bin").write_bytes(bytes([i]) * (1000 + 37 * i))
    s3_server.upload_dir(tmp_path / "ds2", f"{s3_url}/ds2")
    s3_server.upload_dir(tmp_path / "files", f"{s3_url}/files")
    configure_storage("s3", storage_options=s3_server.storage_options())
    prepare_dataset(tmp_path / "ds2", split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=CRUDE)
    prepare_dataset(f"{s3_url}/ds2", split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=CRUDE)
    local = _mds(tmp_path, "ds2", "filesystem://./files")
    remote = _mds(tmp_path, f"{s3_url}/ds2", f"filesystem+{s3_url}/files")
    yield local, remote
    configure_storage("s3", storage_options={})


def _through(proxy: FaultProxy, s3_server) -> dict:
    return s3_server.storage_options(proxy.endpoint_url, config_kwargs={"proxies": {}, "retries": {"total_max_attempts": 1}})


@stateless
def cook_direct(sample: dict, other, files) -> TextSample:
    index = int(sample["txt"])
    data = files.get(f"sub/{index}.bin", sample)
    return TextSample(**basic_sample_keys(sample), text=f"{index}|{other.get(f'{index + 100:06d}.txt', sample)}|{len(data)}|{data[-1]}")


@dataclasses.dataclass
class WithLazy(Sample):
    index: int = 0
    other: str = ""
    lazy: object = None


@stateless
@cooker(need_cache=True)
def cook_lazy(sample: dict, other, files, cache) -> WithLazy:
    index = int(sample["txt"])
    return WithLazy(**basic_sample_keys(sample), index=index, other=other.get(f"{index + 100:06d}.txt", sample), lazy=cache.get_lazy(files, f"sub/{index}.bin"))


class DirectEncoder(DefaultTaskEncoder):
    cookers = [Cooker(cook_direct)]


class PoolEncoder(DefaultTaskEncoder):
    cookers = [Cooker(cook_lazy)]

    @stateless
    def encode_sample(self, sample: WithLazy) -> TextSample:
        data = sample.lazy.get(sample)
        keys = {name: getattr(sample, name) for name in ("__key__", "__restore_key__", "__subflavors__", "__sources__")}
        return TextSample(**keys, text=f"{sample.index}|{sample.other}|{len(data)}|{data[-1]}")


def _expected_text(index: int) -> str:
    return f"{index}|{index + 100}|{1000 + 37 * index}|{index}"


def _train(yaml: Path, encoder, workers: int, **kwargs):
    return get_train_dataset(yaml, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers), batch_size=2, shuffle_buffer_size=4, max_samples_per_sequence=3, task_encoder=encoder, **kwargs)


def _texts(loader, batches: int) -> list[str]:
    return [t for batch in itertools.islice(loader, batches) for t in batch.text]


@pytest.mark.parametrize("workers,pool", [(0, False), (2, False), (0, True), (2, True)])
def test_aux_on_s3_reads_what_local_aux_reads_and_resumes_exactly(sources, tmp_path: Path, workers: int, pool: bool) -> None:
    local, remote = sources
    encoder = PoolEncoder if pool else DirectEncoder

    def loader(yaml):
        return get_savable_loader(_train(yaml, encoder(), workers), cache_pool=FileStoreCachePool(parent_cache_dir=tmp_path / "pool", num_workers=2) if pool else None)

    expected = _texts(loader(local), 9)
    assert expected == [_expected_text(int(text.split("|")[0])) for text in expected] and len(set(expected)) == N
    remote_loader = loader(remote)
    it = iter(remote_loader)
    head = _texts(it, 4)
    state = remote_loader.save_state_rank()
    assert head + _texts(it, 5) == expected
    resumed = loader(remote)
    resumed.restore_state_rank(state)
    assert _texts(resumed, 5) == expected[8:]


@pytest.mark.parametrize("pool", [False, True])
def test_aux_reads_on_s3_survive_faults_one_get_per_file(sources, s3_server, s3_url, fault_proxy, monkeypatch, tmp_path: Path, pool: bool) -> None:
    """503s, resets and truncated bodies on the aux reads; every sample still right, and an
    aux folder file costs GETs of its own only (no listing of the folder per read)."""
    local, remote = sources
    monkeypatch.setenv("ENERGON_LITE_MAX_ATTEMPTS", "30")
    requests: list[tuple[str, str]] = []
    bucket_prefix = "/" + s3_url.split("://", 1)[1]

    def faulty(method: str, path: str, headers) -> bool:
        requests.append((method, path))
        return method == "GET" and path.startswith(f"{bucket_prefix}/files/") or FaultProxy.ranged_gets(method, path, headers)

    proxy = fault_proxy(error_rate=0.15, reset_rate=0.1, truncate_rate=0.15, seed=3, faults_only_for=faulty)
    configure_storage("s3", storage_options=_through(proxy, s3_server))  # the fixture's are for s3:// only
    encoder = PoolEncoder() if pool else DirectEncoder()
    ds = get_val_dataset(remote, split_part="train", worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), batch_size=None, task_encoder=encoder)
    texts = [s.text for s in get_loader(ds, cache_pool=FileStoreCachePool(parent_cache_dir=tmp_path / "pool", num_workers=2) if pool else None)]
    assert sorted(texts) == sorted(_expected_text(i) for i in range(N))
    injected = proxy.stats["errors_injected"] + proxy.stats["resets_injected"] + proxy.stats["truncations_injected"]
    assert injected > 0, proxy.stats
    folder_reads = [path for method, path in requests if path.split("?")[0].startswith(f"{bucket_prefix}/files/")]
    assert {p.split("?")[0] for p in folder_reads} == {f"{bucket_prefix}/files/sub/{i}.bin" for i in range(N)}
    listings = [path for method, path in requests if "list-type" in path or "prefix=" in path]
    assert not [p for p in listings if "files" in p], listings  # the folder is never listed
    assert not [p for method, p in requests if method == "HEAD" and "/files/" in p]  # one GET per read, no size lookup
    assert len(folder_reads) <= N + 2 * injected  # aiohttp itself resends once after a reset


def test_missing_aux_file_on_s3_skips_the_sample_naming_it(sources, caplog: pytest.LogCaptureFixture) -> None:
    local, remote = sources

    @stateless
    def cook_missing(sample: dict, other, files) -> TextSample:
        index = int(sample["txt"])
        return TextSample(**basic_sample_keys(sample), text=str(len(files.get("sub/gone.bin" if index == 5 else f"sub/{index}.bin", sample))))

    class Encoder(DefaultTaskEncoder):
        cookers = [Cooker(cook_missing)]

    ds = get_val_dataset(remote, split_part="train", worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), batch_size=None, task_encoder=Encoder())
    with caplog.at_level(logging.WARNING):
        texts = [s.text for s in get_loader(ds)]
    assert sorted(texts) == sorted(str(1000 + 37 * i) for i in range(N) if i != 5)
    assert re.search(r"file not found in an aux folder(.|\n)*s3://.*/files/sub/gone.bin", caplog.text) and "000005" in caplog.text


def test_a_remote_folder_store_reads_a_file_in_one_http_request(sources, s3_server, s3_url, fault_proxy) -> None:
    seen: list[tuple[str, str]] = []
    proxy = fault_proxy(faults_only_for=lambda method, path, headers: seen.append((method, path)) and False)
    configure_storage("s3", storage_options=_through(proxy, s3_server))
    store = SystemFileStore(f"{s3_url}/files")
    before = read_counters.requests, read_counters.bytes_fetched
    assert store["sub/3.bin"][0] == bytes([3]) * (1000 + 37 * 3)
    assert (read_counters.requests - before[0], read_counters.bytes_fetched - before[1]) == (1, 1000 + 37 * 3)
    assert [method for method, _ in seen] == ["GET"], seen  # no HEAD for the size first
    seen.clear()
    with pytest.raises(AuxFileNotFoundError, match="file not found"):
        store["sub/gone.bin"]
    assert len(seen) == 1, seen
    with pytest.raises(AuxFileNotFoundError, match="must be a path inside it"):
        store["../ds2/.nv-meta/.info.json"]
