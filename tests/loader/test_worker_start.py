"""The main process stops a dataloader worker that never starts (``loader/worker_start.py``).

CPython's fork deadlock (gh-112275) hangs a worker before any Python code runs in it.  Here a
worker hangs where its start flag would rise (the call that raises it never returns, in the
forked copies of this process): the loop gets a ``WorkerStartTimeoutError`` that names the
worker and the way out, instead of waiting forever.  Workers that start are left alone however
slow their dataset is, and the setting is checked.
"""

from __future__ import annotations

import gc
import re
import time
from pathlib import Path

import pytest

from megatron_energon_lite import (
    ConfigError,
    DefaultTaskEncoder,
    WorkerConfig,
    get_loader,
    get_train_dataset,
)
from megatron_energon_lite.errors import WorkerStartTimeoutError
from megatron_energon_lite.loader.worker_start import WORKER_START_ENV, StartWatch

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


@pytest.fixture(scope="module")
def texts(prepared_text: Path) -> Path:
    """The shared prepared text dataset (tests/conftest.py: 3 shards x 37 samples): read-only."""
    return prepared_text


def _loader(root: Path, task_encoder=None):
    config = WorkerConfig(rank=0, world_size=1, num_workers=2)
    return get_loader(get_train_dataset(root, batch_size=3, shuffle_buffer_size=5, max_samples_per_sequence=4, worker_config=config, task_encoder=task_encoder or DefaultTaskEncoder()))


def test_a_worker_that_never_starts_is_stopped_with_an_error_that_names_it(texts: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(WORKER_START_ENV, "1")
    monkeypatch.setattr(StartWatch, "started", lambda self, physical: time.sleep(30))  # stopped after 1 s; if not, starts late and the test fails
    loader = _loader(texts)
    began = time.monotonic()
    with pytest.raises(WorkerStartTimeoutError) as raised:
        next(iter(loader))
    assert time.monotonic() - began < 60  # 1 s, then torch's check for dead workers (every 5 s)
    message = str(raised.value)
    assert re.search(r"dataloader worker [01] \(pid \d+\) did not start", message)
    assert "gh-112275" in message and WORKER_START_ENV in message
    stopped = [int(pid) for pid in re.findall(r"\(pid (\d+)\)", message)]
    workers = {process.pid: process for process in loader._iterator._workers}
    assert stopped and all(pid in workers and not workers[pid].is_alive() for pid in stopped)
    del loader, workers
    gc.collect()


class _SlowFirstSample(DefaultTaskEncoder):
    """Its first sample takes longer than a worker may take to start."""

    def __init__(self) -> None:
        super().__init__()
        self.slept = False

    def encode_sample(self, sample):
        if not self.slept:
            self.slept = True
            time.sleep(2.5)
        return super().encode_sample(sample)


def test_workers_that_start_are_left_alone_however_slow_their_dataset(texts: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(WORKER_START_ENV, "0.5")
    loader = _loader(texts, _SlowFirstSample())
    it = iter(loader)
    keys = [next(it).__key__ for _ in range(10)]
    assert len(keys) == 10 and all(process.is_alive() for process in loader._iterator._workers)
    del it, loader
    gc.collect()


def test_the_setting_is_checked(texts: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(WORKER_START_ENV, "soon")
    with pytest.raises(ConfigError, match=WORKER_START_ENV):
        _loader(texts)
    monkeypatch.setenv(WORKER_START_ENV, "0")  # off
    assert _loader(texts)._start_watch is None
    monkeypatch.delenv(WORKER_START_ENV)
    assert _loader(texts)._start_watch.seconds == 120
