"""Where the loader's time goes: per-stage times in the workers, the training loop's wait for batches.

Turned on per loader (``get_savable_loader(..., stall_report=True)``, or ``stall_report_every_s=N``
which also logs a one-line summary every N seconds from the main process); off, the stages pay one
check of a module attribute per hook call.

One item (batch) in :data:`TIME_EVERY` is timed and the totals are scaled up: a sample's stages
are a few microseconds of bookkeeping each, too much to pay for every text sample.  Each worker
process (or the main process, without workers) times its stages with a
:class:`StageClock`: the bad-sample guard that runs every hook, the decoder and the hand-over each
run under the clock, which keeps *exclusive* times (a decode inside a read counts as decode, not
as both).  ``read`` is the tar member and the field map (typed datasets); a crude dataset's
cooker is ``cook``.  What is left of ``pipeline.next()`` (shuffle buffer, blend, stage
bookkeeping) counts as ``pipeline``.  Reads, decodes and cooks happen before the blend, so they
are also kept per dataset.  After every item a worker copies its totals into its row of anonymous
shared memory (:class:`StageTimes`, made before the workers are forked, like the slabs), where
the main process reads them when asked; nothing travels with the batches.

The main process times how long the loop waited inside ``next()``: without workers that is all
of the loader's work; with workers, the part of it the workers did not hide.
"""

from __future__ import annotations

import logging
import mmap
import time
from typing import Any, Sequence

import numpy as np

from ..pipeline.stage_clock import STAGES, StageClock

__all__ = ["StageTimes", "StallReport"]

logger = logging.getLogger("megatron_energon_lite.stall")  # unchanged by the move into loader/: the name users configure


class StageTimes:
    """Per worker, in anonymous shared memory: the measured seconds per (dataset row, stage) (row
    0 is time not tied to one dataset, row ``k + 1`` dataset ``k``'s), and how many items it made
    and how many of them it timed."""

    def __init__(self, workers: int, dataset_names: Sequence[str]) -> None:
        self.dataset_names = tuple(dataset_names)
        shape = (max(workers, 1), len(self.dataset_names) + 1, len(STAGES))
        cells = int(np.prod(shape))
        self._map = mmap.mmap(-1, max((cells + 2 * shape[0]) * 8, mmap.PAGESIZE))
        self.seconds = np.frombuffer(self._map, dtype=np.float64, count=cells).reshape(shape)
        self.items = np.frombuffer(self._map, dtype=np.float64, count=2 * shape[0], offset=cells * 8).reshape(shape[0], 2)

    def clock(self, worker: int) -> StageClock:
        return StageClock(self.seconds[worker], self.items[worker], len(self.dataset_names))

    def estimate(self) -> np.ndarray:
        """The seconds per (worker, dataset row, stage) of all items: each worker's measured
        seconds scaled by its items over its timed items."""
        made, timed = self.items[:, 0], self.items[:, 1]
        scale = np.divide(made, timed, out=np.zeros_like(made), where=timed > 0)
        return self.seconds * scale[:, None, None]


def _stages(seconds: np.ndarray, total: float) -> dict[str, dict[str, float]]:
    """The stages that took time: seconds and share of ``total``."""
    return {name: {"s": float(s), "share": float(s / total) if total > 0 else 0.0} for name, s in zip(STAGES, seconds) if s > 0}


class StallReport:
    """A snapshot: how long the loop waited for batches, and the workers' time per stage."""

    def __init__(self, *, wall_s: float, waited_s: float, first_batch_s: float | None, batches: int, workers: int, seconds: np.ndarray, dataset_names: Sequence[str]) -> None:
        self.wall_s, self.waited_s, self.first_batch_s, self.batches, self.workers = wall_s, waited_s, first_batch_s, batches, workers
        self.seconds = seconds  # (worker, dataset row, stage)
        self.dataset_names = tuple(dataset_names)

    def __sub__(self, earlier: StallReport) -> StallReport:
        """What happened between ``earlier`` and this snapshot."""
        return StallReport(
            wall_s=self.wall_s - earlier.wall_s,
            waited_s=self.waited_s - earlier.waited_s,
            first_batch_s=None,
            batches=self.batches - earlier.batches,
            workers=self.workers,
            seconds=self.seconds - earlier.seconds,
            dataset_names=self.dataset_names,
        )

    def as_dict(self) -> dict[str, Any]:
        per_stage = self.seconds.sum(axis=(0, 1))
        worker_s = float(per_stage.sum())
        capacity = self.wall_s * max(self.workers, 1)
        datasets = {}
        for k, name in enumerate(self.dataset_names):
            row = self.seconds[:, k + 1, :].sum(axis=0)
            datasets[name] = {"s": float(row.sum()), "share": float(row.sum() / worker_s) if worker_s > 0 else 0.0, "stages": _stages(row, worker_s)}
        return {
            "wall_s": self.wall_s,
            "waited_s": self.waited_s,
            "waited_share": self.waited_s / self.wall_s if self.wall_s > 0 else 0.0,
            "first_batch_s": self.first_batch_s,
            "batches": self.batches,
            "workers": self.workers,
            "worker_s": worker_s,
            # Without workers the stages run inside the loop's wait: busy is the waited share.
            "worker_busy_share": worker_s / capacity if capacity > 0 else 0.0,
            "stages": _stages(per_stage, worker_s),
            "datasets": datasets,
        }

    def summary(self) -> str:
        """One line: the wait, and the stages that took most of the workers' time."""
        d = self.as_dict()
        top = sorted(((v["share"], name) for name, v in d["stages"].items() if v["share"] >= 0.005), reverse=True)[:3]
        stages = ", ".join(f"{name} {share:.0%}" for share, name in top) or "no stage time yet"
        where = "worker time" if self.workers else "loader time"
        line = f"loader waited {d['waited_share']:.0%} of {d['wall_s']:.1f} s ({d['batches']} batches); {stages} of {where}"
        if self.workers:
            line += f"; workers busy {d['worker_busy_share']:.0%}"
        return line

    def __repr__(self) -> str:
        return f"StallReport({self.summary()})"


class StallClock:
    """The main process's side: the loop's waits, and snapshots with the workers' stage times."""

    def __init__(self, times: StageTimes, workers: int, every_s: float | None) -> None:
        self.times = times
        self.workers = workers
        self.every_s = every_s
        self.started: float | None = None
        self.waited = 0.0
        self.first_batch: float | None = None
        self.batches = 0
        self._last_log: StallReport | None = None

    def waited_for(self, start: float, end: float) -> None:
        """The loop waited from ``start`` to ``end`` (perf_counter) for a batch."""
        if self.started is None:
            self.started = start
        if self.first_batch is None:
            self.first_batch = end - start
        self.waited += end - start
        self.batches += 1
        if self.every_s is not None:
            if self._last_log is None:
                self._last_log = self.report(now=end)
            elif end - self.started - self._last_log.wall_s >= self.every_s:
                current = self.report(now=end)
                logger.info("stall report, last %.0f s: %s", current.wall_s - self._last_log.wall_s, (current - self._last_log).summary())
                self._last_log = current

    def report(self, now: float | None = None) -> StallReport:
        now = time.perf_counter() if now is None else now
        return StallReport(
            wall_s=0.0 if self.started is None else now - self.started,
            waited_s=self.waited,
            first_batch_s=self.first_batch,
            batches=self.batches,
            workers=self.workers,
            seconds=self.times.estimate(),
            dataset_names=self.times.dataset_names,
        )
