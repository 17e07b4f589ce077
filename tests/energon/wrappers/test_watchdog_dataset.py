"""WatchdogDataset: a stuck item is reported (or stops the process); items and states never change."""

from __future__ import annotations

import gc
import logging
import multiprocessing
import os
import threading
import time
from pathlib import Path

import pytest
from energon_lite_dev.synthetic import generate_captioning_dataset

from megatron_energon_lite import (
    WorkerConfig,
    get_loader,
    get_savable_loader,
    get_val_dataset,
)
from megatron_energon_lite.errors import ConfigError
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.pipeline import watchdog as pipeline_watchdog
from megatron_energon_lite.pipeline.recipe import Watchdog
from megatron_energon_lite.energon.wrappers import MapDataset
from megatron_energon_lite.energon.wrappers.watchdog_dataset import (
    WatchdogDataset,
    WatchdogTimeoutError,
)

STALL_SECONDS = 1.5
TIMEOUT = 0.3  # well below the stall: the monitor checks every TIMEOUT / 4 seconds


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("watchdog") / "captions"
    generate_captioning_dataset(root, num_shards=2, samples_per_shard=6, image_size=(8, 6), seed=3)
    prepare_dataset(root, split_ratio=(0, 1, 0), progress=False, num_workers=1)
    (root / ".nv-meta/dataset.yaml").write_text(
        "sample_type:\n  __module__: megatron.energon\n  __class__: CaptioningSample\nfield_map:\n  image: jpg\n  caption: txt\n"
    )
    return root


def wc(workers: int = 0) -> WorkerConfig:
    return WorkerConfig(rank=0, world_size=1, num_workers=workers)


class Stall:
    """A map function that sleeps once (per process) on the ``which``-th sample it sees."""

    def __init__(self, which: int, seconds: float = STALL_SECONDS) -> None:
        self.which = which
        self.seconds = seconds
        self.seen = 0

    def __call__(self, sample):
        self.seen += 1
        if self.seen == self.which:
            time.sleep(self.seconds)
        return sample


def stalled(path: Path, workers: int = 0, which: int = 3, seconds: float = STALL_SECONDS) -> MapDataset:
    inner = get_val_dataset(path, split_part="val", worker_config=wc(workers), batch_size=None)
    return MapDataset(inner, Stall(which, seconds), worker_config=wc(workers))


@pytest.fixture
def triggers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Replaces the trigger with one that appends its process id to a file (works in workers too)."""
    record = tmp_path / "triggers.txt"

    def trigger(self) -> None:
        with record.open("a") as f:
            f.write(f"{os.getpid()}\n")

    monkeypatch.setattr(Watchdog, "_watchdog_trigger", trigger)  # the loader's watchdog and WatchdogDataset alike
    return record


def pids(record: Path) -> list[int]:
    return [int(line) for line in record.read_text().split()] if record.exists() else []


def test_a_stuck_item_is_reported_once_with_its_stack(dataset: Path, triggers: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="megatron_energon_lite.pipeline.watchdog"):
        keys = [s.__key__ for s in get_loader(stalled(dataset), watchdog_timeout_seconds=TIMEOUT)]
    assert len(keys) == 12
    assert pids(triggers) == [os.getpid()]  # once, in this process (no workers)
    dump = caplog.text
    assert "item 3 of rank 0, worker 0 is not done after 0.3 s" in dump
    assert "in __call__" in dump and "time.sleep(self.seconds)" in dump and "sample = CaptioningSample(" in dump


def test_the_watchdog_runs_inside_each_worker_and_reports_in_the_main_process(
    dataset: Path, triggers: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="megatron_energon_lite.pipeline.watchdog"):
        keys = [s.__key__ for s in get_loader(stalled(dataset, workers=2), watchdog_timeout_seconds=TIMEOUT)]
    assert len(keys) == 12
    found = pids(triggers)
    assert len(found) == 2 and os.getpid() not in found  # each worker stalls once, in its own process
    # The workers' stacks were logged by this process (caplog sees only this process's records).
    reports = [r for r in caplog.records if "is not done after" in r.getMessage()]
    assert {r.process for r in reports} == {os.getpid()}
    assert sorted(pid for r in reports for pid in found if f"(pid {pid}," in r.getMessage()) == sorted(found)
    assert all("time.sleep(self.seconds)" in r.getMessage() for r in reports)


def test_time_between_items_and_a_slow_first_item_are_not_counted(dataset: Path, triggers: Path) -> None:
    loader = get_loader(stalled(dataset, which=1, seconds=1.0), watchdog_timeout_seconds=0.8, watchdog_initial_timeout_seconds=30)
    for i, _ in enumerate(loader):
        if i == 1:
            time.sleep(1.2)  # the consumer is slow: not the pipeline's fault
    assert pids(triggers) == []


def test_items_and_states_are_those_without_a_watchdog(dataset: Path) -> None:
    def run(**watchdog):
        loader = get_savable_loader(stalled(dataset, workers=2, seconds=0), **watchdog)
        out = []
        for sample in loader:
            out.append((sample.__key__, sample.__restore_key__, loader.save_state_rank()))
        return out, loader

    watched, loader = run(watchdog_timeout_seconds=30)
    plain, _ = run(watchdog_timeout_seconds=None)
    assert watched == plain
    assert isinstance(loader.savable_dataset, Watchdog) and len(loader) == len(plain)

    # A state saved with a watchdog restores into a loader without one, and the reverse.
    middle = watched[4][2]
    resumed = get_savable_loader(stalled(dataset, workers=2, seconds=0), watchdog_timeout_seconds=None)
    resumed.restore_state_rank(middle)
    assert [s.__key__ for s in resumed] == [key for key, _, _ in watched[5:]]


def _iterate_and_fail(path: Path) -> None:
    list(get_loader(stalled(path, seconds=30), watchdog_timeout_seconds=TIMEOUT, fail_on_timeout=True))


def test_fail_on_timeout_ends_the_process(dataset: Path) -> None:
    process = multiprocessing.get_context("fork").Process(target=_iterate_and_fail, args=(dataset,))
    process.start()
    process.join(timeout=25)  # the stall is 30 s: an exit before it is the watchdog's
    if process.is_alive():
        process.kill()
    assert process.exitcode == 1


def test_fail_on_timeout_in_a_worker_raises_with_its_stack_in_the_main_process(dataset: Path) -> None:
    loader = get_loader(stalled(dataset, workers=1, seconds=60), watchdog_timeout_seconds=TIMEOUT, fail_on_timeout=True)
    with pytest.raises(WatchdogTimeoutError, match="stopped by the watchdog") as info:
        list(loader)
    message = str(info.value)
    assert "item 3 of rank 0, worker 0 is not done after 0.3 s" in message
    assert "time.sleep(self.seconds)" in message and "sample = CaptioningSample(" in message
    assert "exited unexpectedly" in str(info.value.__cause__)  # torch's error, kept as the cause


def test_fail_on_timeout_raises_in_the_trigger(dataset: Path) -> None:
    ds = WatchdogDataset(stalled(dataset), wc(), timeout_seconds=5, fail_on_timeout=True)
    with pytest.raises(WatchdogTimeoutError, match="longer than 5.0 s") as info:
        ds._watchdog_trigger()
    assert isinstance(info.value, TimeoutError)


def test_disabled_watchdog_and_bad_timeouts(dataset: Path) -> None:
    inner = stalled(dataset)
    assert type(WatchdogDataset(inner, wc(), timeout_seconds=None).build_worker(0)) is type(inner.build_worker(0))
    for bad in (0, -1, "60", True):
        with pytest.raises(ConfigError, match="positive number of seconds"):
            WatchdogDataset(inner, wc(), timeout_seconds=bad)
    with pytest.raises(ConfigError, match="initial_timeout_seconds"):
        get_loader(inner, watchdog_initial_timeout_seconds=0)


def watchdog_threads() -> int:
    return sum(t.name.startswith("energon-lite-watchdog") for t in threading.enumerate())


def wait_until(condition, seconds: float = 20.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_an_idle_loader_leaves_no_thread_and_restarts_its_watch(dataset: Path, triggers: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipeline_watchdog, "_IDLE_SECONDS", 0.3)
    gc.collect()
    assert wait_until(lambda: watchdog_threads() == 0)  # earlier loaders' monitors are gone
    stream = iter(get_loader(stalled(dataset, which=5), watchdog_timeout_seconds=TIMEOUT))
    next(stream)
    assert watchdog_threads() == 1
    assert wait_until(lambda: watchdog_threads() == 0)  # the loader is alive, but idle
    assert len(list(stream)) == 11  # item 5 stalls: a new monitor is started and reports it
    assert pids(triggers) == [os.getpid()]
