"""What the DataLoader iterates and what its workers send: the worker streams and the hand-over
carrier.

Every worker sends its pipeline state along with each item it yields (DESIGN.md, State rule 6):
an entry is ``(item, logical worker id, state after this item, skip reports)``.  In a worker
process the entry is pickled at once (:class:`Carrier`; tensors go through the slabs of
``handover/slabs.py``), its state pickled apart (:class:`PackedState`), which the main process unpickles
only when a state is saved.
"""

from __future__ import annotations

import copy
import pickle
from functools import partial
from typing import Any, Iterator

import torch
import torch.utils.data

from .. import worker_slabs
from ..cache.base import CachePool
from ..errors import SkipSink, format_message
from ..pipeline.node import Node, get_restore_key, set_restore_key
from ..pipeline.passes import ending_pass, on_top
from ..pipeline.recipe import Recipe, check_takes_runtime, passes_continue
from ..pipeline.runtime import Runtime
from ..pipeline.skip import skipping
from ..pipeline.state_check import nested
from ..pipeline.watchdog import StuckReports
from .debug_log import WorkerLog
from .handover.bundles import Bundle, BundleLimits, bundled
from .handover.slabs import SlabRing, dump_for_main, load_from_worker
from .rank_state import RankState
from .skip_report import logger as skip_logger
from .stall import StageTimes
from .worker_start import StartWatch

__all__ = ["SKIPS_ONLY", "WORKER_TAG", "Carrier", "PackedState", "UnpicklableItem", "WorkerStreams", "convert_item", "state_value"]

# Items leaving a worker get ("Worker", local worker id) in front of their restore key, so that
# restore_sample rebuilds them in the right worker's pipeline (hooks see worker-specific indices).
WORKER_TAG = "Worker"


class WorkerStreams(torch.utils.data.IterableDataset):
    """What the DataLoader iterates: in each worker, that worker's pipeline from the dataset's
    recipe, yielding ``(item, logical worker id, state after this item)``."""

    def __init__(self, dataset: Recipe) -> None:
        super().__init__()
        check_takes_runtime(dataset)
        self.recipe = dataset
        self.worker_config = dataset.worker_config
        self._pipelines: dict[int, Node] = {}  # each ends its passes (passes.on_top)
        self._runtimes: dict[int, Runtime] = {}  # what each of them was built with (pipeline/runtime.py)
        self._restored: RankState | None = None
        # Between passes a pipeline starts over, unless its passes continue one stream (virtual
        # epochs, limits): then the stage that cuts the stream owns the boundary.
        self._restart_passes = not passes_continue(dataset)
        self._rotation = 0
        #: Set by the loader when it runs worker processes: their watchdog reports reach it.
        self.stuck_reports: StuckReports | None = None
        #: Set by the loader when it runs worker processes: where each tells that it started.
        self.start_watch: StartWatch | None = None
        #: Set by the loader: the cache pool its cookers get (through each pipeline's runtime).
        self.cache_pool: CachePool | None = None
        #: Set by the loader before its workers start: the samples a replay skips
        #: (``pipeline/skip.py``; ``(dataset, split index)`` -> description), None: none.
        self.sample_skips: dict[tuple[int, int], str] | None = None
        #: Set by the loader when it runs worker processes: the shared memory items go out through.
        self.slabs: SlabRing | None = None
        #: Set by the loader when its workers send items in bundles: the main process's limits
        #: on their sizes, and the seconds a worker may spend on one (see handover/bundles.py).
        self.bundles: tuple[BundleLimits, float] | None = None
        #: Set by the loader when its stall report is on: where each process's stage times go.
        self.stage_times: StageTimes | None = None

        self._debug_log = WorkerLog.create(dataset)  # None unless worker_log_level asks for it

    def restore(self, state: RankState) -> None:
        """Build the pipelines anew from ``state``, the worker whose turn it is first."""
        self._restored = state
        self._rotation = state.next_worker
        self._pipelines.clear()

    def _runtime(self, logical: int, in_worker: bool) -> Runtime:
        """What worker ``logical``'s pipeline gets of this loader: a skip sink whose skips go out
        with the items, the cache pool, and in a worker process the watchdog's report channel;
        the clock is set per item (:meth:`_entries`)."""
        runtime = self._runtimes.get(logical)
        if runtime is None:
            sink = self.stuck_reports.sink() if in_worker and self.stuck_reports is not None else None
            runtime = self._runtimes[logical] = Runtime(skips=SkipSink(), cache_pool=self.cache_pool, report_sink=sink, sample_skips=self.sample_skips)
        return runtime

    def _pipeline(self, logical: int, runtime: Runtime) -> Node:
        pipeline = self._pipelines.get(logical)
        if pipeline is None:
            # A replay's skips enter below the first batching or packing stage, else on top.
            pipeline = on_top(skipping(self.recipe.build_worker(logical, runtime), runtime), restart=self._restart_passes)
            restored = self._restored
            if restored is not None and restored.worker_states[logical] is not None:
                with nested("worker_states", logical):  # names the field of a bad value (state_check)
                    pipeline.reset(copy.deepcopy(restored.worker_states[logical]))
                if restored.pass_ended:
                    ending_pass(pipeline).pass_was_over()
            self._pipelines[logical] = pipeline
        return pipeline

    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        if info is not None and self.start_watch is not None:
            self.start_watch.started(info.id)
        entries = self._entries(info)  # a generator: nothing runs (or raises) before the first item is asked for
        if info is None:
            return entries
        # The worker's logical id (checked against the topology by _entries, which raises into the bundle).
        logical = (info.id + self._rotation) % self.worker_config.workers_per_rank
        carry = partial(_carried, self._runtime(logical, True))  # in the worker, pickled at once (times the hand-over)
        if self.bundles is None:
            return map(carry, entries)
        limits, seconds = self.bundles
        return bundled(entries, logical, carry, _carried_size, seconds, limits, where=f"in DataLoader worker process {info.id}")

    def _entries(self, info: Any) -> Iterator[tuple[Any, int, dict | None, tuple]]:
        """``(item, logical worker id, state after this item, skip reports)`` until the pass ends.

        The pipeline's skips are collected in its runtime for the main process to log and list,
        and with the stall report on, its stages run under this process's clock for the items it
        times (the runtime's clock; in a worker, the item's hand-over is timed too)."""
        physical = self.worker_config.current_worker_id("the loader's dataset")
        logical = (physical + self._rotation) % self.worker_config.workers_per_rank
        in_worker = info is not None
        runtime = self._runtime(logical, in_worker)
        clock = None if self.stage_times is None else self.stage_times.clock(physical)
        runtime.clock = None if clock is None else clock.for_next_item()  # the clock, when this item is timed
        try:
            pipeline = self._pipeline(logical, runtime)  # a restore may replay cookers: after the runtime is set
            if in_worker:
                worker_slabs.use_in_this_process(self.slabs, physical)
            while True:
                timing = runtime.clock
                try:
                    item = pipeline.next() if timing is None else timing.run("pipeline", None, pipeline.next)
                except StopIteration:  # this worker's pass is over; the next call begins the next
                    skips = runtime.skips.take()
                    if skips[0] or skips[1]:  # skipped after this worker's last item
                        yield SKIPS_ONLY, logical, None, skips
                    return
                state = pipeline.get_state() if timing is None else timing.run("pipeline", None, pipeline.get_state)
                entry = self._entry(item, logical, state, runtime.skips)
                if clock is not None:
                    clock.publish()
                yield entry  # in a worker, a timed item's hand-over is timed too
                runtime.clock = None if clock is None else clock.for_next_item()
        except Exception:
            if not in_worker:  # the run stops: its skips since the last item are logged, not lost
                records, more = runtime.skips.take()
                for record in records:
                    skip_logger.warning("%s", record.message)
                if more:
                    skip_logger.warning("skipped %d more samples (details not kept)", more)
            raise
        finally:
            if clock is not None:
                clock.publish()
            runtime.clock = None

    def _entry(self, item: Any, logical: int, state: dict, skips: SkipSink) -> tuple[Any, int, dict, tuple]:
        item = set_restore_key(item, (WORKER_TAG, logical, *get_restore_key(item)))
        if self._debug_log is not None:
            self._debug_log.yielded(item, logical)
        return item, logical, state, skips.take()


class _SkipsOnly:
    """The item of an entry that only carries skip reports (a worker skipped after its last item)."""

    def __reduce__(self):
        return (_skips_only, ())


def _skips_only() -> _SkipsOnly:
    return SKIPS_ONLY


SKIPS_ONLY = _SkipsOnly()


class UnpicklableItem:
    """Sent by a worker in place of an item it could not pickle; the main process raises it."""

    def __init__(self, message: str) -> None:
        self.message = message


class Carrier:
    """What a worker sends: its payload pickled at once, in the worker's main thread, or the
    error that names the sample when it cannot be pickled.

    A multiprocessing queue pickles in a background thread that only prints a failure, so the
    main process would wait forever for the lost item; pickling here turns the failure into an
    :class:`UnpicklableItem`.  (With ``ENERGON_LITE_DIRECT_QUEUES=0`` it is also cheaper: the
    queue's thread then gets one bytes object instead of pickling the payload while the two
    threads hand the GIL back and forth; the default queue writes from this thread anyway, see
    :mod:`.handover.queues`.)  Tensors go through shared memory (:mod:`.handover.slabs`).
    """

    __slots__ = ("data", "message")

    def __init__(self, payload: tuple[Any, int, dict, tuple]) -> None:
        self.data: bytes | None = None
        self.message: str | None = None
        try:
            self.data = dump_for_main(payload)
        except Exception as exc:  # noqa: BLE001 - any pickling failure is reported, not lost
            item = payload[0]
            key = getattr(item, "__key__", None) or (item.get("__key__") if isinstance(item, dict) else None)
            self.message = format_message(
                "a dataloader worker cannot send an item to the main process: it cannot be pickled",
                where=f"item with __key__ {key!r} (restore key {getattr(item, '__restore_key__', None)!r})",
                found=f"{type(exc).__name__}: {exc}",
                fix="return only tensors, numbers, strings and containers of them from encode_sample/"
                "batch/encode_batch (no open files, locks, lambdas or generators)",
            )

    def __reduce__(self):
        if self.data is None:
            return UnpicklableItem, (self.message,)
        return load_from_worker, (self.data,)



def _converted(entry: tuple[Any, int, dict | None, tuple]) -> tuple[Any, int, dict | None, tuple]:
    """As Energon's DataLoader (batch_size=None): numpy arrays in items become tensors."""
    item, logical, state, skips = entry
    return (item if item is SKIPS_ONLY else torch.utils.data.default_convert(item), logical, state, skips)


class PackedState:
    """A worker's state as the main process holds it: pickled in the worker, unpickled only when
    a state is saved.  Every item carries its worker's state but only the last one of each worker
    is ever read; unpickling each (a shuffle buffer's keys are hundreds of small lists) cost the
    main process about as much as the text batch it came with."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __reduce__(self):
        return PackedState, (self.data,)

    def value(self) -> dict:
        return pickle.loads(self.data)


def state_value(state: dict | PackedState | None) -> dict | None:
    return state.value() if isinstance(state, PackedState) else state


def _packed(entry: tuple[Any, int, dict | None, tuple]) -> tuple[Any, int, PackedState | None, tuple]:
    item, logical, state, skips = _converted(entry)
    return item, logical, None if state is None else PackedState(pickle.dumps(state, pickle.HIGHEST_PROTOCOL)), skips


def _carried(runtime: Runtime, entry: tuple[Any, int, dict | None, tuple]) -> Carrier:
    """In a worker: ``entry`` pickled for the main process, timed when its item is."""
    clock = runtime.clock
    return _carrier_of(entry) if clock is None else clock.run("hand-over", None, _carrier_of, entry)


def _carrier_of(entry: tuple[Any, int, dict | None, tuple]) -> Carrier:
    return Carrier(_packed(entry))


def _carried_size(carrier: Carrier) -> int:
    return 0 if carrier.data is None else len(carrier.data)


def convert_item(entry: Any) -> Any:
    """The DataLoader's ``collate_fn``: an entry converted; in a worker, the stream pickled it
    already (a carrier, or a bundle of them)."""
    if isinstance(entry, (Bundle, Carrier)):
        return entry
    return _converted(entry)
