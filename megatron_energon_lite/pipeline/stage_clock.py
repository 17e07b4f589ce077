"""The stage clock of the stall report: the time a process spends in each stage of its pipeline.

The loader's stall report (``loader/stall.py``) turns it on per loader; off, the stages pay one
check of their runtime's ``clock`` per hook call.  One item (batch) in :data:`TIME_EVERY` is timed and
the loader scales the totals up: a sample's stages are a few microseconds of bookkeeping each,
too much to pay for every text sample.  Each worker process (or the main process, without
workers) times its stages with a :class:`StageClock`: the bad-sample guard that runs every hook
(``guard.py``), the decoder (``load.py``) and the hand-over each run under the clock, which keeps
*exclusive* times (a decode inside a read counts as decode, not as both).

The loader sits above the pipeline: it makes the clocks and sets a worker pipeline's runtime
(``pipeline/runtime.py``) to its clock for each item to time; the stages read the runtime's.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

__all__ = ["STAGES", "TIME_EVERY", "StageClock"]

#: Report names of the stages, in pipeline order.
STAGES: tuple[str, ...] = ("read", "decode", "cook", "encode_sample", "pack", "batch", "encode_batch", "other hooks", "pipeline", "hand-over")
_INDEX = {name: i for i, name in enumerate(STAGES)}
_OTHER = _INDEX["other hooks"]
#: The guards' stage names (hook names) -> report stages; any other hook is "other hooks".
_GUARD_STAGES = {
    "load": _INDEX["read"],
    "decode": _INDEX["decode"],
    "cook_crude_sample": _INDEX["cook"],
    "encode_sample": _INDEX["encode_sample"],
    "preencode_sample": _INDEX["encode_sample"],
    "postencode_sample": _INDEX["encode_sample"],
    "select_samples_to_pack": _INDEX["pack"],
    "pack_selected_samples": _INDEX["pack"],
    "batch": _INDEX["batch"],
    "encode_batch": _INDEX["encode_batch"],
    "pipeline": _INDEX["pipeline"],
    "hand-over": _INDEX["hand-over"],
}


_now = time.perf_counter


#: One item in this many is timed (its stages, its hand-over); the totals are scaled up.  Timing
#: costs about 0.5 us per stage call, which is 5-9% of a text batch when every item is timed.
TIME_EVERY = 8


class StageClock:
    """One process's stage times (exclusive), copied into its shared row by :meth:`publish`."""

    __slots__ = ("_row", "_counts", "_totals", "_inner", "_dataset", "_datasets", "_made", "_timed", "_started")

    def __init__(self, row: np.ndarray, counts: np.ndarray, datasets: int) -> None:
        self._row, self._counts = row, counts
        self._totals = row.tolist()  # go on from what an earlier pass of this worker measured
        self._made, self._timed = (int(v) for v in counts)
        self._started = False
        self._inner = 0.0  # time of the stages run inside the one running now
        self._dataset = 0
        self._datasets = datasets

    def for_next_item(self) -> StageClock | None:
        """This clock if the next item is one to time (one in :data:`TIME_EVERY`), else None.

        The first item of a pass is neither timed nor counted: it opens shards and fills the
        buffers, which scaled up would stand for far more than it is (the report gives the time
        to the first batch apart)."""
        if not self._started:
            self._started = True
            return None
        self._made += 1
        if self._made % TIME_EVERY != 1 % TIME_EVERY:
            return None
        self._timed += 1
        return self

    def run(self, stage: str, dataset: int | None, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, its time (less that of stages inside it) counted for ``stage``."""
        outer_inner, outer_dataset = self._inner, self._dataset
        self._inner = 0.0
        if dataset is not None and dataset < self._datasets:
            self._dataset = dataset + 1
        start = _now()
        try:
            return fn(*args)
        finally:
            elapsed = _now() - start
            self._totals[self._dataset][_GUARD_STAGES.get(stage, _OTHER)] += elapsed - self._inner
            self._inner = outer_inner + elapsed
            self._dataset = outer_dataset

    def publish(self) -> None:
        self._row[:] = self._totals
        self._counts[:] = (self._made, self._timed)
