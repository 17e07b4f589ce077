"""The main process's check that every dataloader worker it forked does start.

A forked worker that hangs before it runs any Python code never reaches the loader's watchdog
(which runs inside the worker), and torch's DataLoader only notices workers that die: the
training loop would wait for its first batch forever.  This happens: CPython before 3.11.8 and
3.12.1 can deadlock a child forked while another thread of the parent holds an interpreter lock
(gh-112275; torch.distributed's threads make it likely), and it hung our own two-rank test once.

So each worker raises a flag in shared memory (made before the fork) as soon as the loader's code
runs in it, and a thread of the main process waits for all the flags.  A worker whose flag is
still down :data:`WORKER_START_ENV` seconds after the fork (default 120) is reported and stopped
(``SIGKILL``); torch then finds it dead and the loader raises
:class:`~megatron_energon_lite.errors.WorkerStartTimeoutError` with the report instead of
waiting.  Nothing a dataset or a task encoder does runs before the flag, so slow datasets never
trip it.
"""

from __future__ import annotations

import logging
import mmap
import os
import signal
import sys
import threading
import time
from typing import Any

import numpy as np

from .env_settings import nonnegative_number
from ..errors import format_message

__all__ = ["WORKER_START_ENV", "StartWatch", "worker_start_seconds_from_env"]

logger = logging.getLogger("megatron_energon_lite.worker_start")  # unchanged by the move into loader/: the name users configure

#: Environment variable: seconds a forked worker may take to start (default 120); 0: no check.
WORKER_START_ENV = "ENERGON_LITE_WORKER_START_S"
_DEFAULT_SECONDS = 120.0
#: How often the main process's thread looks at the flags.
_POLL_SECONDS = 0.2


def worker_start_seconds_from_env() -> float:
    return nonnegative_number(WORKER_START_ENV, _DEFAULT_SECONDS, unit="seconds", zero_means="never stop a worker that does not start")


class StartWatch:
    """One flag per physical worker of a loader, in anonymous shared memory made before the
    workers are forked: :meth:`lower` in the main process before it forks them, :meth:`started`
    in each worker, :meth:`watch` in the main process once they are forked."""

    def __init__(self, num_workers: int, seconds: float) -> None:
        self.seconds = seconds
        self._map = mmap.mmap(-1, max(num_workers, 1))
        self._flags = np.frombuffer(self._map, dtype=np.uint8, count=num_workers)
        self._reports: dict[int, str] = {}
        self._lock = threading.Lock()

    def lower(self) -> None:
        """In the main process, before it forks new workers (a worker may start before
        :meth:`watch` is called)."""
        self._flags[:] = 0

    def started(self, physical: int) -> None:
        """In a worker: it runs."""
        self._flags[physical] = 1

    def watch(self, processes: list[Any]) -> None:
        """In the main process, right after it forked ``processes`` (multiprocessing's, in
        physical order): stop those that have not started within the allowed time."""
        thread = threading.Thread(target=self._wait, args=(list(processes), time.monotonic() + self.seconds), name="energon-lite-worker-start", daemon=True)
        thread.start()

    def _wait(self, processes: list[Any], deadline: float) -> None:
        while not self._flags.all() and time.monotonic() < deadline:
            time.sleep(_POLL_SECONDS)
        if self._flags.all():
            return
        for physical in np.flatnonzero(self._flags == 0):
            process = processes[physical]
            # Not reaped yet, so its pid is still its own (a loader shut down meanwhile has
            # joined its workers).
            if not process.is_alive():
                continue
            pid = process.pid
            report = format_message(
                f"dataloader worker {physical} (pid {pid}) did not start: {self.seconds:g} s after it was forked it had not run the loader's code, so it was stopped",
                expected="a forked worker runs the loader within a second or two",
                found=f"no sign of it; Python {sys.version.split()[0]}",
                fix="a child forked while another thread of the parent held an interpreter lock can hang before it runs "
                "any Python code (CPython gh-112275, fixed in 3.11.8 and 3.12.1; threads of torch.distributed make it "
                f"likely): use a newer Python; on a machine short of memory or CPU, set {WORKER_START_ENV} to wait longer "
                "(0: never stop a worker), and look at a stuck worker with `py-spy dump --native --pid <pid>`",
            )
            with self._lock:
                self._reports[pid] = report
            logger.error("%s", report)
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:  # it ended meanwhile
                pass

    def report_of(self, pids: list[int]) -> str | None:
        """The report of one of ``pids`` that this watch stopped, if any."""
        with self._lock:
            return next((self._reports[pid] for pid in pids if pid in self._reports), None)
