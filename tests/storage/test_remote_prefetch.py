"""Reading ahead across slice boundaries on S3 (``ENERGON_LITE_PREFETCH_SLICES``): the index and
the bytes of the slices a worker reads next are requested while it reads the current one, on a
few threads of its own process.  What it costs in requests per slice, that it stays within its
byte budget, that a failed background read is reported at the sample that needed it, that a
loader let go mid-epoch leaves no thread behind, and that save/restore is unchanged."""

from __future__ import annotations

import copy
import gc
import io
import multiprocessing
import tarfile
import threading

import pytest
from energon_lite_dev.s3server import FaultProxy

from megatron_energon_lite import WorkerConfig, get_savable_loader, get_train_dataset
from megatron_energon_lite.errors import DatasetError, StorageError
from megatron_energon_lite.format.split_cache import cached_split
from megatron_energon_lite.format.split_reader import SplitReader
from megatron_energon_lite.pipeline.load import SampleLoader
from megatron_energon_lite.pipeline.source import SliceSource
from megatron_energon_lite.storage import RemotePath
from megatron_energon_lite.storage.remote import RemoteFilePool, read_counters

SHARDS, PER_SHARD = 6, 10


@pytest.fixture
def remote(captioning_on_s3):
    """Small shards (10 samples each, a slice per shard), prepared locally and on S3."""
    return captioning_on_s3(num_shards=SHARDS, samples_per_shard=PER_SHARD, image_size=(8, 8), seed=3)


def _shard_ranges(reader: SplitReader) -> list[tuple[int, int]]:
    starts = reader.shard_starts
    return list(zip(starts, starts[1:]))


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(("energon-lite-plan", "energon-lite-fetch"))]


def _read_all(reader: SplitReader) -> list:
    ranges = _shard_ranges(reader)
    return [reader.read(i, read_until=end) for start, end in ranges for i in range(start, end)]


# (ENERGON_LITE_PREFETCH_SLICES, ENERGON_LITE_WHOLE_SHARD_BYTES or None for its default, requests per shard)
READ_MODES = {
    # a small shard read whole: its tar in one GET, its index from the tar's headers
    "whole": ("8", None, 1),
    # its .tar.idx and one GET of its bytes and trailer (the end-of-archive check needs no request)
    "ranged": ("8", "0", 2),
    # its .tar.idx, the 512-byte end-of-archive check, its bytes
    "no prefetch": ("0", None, 3),
}


def _set_mode(monkeypatch, mode: str) -> int:
    prefetch, whole_bytes, per_shard = READ_MODES[mode]
    monkeypatch.setenv("ENERGON_LITE_PREFETCH_SLICES", prefetch)
    if whole_bytes is not None:
        monkeypatch.setenv("ENERGON_LITE_WHOLE_SHARD_BYTES", whole_bytes)
    return per_shard


@pytest.mark.parametrize("mode", READ_MODES)
def test_requests_per_slice_in_steady_state(remote, monkeypatch, mode: str) -> None:
    """With prefetch, a small shard read as one slice costs one GET (no .tar.idx), else its index
    and one GET of its bytes and trailer. Without prefetch: three."""
    local, url = remote
    per_shard = _set_mode(monkeypatch, mode)
    reader = SplitReader(url, "train")
    try:
        before = read_counters.requests
        reader.prefetch(_shard_ranges(reader))
        samples = _read_all(reader)
        requests = read_counters.requests - before
        assert reader._pool.prefetched_bytes == 0  # all that was read ahead was read and let go
    finally:
        reader.close()
    expected = SplitReader(local, "train")
    assert [(s.key, s.parts) for s in samples] == [(expected.read(i).key, expected.read(i).parts) for i in range(len(expected))]
    assert requests == SHARDS * per_shard


@pytest.mark.parametrize("mode", READ_MODES)
def test_requests_per_shard_when_the_summary_gives_no_sizes(remote, s3_server, fault_proxy, monkeypatch, mode: str) -> None:
    """Built from the start-up summary (no listing: the store has stated no shard's size), a shard
    costs what it costs with a listing and no HEAD: read whole, one GET of up to
    ENERGON_LITE_WHOLE_SHARD_BYTES, whose Content-Range states the tar's size; else its .tar.idx (a
    plain GET, its length is its size) and one GET of its bytes and trailer, whose Content-Range
    gives the size for the stale-index check; without prefetch, the 512-byte check states it."""
    local, url = remote
    per_shard = _set_mode(monkeypatch, mode)
    proxy = fault_proxy()
    path = RemotePath(url, s3_server.storage_options(proxy.endpoint_url))
    split = cached_split(path, "train", None)
    assert split is not None and not split.stats  # the summary's split: counts, no sizes
    proxy.reset_stats()
    reader = SplitReader(path, "train", split=split)
    try:
        reader.prefetch(_shard_ranges(reader))
        samples = _read_all(reader)
    finally:
        reader.close()
    stats = dict(proxy.stats)
    expected = SplitReader(local, "train")
    assert [(s.key, s.parts) for s in samples] == [(expected.read(i).key, expected.read(i).parts) for i in range(len(expected))]
    assert (stats["requests_head"], stats["requests_list"]) == (0, 0), stats
    assert stats["requests"] == SHARDS * per_shard, stats


def test_a_shard_over_the_whole_shard_size_is_read_through_its_index(remote, s3_server, fault_proxy, monkeypatch) -> None:
    """Shards bigger than ENERGON_LITE_WHOLE_SHARD_BYTES keep the ranged path: with their sizes
    known, at no extra request; from the summary, the first GETs find them too big (at most one
    per planning thread before the reader stops asking), their bytes let go."""
    local, url = remote
    sizes = [(local / name).stat().st_size for name in SplitReader(local, "train").split.names]
    monkeypatch.setenv("ENERGON_LITE_PREFETCH_SLICES", "8")
    monkeypatch.setenv("ENERGON_LITE_WHOLE_SHARD_BYTES", str(min(sizes) - 1))
    proxy = fault_proxy()
    path = RemotePath(url, s3_server.storage_options(proxy.endpoint_url))
    expected = SplitReader(local, "train")
    expected_samples = [(expected.read(i).key, expected.read(i).parts) for i in range(len(expected))]
    for split in (None, cached_split(path, "train", None)):
        reader = SplitReader(path, "train", split=split)
        proxy.reset_stats()  # the reads only (a reader built without a split lists the folder)
        try:
            reader.prefetch(_shard_ranges(reader))
            samples = _read_all(reader)
            assert reader._pool.prefetched_bytes == 0
        finally:
            reader.close()
        assert [(s.key, s.parts) for s in samples] == expected_samples
        requests = proxy.stats["requests"]
        if split is None:  # sizes from the listing
            assert requests == SHARDS * 2
        else:
            assert SHARDS * 2 < requests <= SHARDS * 2 + RemoteFilePool.PLAN_THREADS, dict(proxy.stats)
            assert not reader._probe_whole


def _tampered(tar: bytes, change: str) -> bytes:
    """``tar`` rewritten as if a sample was added, removed or one member renamed after prepare,
    or with a header spoiled (its checksum no longer fits)."""
    with tarfile.open(fileobj=io.BytesIO(tar)) as source:
        members = [(m, source.extractfile(m).read()) for m in source.getmembers()]
    if change == "spoiled":
        at = members[3][0].offset + 100  # the mode field of a header mid-archive
        return tar[:at] + b"\xff" * 8 + tar[at + 8 :]
    if change == "added":
        first, data = members[0]
        extra = copy.copy(first)
        extra.name = "zz_added." + first.name.split(".", 1)[1]
        members.append((extra, data))
    elif change == "removed":
        key = members[-1][0].name.split(".", 1)[0]
        members = [(m, d) for m, d in members if m.name.split(".", 1)[0] != key]
    else:  # "renamed": one part of a sample under another key
        member = members[3][0]
        member.name = "renamed_" + member.name
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as target:
        for member, data in members:
            target.addfile(member, io.BytesIO(data))
    return out.getvalue()


@pytest.mark.parametrize("change", ["added", "removed", "renamed", "spoiled"])
def test_a_small_shard_read_whole_that_changed_after_prepare_is_refused(remote, s3_server, monkeypatch, change: str) -> None:
    """A shard read whole in one GET is indexed from its own headers: it must hold the sample
    count the summary gives, or the read stops naming the shard instead of handing out samples
    that are not the ones prepared."""
    local, url = remote
    _set_mode(monkeypatch, "whole")
    split = cached_split(RemotePath(url), "train", None)
    assert split is not None and not split.stats
    name = split.names[2]
    s3_server.put_bytes(f"{url}/{name}", _tampered((local / name).read_bytes(), change))
    reader = SplitReader(url, "train", split=split)
    try:
        reader.prefetch(_shard_ranges(reader))
        starts = reader.shard_starts
        assert [reader.read(i, read_until=starts[2]).key for i in range(starts[2])]  # the shards before it read fine
        with pytest.raises(DatasetError, match="changed after prepare") as caught:
            reader.read(starts[2], read_until=starts[3])
        message = str(caught.value)
        assert name in message and f"{PER_SHARD} samples" in message and "prepare" in message
        if change == "spoiled":
            assert "a tar that does not parse" in message
        else:
            assert f"{PER_SHARD + (1 if change != 'removed' else -1)} samples" in message
    finally:
        reader.close()


@pytest.mark.parametrize("mode", ["whole", "ranged", "no prefetch"])
@pytest.mark.parametrize("change", ["appended", "grown", "truncated", "missing"])
def test_a_changed_shard_is_caught_when_the_summary_gives_no_sizes(remote, s3_server, monkeypatch, mode: str, change: str) -> None:
    """The size the reads state is checked against the index as a listed size is: a member
    appended where the archive ended, a tar grown past its trailer, one cut short, one gone.
    A shard read whole is checked against its sample count and its own end of archive."""
    local, url = remote
    _set_mode(monkeypatch, mode)
    split = cached_split(RemotePath(url), "train", None)
    assert split is not None and not split.stats
    name = split.names[2]
    tar, first = (local / name).read_bytes(), SplitReader(local, "train").byte_range(0)[2]
    end = SplitReader(local, "train").byte_range(split.shard_starts[3] - 1)[2]
    if change == "missing":
        RemotePath(f"{url}/{name}").unlink()
    else:
        changed = {
            "appended": tar[:end] + tar[:first] + tar[end:],  # a member's header where the index ends
            "grown": tar + bytes(len(tar)),  # zeros past the trailer a tar writer leaves
            "truncated": tar[: end - 100],
        }[change]
        s3_server.put_bytes(f"{url}/{name}", changed)
    message = {"appended": ".tar.idx is stale", "grown": ".tar.idx is stale", "truncated": "truncated", "missing": "missing"}[change]
    if mode == "whole" and change == "appended":
        message = "changed after prepare"  # read whole, the appended member is a sample more
    reader = SplitReader(url, "train", split=split)
    try:
        reader.prefetch(_shard_ranges(reader))
        starts = reader.shard_starts
        assert [reader.read(i, read_until=starts[2]).key for i in range(starts[2])]  # the shards before it read fine
        with pytest.raises(DatasetError, match=message) as caught:
            reader.read(starts[2], read_until=starts[3])
        assert name in str(caught.value)
    finally:
        reader.close()


def test_the_bytes_read_ahead_stay_within_the_budget(remote, monkeypatch) -> None:
    local, url = remote
    reader = SplitReader(url, "train")
    sizes = [reader.split.stats[name].size for name in reader.split.names]
    reader.close()
    budget = 2 * max(sizes) + 1  # room for two shards at a time, not for all six
    monkeypatch.setenv("ENERGON_LITE_READAHEAD_BYTES", str(budget))
    reader = SplitReader(url, "train")
    try:
        reader.prefetch(_shard_ranges(reader))
        samples = _read_all(reader)
        peak = reader._pool.peak_prefetched_bytes
        assert reader._pool.prefetched_bytes == 0  # all that was read ahead was read and let go
    finally:
        reader.close()
    assert 0 < peak <= budget
    assert [s.key for s in samples] == [SplitReader(local, "train").read(i).key for i in range(SHARDS * PER_SHARD)]


def test_the_source_hands_over_at_most_its_depth(remote, monkeypatch) -> None:
    """The slices planned ahead are the open ones and the next ENERGON_LITE_PREFETCH_SLICES."""
    local, url = remote
    monkeypatch.setenv("ENERGON_LITE_PREFETCH_SLICES", "2")
    loader = SampleLoader(url, "train")
    source = SliceSource(loader, _shard_ranges(loader.reader), seed=1, parallel_slices=1)
    try:
        keys, planned = [], []
        while True:
            try:
                keys.append(source.next().__key__)
            except StopIteration:
                break
            planned.append(len(loader.reader._planned))
    finally:
        loader.close()
    assert len(keys) == SHARDS * PER_SHARD
    assert max(planned) <= 1 + 2 and max(planned) >= 2


def test_a_failed_prefetch_is_reported_at_the_sample_that_needs_it(remote, s3_server, fault_proxy, monkeypatch) -> None:
    local, url = remote
    monkeypatch.setenv("ENERGON_LITE_MAX_ATTEMPTS", "2")
    bad_shard = 3

    reader = SplitReader(url, "train")
    name = reader.split.names[bad_shard]
    proxy = fault_proxy(error_rate=1.0, faults_only_for=lambda method, path, headers: method == "GET" and path.split("?")[0].endswith("/" + name))
    options = s3_server.storage_options(proxy.endpoint_url, config_kwargs={"proxies": {}, "retries": {"total_max_attempts": 1}})
    reader.close()
    reader = SplitReader(RemotePath(url, options), "train")
    try:
        reader.prefetch(_shard_ranges(reader))  # every shard requested at once, the bad one too
        starts = reader.shard_starts
        for index in range(starts[bad_shard]):  # the shards before it read fine
            assert reader.read(index, read_until=starts[bad_shard]) is not None
        with pytest.raises(StorageError) as failure:
            reader.read(starts[bad_shard], read_until=starts[bad_shard + 1])
        assert name in str(failure.value) and "2 attempts" in str(failure.value)
        proxy.error_rate = 0.0
        # the next read of the shard tries again (as without prefetch), and the shards after it are fine
        for index in range(starts[bad_shard], len(reader)):
            assert reader.read(index, read_until=len(reader)) is not None
    finally:
        reader.close()
    assert proxy.stats["errors_injected"] > 0


def test_a_loader_let_go_mid_epoch_leaves_no_thread(remote, s3_server, fault_proxy) -> None:
    local, url = remote
    proxy = fault_proxy(latency_s=0.02)
    options = s3_server.storage_options(proxy.endpoint_url)
    loader = get_savable_loader(get_train_dataset(url, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), batch_size=2, shuffle_buffer_size=None, max_samples_per_sequence=None, storage_options=options))
    iterator = iter(loader)
    next(iterator), next(iterator)
    assert _prefetch_threads()  # reading ahead while the loader is used
    del iterator, loader
    gc.collect()
    for thread in _prefetch_threads():
        thread.join(timeout=30)  # a GET under way ends; nothing queued starts
    assert not _prefetch_threads()


def test_a_closed_reader_joins_its_threads_mid_plan(remote, s3_server, fault_proxy) -> None:
    local, url = remote
    proxy = fault_proxy(latency_s=0.02)
    reader = SplitReader(RemotePath(url, s3_server.storage_options(proxy.endpoint_url)), "train")
    reader.prefetch(_shard_ranges(reader))
    reader.read(0, read_until=PER_SHARD)
    reader.close()
    assert not _prefetch_threads()
    assert reader._pool.prefetched_bytes == 0


@pytest.mark.parametrize("workers", [0, 2])
def test_restore_with_prefetch_matches_an_uninterrupted_run(remote, s3_server, fault_proxy, monkeypatch, workers: int) -> None:
    """Saved mid-slice with slices of later shards already read ahead: the state is the same as
    without prefetch, and a restore continues exactly."""
    local, url = remote
    proxy = fault_proxy(latency_s=0.005)
    options = s3_server.storage_options(proxy.endpoint_url)
    settings = dict(worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers), batch_size=3, shuffle_buffer_size=5, max_samples_per_sequence=4, parallel_shard_iters=2)

    def keys(loader, steps):
        found = []
        for step, batch in enumerate(loader):
            found += list(batch.__key__)
            if step + 1 == steps:
                break
        return found

    local_keys = keys(get_savable_loader(get_train_dataset(local, **settings)), 16)
    states = {}
    for prefetch in ("0", "8"):
        monkeypatch.setenv("ENERGON_LITE_PREFETCH_SLICES", prefetch)
        loader = get_savable_loader(get_train_dataset(url, storage_options=options, **settings))
        first = keys(loader, 7)
        states[prefetch] = loader.save_state_rank()
        assert first + keys(loader, 9) == local_keys
    assert states["0"] == states["8"]
    restored = get_savable_loader(get_train_dataset(url, storage_options=options, **settings))
    restored.restore_state_rank(states["8"])
    assert keys(restored, 9) == local_keys[21:]


def _read_in_child(reader: SplitReader, queue) -> None:
    inherited = [t.name for t in _prefetch_threads()]  # none: a fork copies only the calling thread
    reader.read(1, read_until=PER_SHARD)  # planned in the parent: must not wait for its tasks
    reader.discard_prefetched()  # as a restore in a worker does
    reader.prefetch(_shard_ranges(reader))
    keys = [s.key for s in _read_all(reader)]
    queue.put((inherited, keys, reader._pool.peak_prefetched_bytes > 0))
    reader.close()


def test_a_forked_worker_starts_its_own_threads(remote) -> None:
    """A reader that read ahead in the parent, copied into a forked child mid-plan: the child
    neither waits for the parent's threads nor uses what they were fetching; it starts its own."""
    local, url = remote
    reader = SplitReader(url, "train")
    reader.prefetch(_shard_ranges(reader))
    reader.read(0, read_until=PER_SHARD)  # the parent's threads are running, GETs under way
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_read_in_child, args=(reader, queue))
    child.start()
    try:
        inherited, keys, prefetched = queue.get(timeout=120)
    finally:
        child.join(timeout=30)
        reader.close()
    assert inherited == []
    assert prefetched
    assert keys == [SplitReader(local, "train").read(i).key for i in range(SHARDS * PER_SHARD)]
    assert child.exitcode == 0
