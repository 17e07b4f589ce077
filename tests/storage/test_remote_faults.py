"""Faults between the loader and S3: 503s, connection resets and truncated bodies, injected by a
proxy of our own on 127.0.0.1.  Every sample of an epoch must still come out exactly once, and a
request that keeps failing must end in an error naming the URL, the byte range and the attempts."""

from __future__ import annotations

from collections import Counter

import pytest
from energon_lite_dev.s3server import FaultProxy

from megatron_energon_lite import WorkerConfig, get_savable_loader, get_train_dataset, get_val_dataset
from megatron_energon_lite.errors import StorageError
from megatron_energon_lite.format.split_reader import SplitReader
from megatron_energon_lite.storage import configure_storage


@pytest.fixture
def prepared(captioning_on_s3):
    """A captioning set prepared locally and on S3 (through the server directly)."""
    return captioning_on_s3(num_shards=4, samples_per_shard=10, image_size=(16, 16), seed=5)


def _through(proxy: FaultProxy, s3_server) -> dict:
    # botocore's own retries off: our layer must do the work (and it is faster to test).
    return s3_server.storage_options(proxy.endpoint_url, config_kwargs={"proxies": {}, "retries": {"total_max_attempts": 1}})


@pytest.mark.parametrize("whole_shards", [False, True])
@pytest.mark.parametrize("workers", [0, 2])
def test_an_epoch_under_faults_yields_every_sample_once(prepared, s3_server, fault_proxy, monkeypatch, workers: int, whole_shards: bool) -> None:
    """Reads through each shard's .tar.idx in small blocks (several ranged GETs per slice, resumed
    inside them), or each small shard in one GET (ENERGON_LITE_WHOLE_SHARD_BYTES): faults in
    that GET are retried and resumed as well."""
    local, url = prepared
    monkeypatch.setenv("ENERGON_LITE_MAX_ATTEMPTS", "20")
    # (the draws are per request and seed: these seeds spoil both kinds of reads with every kind of fault)
    proxy = fault_proxy(error_rate=0.15, reset_rate=0.1, truncate_rate=0.15, seed=workers + 3 * whole_shards, faults_only_for=FaultProxy.ranged_gets)
    monkeypatch.setenv("ENERGON_LITE_BLOCK_SIZE", "2048")
    if not whole_shards:
        monkeypatch.setenv("ENERGON_LITE_WHOLE_SHARD_BYTES", "0")
    ds = get_val_dataset(url, split_part="train", worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers), batch_size=4, storage_options=_through(proxy, s3_server))
    keys = [k for batch in get_savable_loader(ds) for k in batch.__key__]
    expected = SplitReader(local, "train")
    assert Counter(keys) == Counter(expected.read(i).key for i in range(len(expected)))
    injected = proxy.stats["errors_injected"] + proxy.stats["resets_injected"] + proxy.stats["truncations_injected"]
    assert proxy.stats["errors_injected"] > 0 and proxy.stats["resets_injected"] > 0 and proxy.stats["truncations_injected"] > 0, proxy.stats
    assert injected >= (3 if whole_shards else 5)  # whole: one GET per shard, fewer to spoil


def test_training_under_faults_matches_a_clean_run_and_restores(prepared, s3_server, fault_proxy, monkeypatch) -> None:
    local, url = prepared
    monkeypatch.setenv("ENERGON_LITE_MAX_ATTEMPTS", "20")
    settings = dict(worker_config=WorkerConfig(rank=0, world_size=1, num_workers=2), batch_size=3, shuffle_buffer_size=4, max_samples_per_sequence=5)

    def keys(loader, steps):
        out = []
        for step, batch in enumerate(loader):
            out += list(batch.__key__)
            if step + 1 == steps:
                return out
        return out

    clean = keys(get_savable_loader(get_train_dataset(local, **settings)), 20)
    proxy = fault_proxy(error_rate=0.2, reset_rate=0.1, truncate_rate=0.2, seed=7, faults_only_for=FaultProxy.ranged_gets)
    loader = get_savable_loader(get_train_dataset(url, storage_options=_through(proxy, s3_server), **settings))
    first = keys(loader, 8)
    state = loader.save_state_rank()
    assert first + keys(loader, 12) == clean
    restored = get_savable_loader(get_train_dataset(url, storage_options=_through(proxy, s3_server), **settings))
    restored.restore_state_rank(state)
    assert keys(restored, 12) == clean[24:]
    assert proxy.stats["truncations_injected"] > 0


def test_a_read_that_keeps_failing_names_url_range_and_attempts(prepared, s3_server, fault_proxy, monkeypatch) -> None:
    local, url = prepared
    monkeypatch.setenv("ENERGON_LITE_MAX_ATTEMPTS", "3")
    configure_storage("s3", storage_options=s3_server.storage_options())
    reader = SplitReader(url, "train")
    reader.read(0)  # index cached through the clean endpoint
    proxy = fault_proxy(reset_rate=1.0, faults_only_for=FaultProxy.ranged_gets)
    configure_storage("s3", storage_options=_through(proxy, s3_server))
    broken = SplitReader(url, "train")  # listings are not faulted; sample reads fail for good
    with pytest.raises(StorageError, match=r"after 3 attempts(.|\n)*data-0000.tar bytes \d+\.\.\d+"):
        broken.read(1)
    assert proxy.stats["resets_injected"] >= 3
