"""FileStoreCachePool: background fetches into a local folder, shared entries, the budget,
cleanup, failures, pickling and fork. Real files in tmp_path and real threads; waits are bounded
(futures and state polls with generous timeouts), nothing asserts on time."""

from __future__ import annotations

import copy
import errno
import gc
import logging
import multiprocessing
import pickle
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import pytest

from megatron_energon_lite.cache import file_cache_pool
from megatron_energon_lite.cache.base import (
    FileStore,
    FileStoreDecoder,
    FileStoreWrapper,
)
from megatron_energon_lite.cache.file_cache_pool import (
    CacheFileLazy,
    FileCacheLazy,
    FileStoreCachePool,
)
from megatron_energon_lite.errors import (
    CachePoolClosedError,
    ConfigError,
    LazyNotPicklableError,
)
from megatron_energon_lite.source_info import SourceInfo

TIMEOUT = 30  # seconds; only ever a bound on waits that normally take milliseconds
POOL_LOGGER = "megatron_energon_lite.cache.file_cache_pool"


class MemoryStore(FileStore):
    """Files in a dict. Counts reads; a key in ``gates`` blocks its reads until the event is set."""

    def __init__(self, files: dict[str, Any], path: str = "mem_store") -> None:
        self.files = files
        self.path = path
        self.reads: Counter[str] = Counter()
        self.gates: dict[str, threading.Event] = {}
        self.started: dict[str, threading.Event] = {}

    def gate(self, key: str) -> threading.Event:
        self.gates[key] = threading.Event()
        self.started[key] = threading.Event()
        return self.gates[key]

    def __getitem__(self, key: str) -> tuple[Any, SourceInfo]:
        if key in self.gates:
            self.started[key].set()
            assert self.gates[key].wait(TIMEOUT)
        self.reads[key] += 1
        value = self.files[key]  # a missing key raises KeyError, like a real store
        if isinstance(value, BaseException):
            raise value
        return value, SourceInfo(dataset_path=self.path, index=key, shard_name="", file_names=(key,))

    def get_path(self) -> str:
        return self.path


class PrefixDecoder(FileStoreDecoder):
    def decode(self, fname: str, data: bytes) -> Any:
        return f"{fname}: {data.decode()}"


class DecodingStore(FileStoreWrapper):
    """A decoding store over another one (what DecodeFileStore does), kept local to these tests."""

    def __init__(self, inner: FileStore, decoder: FileStoreDecoder) -> None:
        super().__init__(inner)
        self.decoder = decoder

    def __getitem__(self, key: str) -> tuple[Any, SourceInfo]:
        data, source_info = self._inner[key]
        return self.decoder.decode(key, data), source_info

    def _decode_raw(self, data: bytes, **kwargs: Any) -> Any:
        return self.decoder.decode(kwargs["fname"], self._inner._decode_raw(data, **kwargs))


def wait_until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.005)


def settled(pool: FileStoreCachePool) -> bool:
    """No fetch is reading or writing, one waiting for room has no room, and a queued one is only
    behind one waiting for room (a snapshot under the pool's lock)."""
    with pool._locked():
        entries = list(pool._entries.values())
        states = [entry.state for entry in entries]
        busy = any(state in ("reading", "writing") for state in states)
        stuck = all(not pool._fits(entry.data_size) for entry in entries if entry.state == "waiting")
    return not busy and stuck and ("queued" not in states or "waiting" in states)


def files_in(folder: Path) -> list[Path]:
    return sorted(folder.glob("*")) if folder.exists() else []


@pytest.fixture
def make_pool(tmp_path: Path):
    pools: list[FileStoreCachePool] = []

    def make(**kwargs: Any) -> FileStoreCachePool:
        kwargs.setdefault("parent_cache_dir", tmp_path / "cache")
        pool = FileStoreCachePool(**kwargs)
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        pool.close()


def sources(sample: dict) -> list[tuple]:
    return [(s.dataset_path, s.index, s.file_names) for s in sample["__sources__"]]


# -- reading ----------------------------------------------------------------------------------


def test_get_reads_now_and_adds_the_source(make_pool) -> None:
    pool = make_pool()
    raw = MemoryStore({"file1": b"test data 1"})
    sample: dict = {"__sources__": []}
    assert pool.get(raw, "file1", sample) == b"test data 1"
    assert sources(sample) == [("mem_store", "file1", ("file1",))]
    sample = {"__sources__": []}
    assert pool.get(DecodingStore(raw, PrefixDecoder()), "file1", sample) == "file1: test data 1"
    assert sources(sample) == [("mem_store", "file1", ("file1",))]
    assert files_in(pool.cache_dir) == []


def test_lazy_is_fetched_once_and_second_get_returns_the_data(make_pool) -> None:
    pool = make_pool()
    store = MemoryStore({"file1": b"test data 1"})
    lazy = pool.get_lazy(store, "file1")
    assert isinstance(lazy, FileCacheLazy)
    assert lazy.entry.send_to_cache_future.result(TIMEOUT) is True
    [cached] = files_in(pool.cache_dir)
    assert cached.read_bytes() == b"test data 1"
    assert (pool.current_cache_count, pool.current_cache_size) == (1, 11)

    sample: dict = {"__sources__": []}
    assert lazy.get(sample) == b"test data 1"
    assert lazy._data  # consumed
    assert files_in(pool.cache_dir) == [] and (pool.current_cache_count, pool.current_cache_size) == (0, 0)
    # Energon returned the (data, SourceInfo) tuple here; the data again, its source added again
    # (like DirectLazy, every get adds the source).
    assert lazy.get(sample) == b"test data 1"
    assert sources(sample) == [("mem_store", "file1", ("file1",))] * 2
    assert store.reads["file1"] == 1


def test_shared_entry_counts_references_and_the_last_one_removes_the_file(make_pool) -> None:
    pool = make_pool()
    store = MemoryStore({"file1": b"test data 1"})
    assert list(pool.cache_dir.rglob("*")) == []
    lazy1 = pool.get_lazy(store, "file1")
    lazy2 = pool.get_lazy(store, "file1")
    assert lazy1.entry is lazy2.entry and lazy1.entry.refcount == 2
    assert lazy1 == lazy2 and hash(lazy1) == hash(lazy2)
    assert lazy1.entry.send_to_cache_future.result(TIMEOUT)
    assert len(list(pool.cache_dir.rglob("*"))) == 1

    sample1: dict = {"__sources__": []}
    sample2: dict = {"__sources__": []}
    assert lazy1.get(sample1) == b"test data 1"
    assert lazy1.entry.refcount == 1 and len(files_in(pool.cache_dir)) == 1
    assert lazy2.get(sample2) == b"test data 1"
    assert lazy1.entry.refcount == 0 and list(pool.cache_dir.rglob("*")) == []
    assert sources(sample1) == sources(sample2) == [("mem_store", "file1", ("file1",))]
    assert store.reads["file1"] == 1

    # A lazy dropped unread gives its reference back too.
    lazy3 = pool.get_lazy(store, "file1")
    assert lazy3.entry.send_to_cache_future.result(TIMEOUT)
    assert len(files_in(pool.cache_dir)) == 1
    del lazy3
    gc.collect()
    assert files_in(pool.cache_dir) == [] and pool._entries == {}
    assert (pool.current_cache_count, pool.current_cache_size) == (0, 0)


def test_copies_are_the_lazy_itself(make_pool) -> None:
    pool = make_pool()
    lazy = pool.get_lazy(MemoryStore({"a": b"x"}), "a")
    assert copy.copy(lazy) is lazy and copy.deepcopy({"k": lazy})["k"] is lazy
    assert lazy.entry.refcount == 1


# -- the budget -------------------------------------------------------------------------------


def test_budget_sequence(make_pool) -> None:
    """Energon's test_cache_size_management, with state polls instead of sleeps.

    One fetch thread, room for 75 000 bytes and 2 files; files 1-3 are 50 000 bytes, 4-6 25 000.
    Each expected state is Energon's: its sequence is not affected by the bugs fixed here. One
    difference is visible in the read counts: when lazy2_3 asks for file 2 while its fetch waits for
    room, Energon drops the bytes the fetch read and reads the file again; here the consumer takes
    them, so file 2 is read once for 2_3 and once more when it is finally cached.
    """
    pool = make_pool(max_cache_size_gbytes=0.0001, max_cache_count=2, num_workers=1)
    pool.max_cache_size = 75_000
    sizes = {1: 50_000, 2: 50_000, 3: 50_000, 4: 25_000, 5: 25_000, 6: 25_000}
    store = MemoryStore({f"large_file{i}": bytes([96 + i]) * size for i, size in sizes.items()})
    order = ["1", "2", "3", "4", "2_2", "2_3", "3_2", "5", "6", "6_2"]
    lazies = {name: pool.get_lazy(store, f"large_file{name[0]}") for name in order}
    names = ["1", "2", "2_2", "2_3", "3", "3_2", "4", "5", "6", "6_2"]
    assert lazies["2_2"].entry is lazies["2"].entry and lazies["2_3"].entry is lazies["2"].entry

    def status() -> list[tuple[str, int, str]]:
        wait_until(lambda: settled(pool), "the fetches settle")
        return [
            (
                name,
                lazies[name].entry.refcount,
                "consumed"
                if lazies[name]._data
                else ("cached" if lazies[name].entry.send_to_cache_future.done() else "pending"),
            )
            for name in names
            if name in lazies
        ]

    def expect(cached: str, consumed: str, refs: dict[str, int], count: int, size: int) -> None:
        expected = [
            (name, refs[name[0]], "consumed" if name in consumed.split() else "cached" if name[0] in cached else "pending")
            for name in names
            if name in lazies
        ]
        assert status() == expected
        assert (pool.current_cache_count, pool.current_cache_size) == (count, size)

    def get(name: str) -> None:
        assert lazies[name].get() == store.files[f"large_file{name[0]}"]

    assert lazies["1"].entry.send_to_cache_future.result(TIMEOUT)
    wait_until(lambda: lazies["2"].entry.state == "waiting", "file 2 waits for room")
    expect("1", "", {"1": 1, "2": 3, "3": 2, "4": 1, "5": 1, "6": 2}, 1, 50_000)

    get("2_3")  # file 2 waits for room: 2_3 takes the bytes read; the rest is queued again at the end
    assert store.reads["large_file2"] == 1
    expect("1", "2_3", {"1": 1, "2": 2, "3": 2, "4": 1, "5": 1, "6": 2}, 1, 50_000)

    get("1")
    assert lazies["3"].entry.send_to_cache_future.result(TIMEOUT)
    expect("134", "1 2_3", {"1": 0, "2": 2, "3": 2, "4": 1, "5": 1, "6": 2}, 2, 75_000)

    get("3")  # 3_2 still refers to file 3: it stays
    expect("134", "1 2_3 3", {"1": 0, "2": 2, "3": 1, "4": 1, "5": 1, "6": 2}, 2, 75_000)

    get("3_2")
    expect("1345", "1 2_3 3 3_2", {"1": 0, "2": 2, "3": 0, "4": 1, "5": 1, "6": 2}, 2, 50_000)

    get("4")
    expect("13456", "1 2_3 3 3_2 4", {"1": 0, "2": 2, "3": 0, "4": 0, "5": 1, "6": 2}, 2, 50_000)

    get("5")
    expect("123456", "1 2_3 3 3_2 4 5", {"1": 0, "2": 2, "3": 0, "4": 0, "5": 0, "6": 2}, 2, 75_000)

    get("6")
    expect("123456", "1 2_3 3 3_2 4 5 6", {"1": 0, "2": 2, "3": 0, "4": 0, "5": 0, "6": 1}, 2, 75_000)

    get("2")
    expect("123456", "1 2_3 3 3_2 4 5 6 2", {"1": 0, "2": 1, "3": 0, "4": 0, "5": 0, "6": 1}, 2, 75_000)

    get("2_2")
    expect("123456", "1 2_3 3 3_2 4 5 6 2 2_2", {"1": 0, "2": 0, "3": 0, "4": 0, "5": 0, "6": 1}, 1, 25_000)

    del lazies["6_2"]
    gc.collect()
    expect("123456", "1 2_3 3 3_2 4 5 6 2 2_2", {"1": 0, "2": 0, "3": 0, "4": 0, "5": 0, "6": 0}, 0, 0)
    assert files_in(pool.cache_dir) == []
    assert dict(store.reads) == {f"large_file{i}": 2 if i == 2 else 1 for i in sizes}


def test_raising_the_budget_wakes_a_waiting_fetch(make_pool) -> None:
    pool = make_pool(max_cache_count=1, num_workers=1)
    store = MemoryStore({"a": b"a" * 10, "b": b"b" * 10})
    lazy_a = pool.get_lazy(store, "a")
    lazy_b = pool.get_lazy(store, "b")
    assert lazy_a.entry.send_to_cache_future.result(TIMEOUT)
    wait_until(lambda: lazy_b.entry.state == "waiting", "b waits for room")
    pool.max_cache_count = 2
    assert lazy_b.entry.send_to_cache_future.result(TIMEOUT) is True
    assert (pool.current_cache_count, pool.current_cache_size) == (2, 20)


def test_file_larger_than_the_budget_is_read_directly_and_logged_once(make_pool, caplog) -> None:
    pool = make_pool(num_workers=1)
    pool.max_cache_size = 100
    store = MemoryStore({"big1": b"x" * 1000, "big2": b"y" * 1000, "small": b"s" * 10})
    with caplog.at_level(logging.WARNING, logger=POOL_LOGGER):
        big1 = pool.get_lazy(store, "big1")
        big2 = pool.get_lazy(store, "big2")
        small = pool.get_lazy(store, "small")
        # The big ones do not hold the only fetch thread: the small file behind them is cached.
        assert small.entry.send_to_cache_future.result(TIMEOUT) is True
        assert big1.entry.send_to_cache_future.result(TIMEOUT) is False
        assert big2.entry.send_to_cache_future.result(TIMEOUT) is False
    assert [p.name.split("_", 1)[1] for p in files_in(pool.cache_dir)] == ["small"]
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    message = warning.getMessage()
    assert "big1" in message and "1000 bytes" in message and "budget 100 bytes" in message
    assert "max_cache_size_gbytes" in message
    sample: dict = {"__sources__": []}
    assert big1.get(sample) == b"x" * 1000 and sources(sample) == [("mem_store", "big1", ("big1",))]
    assert big2.get() == b"y" * 1000 and small.get() == b"s" * 10
    assert (pool.current_cache_count, pool.current_cache_size) == (0, 0)


def test_reservation_is_released_when_lazies_are_dropped_mid_fetch(make_pool) -> None:
    """Energon kept the room of a fetch whose lazies were all dropped while it waited (a leak)."""
    pool = make_pool(max_cache_count=1, num_workers=2)
    store = MemoryStore({"a": b"a" * 10, "b": b"b" * 20, "c": b"c" * 30})
    lazy_a = pool.get_lazy(store, "a")
    assert lazy_a.entry.send_to_cache_future.result(TIMEOUT)

    lazy_b = pool.get_lazy(store, "b")  # waits for room
    entry_b = lazy_b.entry
    wait_until(lambda: entry_b.state == "waiting", "b waits for room")
    del lazy_b
    gc.collect()
    assert entry_b.send_to_cache_future.result(TIMEOUT) is False

    gate = store.gate("c")  # dropped while its store is being read
    lazy_c = pool.get_lazy(store, "c")
    entry_c = lazy_c.entry
    assert store.started["c"].wait(TIMEOUT)
    del lazy_c
    gc.collect()
    gate.set()
    assert entry_c.send_to_cache_future.result(TIMEOUT) is False

    assert (pool.current_cache_count, pool.current_cache_size) == (1, 10)
    assert lazy_a.get() == b"a" * 10
    assert (pool.current_cache_count, pool.current_cache_size) == (0, 0)
    assert files_in(pool.cache_dir) == [] and pool._entries == {}


def test_a_queued_fetch_is_cancelled_when_dropped_or_read(make_pool) -> None:
    pool = make_pool(num_workers=1)
    store = MemoryStore({"first": b"1", "second": b"2", "third": b"3"})
    gate = store.gate("first")
    first = pool.get_lazy(store, "first")
    assert store.started["first"].wait(TIMEOUT)
    second = pool.get_lazy(store, "second")
    third = pool.get_lazy(store, "third")
    future_second = second.entry.send_to_cache_future
    del second
    gc.collect()
    assert future_second.cancelled()
    assert third.get() == b"3"  # queued: read now, never waits for the thread
    gate.set()
    assert first.get() == b"1"
    assert store.reads == Counter({"first": 1, "third": 1})


def test_consumer_waiting_for_a_running_read_takes_its_bytes(make_pool) -> None:
    pool = make_pool(num_workers=1)
    store = MemoryStore({"a": b"payload"})
    gate = store.gate("a")
    lazy = pool.get_lazy(store, "a")
    assert store.started["a"].wait(TIMEOUT)
    got: list = []
    reader = threading.Thread(target=lambda: got.append(lazy.get()))
    reader.start()
    wait_until(lambda: lazy.entry.attempt.waiting == 1, "the reader waits for the fetch")
    gate.set()
    reader.join(TIMEOUT)
    assert got == [b"payload"] and store.reads["a"] == 1
    assert files_in(pool.cache_dir) == []  # nobody else needed the file: it was not written


# -- raw, pickle and decoding -----------------------------------------------------------------


@pytest.mark.parametrize("method", ["raw", "pickle"])
def test_methods_decode_like_the_store(make_pool, method: str) -> None:
    pool = make_pool(method=method)
    raw = MemoryStore({"file1": b"test data 1"})
    decoded = DecodingStore(raw, PrefixDecoder())
    lazy_decoded = pool.get_lazy(decoded, "file1")
    lazy_raw = pool.get_lazy(raw, "file1")  # same path, same name: a different entry
    assert lazy_decoded.entry is not lazy_raw.entry
    assert lazy_decoded.entry.send_to_cache_future.result(TIMEOUT)
    assert lazy_raw.entry.send_to_cache_future.result(TIMEOUT)
    contents = {p.read_bytes() for p in files_in(pool.cache_dir)}
    if method == "raw":
        assert contents == {b"test data 1"}
    else:
        assert contents == {pickle.dumps("file1: test data 1", protocol=5), pickle.dumps(b"test data 1", protocol=5)}
    sample: dict = {"__sources__": []}
    assert lazy_decoded.get(sample) == "file1: test data 1"
    assert lazy_raw.get(sample) == b"test data 1"
    assert sources(sample) == [("mem_store", "file1", ("file1",))] * 2
    assert files_in(pool.cache_dir) == []


def test_raw_store_items_that_are_not_bytes_are_cached_pickled(make_pool) -> None:
    pool = make_pool(method="raw")
    store = MemoryStore({"obj": {"a": [1, 2]}})
    lazy = pool.get_lazy(store, "obj")
    assert lazy.entry.send_to_cache_future.result(TIMEOUT)
    assert lazy.get() == {"a": [1, 2]}


def test_invalid_arguments_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'zip'"):
        FileStoreCachePool(parent_cache_dir=tmp_path, method="zip")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="num_workers"):
        FileStoreCachePool(parent_cache_dir=tmp_path, num_workers=0)
    with pytest.raises(ConfigError, match="max_cache_count"):
        FileStoreCachePool(parent_cache_dir=tmp_path, max_cache_count=-1)
    assert list(tmp_path.iterdir()) == []


# -- errors -----------------------------------------------------------------------------------


def test_store_errors_surface_unchanged_from_get(make_pool) -> None:
    pool = make_pool(num_workers=1)
    store = MemoryStore({"gone": FileNotFoundError(2, "No such file", "/data/gone.png")})
    missing = pool.get_lazy(store, "missing")  # fetched in the background
    with pytest.raises(KeyError):
        missing.entry.send_to_cache_future.result(TIMEOUT)
    with pytest.raises(KeyError, match="missing"):
        missing.get()
    gone = pool.get_lazy(store, "gone")
    with pytest.raises(FileNotFoundError):
        gone.entry.send_to_cache_future.result(TIMEOUT)
    with pytest.raises(FileNotFoundError, match="gone.png"):
        gone.get()

    store.files["slow"] = b"s"
    gate = store.gate("slow")
    slow = pool.get_lazy(store, "slow")
    assert store.started["slow"].wait(TIMEOUT)
    queued = pool.get_lazy(store, "missing")  # queued behind "slow": read directly by get()
    with pytest.raises(KeyError, match="missing"):
        queued.get()
    gate.set()
    assert slow.get() == b"s"
    assert pool._entries == {} and (pool.current_cache_count, pool.current_cache_size) == (0, 0)


def test_a_cache_folder_that_cannot_be_made_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(ConfigError, match=r"cannot make or write its cache folder(.|\n)*file/sub/cache_(.|\n)*parent_cache_dir"):
        FileStoreCachePool(parent_cache_dir=tmp_path / "file" / "sub")
    assert (tmp_path / "file").read_text() == "not a folder"


def test_a_folder_that_cannot_be_written_reads_directly_and_warns_once(make_pool, caplog) -> None:
    pool = make_pool()
    # As root, chmod does not stop writes: put a file where the folder was.
    pool.cache_dir.rmdir()
    pool.cache_dir.write_text("in the way")
    store = MemoryStore({"a": b"data a", "b": b"data b"})
    with caplog.at_level(logging.WARNING, logger=POOL_LOGGER):
        lazies = [pool.get_lazy(store, name) for name in ("a", "b")]
        assert [lazy.entry.send_to_cache_future.result(TIMEOUT) for lazy in lazies] == [False, False]
    assert [lazy.get() for lazy in lazies] == [b"data a", b"data b"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "cannot write" in warnings[0] and str(pool.cache_dir) in warnings[0]
    assert (pool.current_cache_count, pool.current_cache_size) == (0, 0)
    pool.cache_dir.unlink()


def test_a_full_disk_reads_directly_and_warns_once(make_pool, caplog, monkeypatch) -> None:
    def no_room(path: Path, payload: Any, *, durable: bool) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(file_cache_pool, "replace_atomically", no_room)
    pool = make_pool()
    store = MemoryStore({"a": b"data a", "b": b"data b"})
    with caplog.at_level(logging.WARNING, logger=POOL_LOGGER):
        lazies = [pool.get_lazy(store, name) for name in ("a", "b")]
        assert [lazy.entry.send_to_cache_future.result(TIMEOUT) for lazy in lazies] == [False, False]
        assert [lazy.get() for lazy in lazies] == [b"data a", b"data b"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "no room" in warnings[0]
    assert (pool.current_cache_count, pool.current_cache_size) == (0, 0)


# -- concurrency ------------------------------------------------------------------------------


def test_concurrent_lazies_of_one_file(make_pool) -> None:
    pool = make_pool()
    store = MemoryStore({"file1": b"test data 1"})
    results: list = []

    def worker() -> None:
        try:
            sample: dict = {"__sources__": ()}
            results.append((pool.get_lazy(store, "file1").get(sample), sources(sample)))
        except Exception as exc:  # reported below
            results.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
    assert results == [(b"test data 1", [("mem_store", "file1", ("file1",))])] * 8


def test_many_threads_many_files_small_budget(make_pool) -> None:
    pool = make_pool(num_workers=3, max_cache_count=4)
    pool.max_cache_size = 3000
    files = {f"f{i}": bytes([i]) * (100 * (i % 7 + 1)) for i in range(20)}
    files["huge"] = b"h" * 5000  # never fits
    store = MemoryStore(files)
    decoded = DecodingStore(MemoryStore({k: v.hex().encode() for k, v in files.items()}, path="hex"), PrefixDecoder())
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        import random

        rng = random.Random(seed)
        try:
            for _ in range(30):
                names = rng.sample(sorted(files), 4)
                lazies = [(name, pool.get_lazy(store, name)) for name in names]
                lazies += [(name, pool.get_lazy(decoded, name)) for name in names[:2]]
                rng.shuffle(lazies)
                for name, lazy in lazies[: rng.randint(0, len(lazies))]:  # the rest is dropped unread
                    value = lazy.get()
                    if lazy.ds is store:
                        assert value == files[name]
                    else:
                        assert value == f"{name}: {files[name].hex()}"
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
        assert not thread.is_alive()
    assert errors == []
    gc.collect()
    wait_until(lambda: not pool._entries, "every entry is released")
    assert (pool.current_cache_count, pool.current_cache_size) == (0, 0)
    # A fetch still writing when its entry was released deletes its file once the write ends.
    wait_until(lambda: files_in(pool.cache_dir) == [], "every cached file is deleted")


# -- to_cache ---------------------------------------------------------------------------------


def test_to_cache(make_pool) -> None:
    pool = make_pool()
    lazy = pool.to_cache((1, "some_data", 2), "file1")
    path = lazy.cache_path
    assert isinstance(lazy, CacheFileLazy) and path is not None and path.is_file()
    assert path.parent == pool.cache_dir
    assert lazy.get() == (1, "some_data", 2) and lazy.get() == (1, "some_data", 2)
    assert lazy.cache_path is None and not path.exists()

    lazy2 = pool.to_cache(None, "file2")
    assert lazy2.cache_path is not None and lazy2.cache_path != path and lazy2 != lazy
    path2 = lazy2.cache_path
    del lazy2
    gc.collect()
    assert not path2.exists()
    assert (pool.current_cache_count, pool.current_cache_size) == (0, 0)  # not in the budget


# -- pickling, close, cleanup, fork ------------------------------------------------------------


def test_lazies_cannot_be_pickled_but_the_pool_arrives_fresh(make_pool) -> None:
    pool = make_pool(num_workers=2, max_cache_count=5, method="pickle")
    pool.max_cache_size = 12345
    lazy = pool.get_lazy(MemoryStore({"img_005.png": b"x"}, path="/data/images"), "img_005.png")
    with pytest.raises(LazyNotPicklableError, match="img_005.png") as info:
        pickle.dumps({"lazy": lazy})
    assert isinstance(info.value, TypeError) and "encode_sample" in str(info.value)
    with pytest.raises(LazyNotPicklableError, match="file1"):
        pickle.dumps(pool.to_cache(1, "file1"))

    copy_pool = pickle.loads(pickle.dumps(pool))
    try:
        assert copy_pool.cache_dir != pool.cache_dir and copy_pool._entries == {}
        assert (copy_pool.num_workers, copy_pool.max_cache_count, copy_pool.max_cache_size, copy_pool.method) == (
            2, 5, 12345, "pickle",
        )
    finally:
        copy_pool.close()
    assert not copy_pool.cache_dir.exists()


def test_close_removes_the_folder_and_refuses_new_lazies(make_pool) -> None:
    pool = make_pool(num_workers=1, max_cache_count=1)
    store = MemoryStore({"a": b"data a", "b": b"data b", "c": b"data c"})
    cached = pool.get_lazy(store, "a")
    assert cached.entry.send_to_cache_future.result(TIMEOUT)
    waiting = pool.get_lazy(store, "b")
    queued = pool.get_lazy(store, "c")
    wait_until(lambda: waiting.entry.state == "waiting", "b waits for room")
    kept = pool.to_cache("x", "kept")
    pool.close()
    assert not pool.cache_dir.exists()
    assert (pool.current_cache_count, pool.current_cache_size) == (0, 0)
    assert waiting.entry.send_to_cache_future.result(TIMEOUT) is False
    assert queued.entry.send_to_cache_future.cancelled()
    # Lazies made before still return their data, read directly.
    assert [lazy.get() for lazy in (cached, waiting, queued)] == [b"data a", b"data b", b"data c"]
    with pytest.raises(CachePoolClosedError, match="closed") as info:
        pool.get_lazy(store, "a")
    assert isinstance(info.value, RuntimeError)
    with pytest.raises(CachePoolClosedError):
        pool.to_cache(1, "late")
    with pytest.raises(Exception, match="gone"):
        kept.get()
    pool.close()  # again: nothing to do


def test_folder_is_removed_when_the_pool_is_collected(tmp_path: Path) -> None:
    pool = FileStoreCachePool(parent_cache_dir=tmp_path)
    lazy = pool.get_lazy(MemoryStore({"a": b"x"}), "a")
    assert lazy.entry.send_to_cache_future.result(TIMEOUT)
    folder = pool.cache_dir
    assert folder.is_dir()
    del pool, lazy
    gc.collect()
    assert not folder.exists() and list(tmp_path.iterdir()) == []


def test_interpreter_exits_with_a_fetch_waiting_and_removes_the_folder(tmp_path: Path) -> None:
    """Python joins executor threads before atexit: a fetch waiting for room must not hold it."""
    script = (
        "import sys, time\n"
        "from megatron_energon_lite.cache.base import FileStore\n"
        "from megatron_energon_lite.cache.file_cache_pool import FileStoreCachePool\n"
        "from megatron_energon_lite.source_info import SourceInfo\n"
        "class Store(FileStore):\n"
        "    def __getitem__(self, key):\n"
        "        return key.encode(), SourceInfo(dataset_path='s', index=key, shard_name='', file_names=(key,))\n"
        "    def get_path(self):\n"
        "        return 's'\n"
        "pool = FileStoreCachePool(parent_cache_dir=sys.argv[1], num_workers=1, max_cache_count=1)\n"
        "a = pool.get_lazy(Store(), 'a')\n"
        "assert a.entry.send_to_cache_future.result(30)\n"
        "b = pool.get_lazy(Store(), 'b')\n"
        "queued = [pool.get_lazy(Store(), str(i)) for i in range(3)]\n"
        "while b.entry.state != 'waiting':\n"
        "    time.sleep(0.01)\n"
        "pool.to_cache(b'x' * 100, 'left')\n"
        "print(pool.cache_dir)\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).parent == tmp_path
    assert list(tmp_path.iterdir()) == []


def _child_uses_the_pool(pool: FileStoreCachePool, store: MemoryStore, inherited: FileCacheLazy, out: Path) -> None:
    parent_dir = Path(out.with_suffix(".parent").read_text())
    assert pool.cache_dir != parent_dir and pool._entries == {}
    assert inherited.get() == b"data a"  # inherited: read directly, the parent's entry untouched
    lazies = [pool.get_lazy(store, name) for name in ("c", "d")]
    assert lazies[0].entry.send_to_cache_future.result(TIMEOUT)
    assert [p.parent for p in files_in(pool.cache_dir)] == [pool.cache_dir]
    assert [lazy.get() for lazy in lazies] == [b"data c", b"data d"]
    out.write_text(str(pool.cache_dir))
    # Exit with one file cached and a fetch waiting for room: the child must still end.
    held = pool.get_lazy(store, "c")
    assert held.entry.send_to_cache_future.result(TIMEOUT)
    waiting = pool.get_lazy(store, "d")
    wait_until(lambda: waiting.entry.state == "waiting", "d waits for room in the child")


def test_a_forked_child_gets_its_own_threads_and_folder(make_pool, tmp_path: Path) -> None:
    pool = make_pool(num_workers=1, max_cache_count=1)
    store = MemoryStore({name: f"data {name}".encode() for name in "abcd"})
    cached = pool.get_lazy(store, "a")
    assert cached.entry.send_to_cache_future.result(TIMEOUT)
    waiting = pool.get_lazy(store, "b")  # the parent forks with this fetch waiting for room
    wait_until(lambda: waiting.entry.state == "waiting", "b waits for room")
    out = tmp_path / "child.txt"
    out.with_suffix(".parent").write_text(str(pool.cache_dir))

    process = multiprocessing.get_context("fork").Process(target=_child_uses_the_pool, args=(pool, store, cached, out))
    process.start()
    process.join(TIMEOUT)
    assert process.exitcode == 0
    child_dir = Path(out.read_text())
    assert child_dir.parent == pool.cache_dir.parent and child_dir != pool.cache_dir
    assert not child_dir.exists()  # removed when the child exited

    # The parent is unaffected: same folder, its entries and fetches go on.
    assert cached.entry.refcount == 1 and len(files_in(pool.cache_dir)) == 1
    assert cached.get() == b"data a"
    assert waiting.entry.send_to_cache_future.result(TIMEOUT) is True
    assert waiting.get() == b"data b"
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [pool.cache_dir.name]
