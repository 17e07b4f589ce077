"""Energon's entry points: ``get_train_dataset``, ``get_val_dataset``, ``get_loader``,
``get_savable_loader``; and the only place that knows about dataloader workers (where a pass ends
and how the next begins is ``pipeline/passes.py``'s; the state format is ``rank_state.py``'s).

State plumbing (DESIGN.md, State rule 6): every worker sends its pipeline state along with each
item it yields.  The main process keeps the last state it *consumed* from each worker and whose
turn is next, so ``save_state_rank()`` is exact at every step without snapshots or replay.  On
restore, worker ids are rotated so that the worker whose turn it was yields first.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import pickle
import re
import time
from typing import Any, Iterator, Mapping

import torch
import torch.utils.data

from .bundles import (
    MAX_BUNDLE_ITEMS,
    Bundle,
    BundleLimits,
    Interleave,
    bundle_seconds_from_env,
    bundled,
)
from .cache.base import CachePool
from .errors import (
    ConfigError,
    DatasetError,
    EmptyDatasetError,
    StateError,
    WatchdogTimeoutError,
    WorkerStartTimeoutError,
    collect_skip_reports,
    format_message,
    take_skip_reports,
)
from .format.metadataset import (
    Blender,
    BlendPlan,
    is_metadataset_path,
    load_blend_plan,
    single_dataset_plan,
    with_subflavors,
    with_subset,
)
from .handover import (
    SlabRing,
    dump_for_main,
    load_from_worker,
    slab_bytes_from_env,
)
from .pipeline.aux_sources import activate_cache_pool
from .pipeline.build import (
    PipelineSpec,
    build_worker_pipeline,
    default_recipe,
    rank_length,
    validate,
    worker_lengths,
)
from .pipeline.node import Node, as_key, get_restore_key, set_restore_key
from .pipeline.passes import on_top
from .pipeline.stage_clock import StageClock, activate_clock, timed
from .pipeline.state_check import nested
from .pipeline.watchdog import StuckReports
from .rank_state import REDISTRIBUTED_FROM, RankState
from .skip_report import SkipLedger
from .stall import StageTimes, StallClock, StallReport
from .storage import configure_storage, configured_storage, is_remote
from .pipeline.recipe import Recipe, Watchdog, input_recipes, share
from .pipeline.task_hooks import DefaultHooks, Hooks
from .worker import WorkerConfig
from .worker_queue import DirectForkContext, direct_queues_from_env
from .worker_slabs import activate_slabs
from .worker_start import StartWatch, worker_start_seconds_from_env

logger = logging.getLogger(__name__)

# Items leaving a worker get ("Worker", local worker id) in front of their restore key, so that
# restore_sample rebuilds them in the right worker's pipeline (hooks see worker-specific indices).
WORKER_TAG = "Worker"

_UNSET: Any = object()


class PipelineDataset(Recipe):
    """What ``get_train_dataset`` / ``get_val_dataset`` return: the pipeline of a spec, as
    ``pipeline/build.py`` composes it, or as the task encoder composes it
    (``Hooks.compose_pipeline``: Energon's ``build_*`` overrides) from the same stage recipes.

    A composition equal to the default one is the default one: the same stages, lengths,
    fingerprint and elastic resume. Any other composition's fingerprint adds its recipes
    (``"composition"``), and it is moved to another topology stage by stage."""

    def __init__(self, spec: PipelineSpec, recipe: Recipe | None = None) -> None:
        super().__init__()
        validate(spec)
        self.spec = spec
        default = default_recipe(spec)
        self.recipe = default if recipe is None or recipe == default else recipe
        self.composed = self.recipe is not default
        self.worker_config = spec.worker_config
        # Also validates the dataset and split up front.
        self._worker_lengths = worker_lengths(spec) if not self.composed else [self.recipe.worker_length(w) for w in range(spec.worker_config.workers_per_rank)]
        self._length = rank_length(spec, self._worker_lengths)
        if spec.training and spec.repeat and not any(self._worker_lengths):
            # An endless stream of nothing: the first batch would be a bare StopIteration.
            wc = spec.worker_config
            raise EmptyDatasetError(
                format_message(
                    f"rank {wc.rank} of {wc.world_size} gets nothing to train on",
                    where=f"{spec.path} (split {spec.split_part})",
                    expected="at least one item for this rank per epoch (a training stream repeats forever)",
                    found=f"{sum(dataset.total for dataset in spec.datasets)} samples shared by {wc.world_size} rank(s) x {wc.workers_per_rank} worker(s)"
                    + (f", batch_size {spec.batch_size} with batch_drop_last" if spec.batch_drop_last else ""),
                    fix="use fewer ranks or workers, a larger dataset or subset, or batch_drop_last=False",
                )
            )
        # Saved with every state: computed once.
        self._config = spec.fingerprint() if not self.composed else {**spec.fingerprint(), "composition": self.recipe.config()}
        if self.composed:
            _warn_unmovable(self.recipe)

    def build_worker(self, local_worker_id: int) -> Node:
        return build_worker_pipeline(self.spec, local_worker_id, self.recipe)

    def worker_length(self, local_worker_id: int) -> int:
        if self.passes_continue and not self.composed:  # virtual epochs and val limits give each worker its share
            return share(self._length, self.worker_config.workers_per_rank, local_worker_id)
        return self._worker_lengths[local_worker_id]

    def __len__(self) -> int:
        return self._length

    def config(self) -> dict[str, Any]:
        return self._config

    def with_topology(self, worker_config: WorkerConfig) -> PipelineDataset:
        spec = self.spec.with_topology(worker_config)
        return PipelineDataset(spec, self.recipe.with_topology(worker_config) if self.composed else None)

    @property
    def passes_continue(self) -> bool:
        if self.composed:
            return self.recipe.passes_continue
        # Virtual epochs and val limits split one stream into passes; the pipeline keeps going.
        spec = self.spec
        return bool(spec.training and spec.virtual_epoch_length) or (not spec.training and spec.limit is not None)


def _warn_unmovable(recipe: Recipe) -> None:
    """Says at build time which stages of a composed pipeline are not the core's stage recipes:
    such a pipeline saves and restores exactly, but cannot be resumed on another topology."""
    found = []
    pending = [recipe]
    while pending:
        current = pending.pop()
        if type(current).with_topology is Recipe.with_topology:
            found.append(type(current).__qualname__)
        pending.extend(input_recipes(current))
    if found:
        logger.warning(
            "the task encoder's pipeline has stages that are not the loader's stage recipes (%s): it saves and "
            "restores exactly, but restore_state_global cannot move it to another number of ranks or workers",
            ", ".join(sorted(set(found))),
        )


class _WorkerStreams(torch.utils.data.IterableDataset):
    """What the DataLoader iterates: in each worker, that worker's pipeline from the dataset's
    recipe, yielding ``(item, logical worker id, state after this item)``."""

    def __init__(self, dataset: Recipe) -> None:
        super().__init__()
        self.recipe = dataset
        self.worker_config = dataset.worker_config
        self._pipelines: dict[int, Node] = {}  # each ends its passes (passes.on_top)
        self._restored: RankState | None = None
        # Between passes a pipeline starts over, unless its passes continue one stream (virtual
        # epochs, limits): then the stage that cuts the stream owns the boundary.
        self._restart_passes = not dataset.passes_continue
        self._rotation = 0
        #: Set by the loader when it runs worker processes: their watchdog reports reach it.
        self.stuck_reports: StuckReports | None = None
        #: Set by the loader when it runs worker processes: where each tells that it started.
        self.start_watch: StartWatch | None = None
        #: Set by the loader: the cache pool its cookers get (active while a pipeline runs).
        self.cache_pool: CachePool | None = None
        #: Set by the loader when it runs worker processes: the shared memory items go out through.
        self.slabs: SlabRing | None = None
        #: Set by the loader when its workers send items in bundles: the main process's limits
        #: on their sizes, and the seconds a worker may spend on one (see bundles.py).
        self.bundles: tuple[BundleLimits, float] | None = None
        #: Set by the loader when its stall report is on: where each process's stage times go.
        self.stage_times: StageTimes | None = None
        from .debug_log import WorkerLog

        self._debug_log = WorkerLog.create(dataset)  # None unless worker_log_level asks for it

    def restore(self, state: RankState) -> None:
        """Build the pipelines anew from ``state``, the worker whose turn it is first."""
        self._restored = state
        self._rotation = state.next_worker
        self._pipelines.clear()

    def _pipeline(self, logical: int) -> Node:
        pipeline = self._pipelines.get(logical)
        if pipeline is None:
            pipeline = on_top(self.recipe.build_worker(logical), restart=self._restart_passes)
            restored = self._restored
            if restored is not None and restored.worker_states[logical] is not None:
                with nested("worker_states", logical):  # names the field of a bad value (state_check)
                    pipeline.reset(copy.deepcopy(restored.worker_states[logical]))
                if restored.pass_ended:
                    pipeline.pass_was_over()
            self._pipelines[logical] = pipeline
        return pipeline

    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        if info is not None and self.start_watch is not None:
            self.start_watch.started(info.id)
        entries = self._entries(info)  # a generator: nothing runs (or raises) before the first item is asked for
        if info is None or self.bundles is None:
            return entries
        limits, seconds = self.bundles
        # The worker's logical id (checked against the topology by _entries, which raises into the bundle).
        logical = (info.id + self._rotation) % self.worker_config.workers_per_rank
        return bundled(entries, logical, _carried, _carried_size, seconds, limits, where=f"in DataLoader worker process {info.id}")

    def _entries(self, info: Any) -> Iterator[tuple[Any, int, dict | None, tuple]]:
        """``(item, logical worker id, state after this item, skip reports)`` until the pass ends.

        Skips are collected for the main process to log and list, and with the stall report on,
        the stages run under this process's clock.  A worker process runs nothing else, so both
        stay on there (the hand-over after each item is timed too); in the main process they are
        on only while this pipeline runs: another loader's may run between two items."""
        physical = self.worker_config.current_worker_id("the loader's dataset")
        logical = (physical + self._rotation) % self.worker_config.workers_per_rank
        in_worker = info is not None
        clock = None if self.stage_times is None else self.stage_times.clock(physical)
        timing = None if clock is None else clock.for_next_item()  # the clock, when this item is timed
        _enter_pipeline(timing)
        try:
            activate_cache_pool(self.cache_pool)  # before a restore replays cookers
            pipeline = self._pipeline(logical)
            if in_worker:
                activate_slabs(self.slabs, physical)
                if self.stuck_reports is not None:
                    self.stuck_reports.attach()
            while True:
                try:
                    item = pipeline.next() if timing is None else timing.run("pipeline", None, pipeline.next)
                except StopIteration:  # this worker's pass is over; the next call begins the next
                    skips = take_skip_reports()
                    if skips[0] or skips[1]:  # skipped after this worker's last item
                        entry = SKIPS_ONLY, logical, None, skips
                        if not in_worker:
                            _leave_pipeline()
                        yield entry
                    return
                state = pipeline.get_state() if timing is None else timing.run("pipeline", None, pipeline.get_state)
                entry = self._entry(item, logical, state)
                if clock is not None:
                    clock.publish()
                if not in_worker:
                    _leave_pipeline()
                yield entry  # in a worker, a timed item's hand-over is timed too
                timing = None if clock is None else clock.for_next_item()
                _enter_pipeline(timing)
        finally:
            if clock is not None:
                clock.publish()
            if not in_worker:
                _leave_pipeline()

    def _entry(self, item: Any, logical: int, state: dict) -> tuple[Any, int, dict, tuple]:
        item = set_restore_key(item, (WORKER_TAG, logical, *get_restore_key(item)))
        if self._debug_log is not None:
            self._debug_log.yielded(item, logical)
        return item, logical, state, take_skip_reports()


def _enter_pipeline(clock: StageClock | None) -> None:
    """A loader's pipeline runs in this process now: collect its skips, time it (``clock``)."""
    collect_skip_reports()
    activate_clock(clock)


def _leave_pipeline() -> None:
    collect_skip_reports(False)
    activate_clock(None)


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


class _Carrier:
    """What a worker sends: its payload pickled at once, in the worker's main thread, or the
    error that names the sample when it cannot be pickled.

    A multiprocessing queue pickles in a background thread that only prints a failure, so the
    main process would wait forever for the lost item; pickling here turns the failure into an
    :class:`UnpicklableItem`.  (With ``ENERGON_LITE_DIRECT_QUEUES=0`` it is also cheaper: the
    queue's thread then gets one bytes object instead of pickling the payload while the two
    threads hand the GIL back and forth; the default queue writes from this thread anyway, see
    :mod:`.worker_queue`.)  Tensors go through shared memory (:mod:`.handover`).
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


def _dataset_names(dataset: Any) -> list[str]:
    """The plan's datasets, for the stall report (none when ``dataset`` is not our pipeline)."""
    while not isinstance(dataset, PipelineDataset) and isinstance(getattr(dataset, "dataset", None), Recipe):
        dataset = dataset.dataset
    if not isinstance(dataset, PipelineDataset):
        return []
    names = [str(leaf.path) for leaf in dataset.spec.plan.leaves]
    return [f"{name} (#{k})" if names.count(name) > 1 else name for k, name in enumerate(names)]


def _slab_ring(num_workers: int, prefetch_factor: int, bundles: bool) -> SlabRing | None:
    """The workers' slabs: one per batch a worker may have queued, one the loop holds, and with
    bundles a bundle's worth more, and one for the pickles of each bundle in flight (freed when
    the main process has read them).  Small tensor batches come in bundles of up to 16, and with
    only ``prefetch_factor + 1`` slabs 20-50% of them found none free and went torch's way
    (2 workers, 32 x 2048 int64 batches: 9.0k samples/s against 12.1k with the extra slabs).
    Slabs are address space until a batch is written to one, and the lowest free one is taken
    first, so the extra ones cost memory only when that many batches are in flight."""
    slab_bytes = slab_bytes_from_env()
    if slab_bytes == 0:
        return None
    try:
        return SlabRing(num_workers, prefetch_factor + 1 + (MAX_BUNDLE_ITEMS + prefetch_factor + 1 if bundles else 0), slab_bytes)
    except (OSError, ValueError) as exc:  # address space or memory limits
        logger.warning("no shared-memory slabs for the workers (%s); batches go through torch's shared memory", exc)
        return None


def _converted(entry: tuple[Any, int, dict | None, tuple]) -> tuple[Any, int, dict | None, tuple]:
    """As Energon's DataLoader (batch_size=None): numpy arrays in items become tensors."""
    item, logical, state, skips = entry
    return (item if item is SKIPS_ONLY else torch.utils.data.default_convert(item), logical, state, skips)


class _PackedState:
    """A worker's state as the main process holds it: pickled in the worker, unpickled only when
    a state is saved.  Every item carries its worker's state but only the last one of each worker
    is ever read; unpickling each (a shuffle buffer's keys are hundreds of small lists) cost the
    main process about as much as the text batch it came with."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __reduce__(self):
        return _PackedState, (self.data,)

    def value(self) -> dict:
        return pickle.loads(self.data)


def _state_value(state: dict | _PackedState | None) -> dict | None:
    return state.value() if isinstance(state, _PackedState) else state


def _packed(entry: tuple[Any, int, dict | None, tuple]) -> tuple[Any, int, _PackedState | None, tuple]:
    item, logical, state, skips = _converted(entry)
    return item, logical, None if state is None else _PackedState(pickle.dumps(state, pickle.HIGHEST_PROTOCOL)), skips


def _carried(entry: tuple[Any, int, dict | None, tuple]) -> _Carrier:
    return timed("hand-over", _carrier_of, entry)


def _carrier_of(entry: tuple[Any, int, dict | None, tuple]) -> _Carrier:
    return _Carrier(_packed(entry))


def _carried_size(carrier: _Carrier) -> int:
    return 0 if carrier.data is None else len(carrier.data)


def _convert_item(entry: Any) -> Any:
    """The DataLoader's ``collate_fn``: an entry converted (and in a worker, pickled); a bundle
    holds its entries so already."""
    if isinstance(entry, Bundle):
        return entry
    return _converted(entry) if torch.utils.data.get_worker_info() is None else _carried(entry)


class SavableDataLoader(torch.utils.data.DataLoader):
    """A DataLoader whose position can be saved and restored exactly at every step."""

    #: Energon's counter of loader and pass ids (``id`` and ``iter_id`` of the debug log records).
    _next_id = 0

    @staticmethod
    def next_id() -> int:
        value = SavableDataLoader._next_id
        SavableDataLoader._next_id = value + 1
        return value

    def __init__(
        self,
        dataset: Recipe,
        *,
        prefetch_factor: int = 2,
        cache_pool: CachePool | None = None,
        stall_report: bool = False,
        stall_report_every_s: float | None = None,
    ) -> None:
        if not isinstance(dataset, Recipe):
            raise ConfigError(format_message("get_loader expects the result of get_train_dataset, get_val_dataset or a dataset wrapper", found=type(dataset).__name__))
        self.savable_dataset = dataset
        self.worker_config = dataset.worker_config
        num_workers = self.worker_config.num_workers
        extra: dict[str, Any] = {}
        if num_workers > 0:
            # Workers write their messages themselves (see worker_queue.py).
            context = DirectForkContext() if direct_queues_from_env() else "fork"
            extra = dict(prefetch_factor=prefetch_factor, persistent_workers=True, multiprocessing_context=context)
        super().__init__(
            _WorkerStreams(dataset),
            batch_size=None,
            shuffle=False,
            num_workers=num_workers,
            collate_fn=_convert_item,
            pin_memory=torch.cuda.is_available(),
            **extra,
        )
        self._stuck_reports = StuckReports() if num_workers > 0 else None
        self.dataset.stuck_reports = self._stuck_reports
        start_seconds = worker_start_seconds_from_env() if num_workers > 0 else 0
        self._start_watch = StartWatch(num_workers, start_seconds) if start_seconds > 0 else None
        self.dataset.start_watch = self._start_watch
        # Made before the workers are forked, so that they share it (see handover.py).
        seconds = bundle_seconds_from_env() if num_workers > 0 else 0
        self._slabs = _slab_ring(num_workers, prefetch_factor, seconds > 0) if num_workers > 0 else None
        self.dataset.slabs = self._slabs
        self._bundle_limits = BundleLimits(num_workers) if seconds > 0 else None
        self.dataset.bundles = None if self._bundle_limits is None else (self._bundle_limits, seconds)
        self._stall: StallClock | None = None
        if stall_report or stall_report_every_s is not None:
            times = StageTimes(num_workers, _dataset_names(dataset))
            self._stall = StallClock(times, num_workers, stall_report_every_s)
            self.dataset.stage_times = times
        #: What cookers get as ``TaskEncoder.cache`` (in the workers: their forked copy).
        self.cache_pool = cache_pool
        self.dataset.cache_pool = cache_pool
        self._stream: Iterator | None = None
        self._worker_states: list[dict | _PackedState | None] = [None] * self.worker_config.workers_per_rank
        self._next_worker = 0
        #: The logical worker (0 .. workers_per_rank - 1) that produced the last item yielded.
        self.last_worker_id: int | None = None
        self._first_worker = 0  # the logical worker served by physical worker 0
        self._started = False
        #: The loop over the loader ended (StopIteration) after the last item it yielded.
        self._pass_ended = False
        #: Samples the default error handler skipped (logged here with key and reason, also when
        #: a worker process skipped them).
        self._skips = SkipLedger(num_workers)
        from .debug_log import LoaderLog

        self.id = self.next_id()
        self._debug_log = LoaderLog.create(self.worker_config, self.id, dataset)  # None unless worker_log_level >= 1

    def __len__(self) -> int:
        return len(self.savable_dataset)

    def __iter__(self):
        self._started = True
        if self._stream is None:
            if self._pass_ended and self._first_worker != 0:
                self._unrotate_workers()
            if self._stuck_reports is not None:
                self._stuck_reports.start()
            forks = self.num_workers > 0 and self._iterator is None  # new workers start
            if forks and self._slabs is not None:
                self._slabs.reclaim_in_flight()
            if forks and self._start_watch is not None:
                self._start_watch.lower()
            self._stream = super().__iter__()
            if forks and self._start_watch is not None:
                self._start_watch.watch(self._iterator._workers)
            if self._bundle_limits is not None:
                self._stream = Interleave(self._stream, self.worker_config.workers_per_rank, self._first_worker, self._bundle_limits)
            iter_id = self.next_id()
            if self._debug_log is not None:
                self._debug_log.start_pass(iter_id)
        stream = self._stream
        debug_log = self._debug_log
        n = self.worker_config.workers_per_rank
        stall = self._stall
        while True:
            asked = time.perf_counter() if stall is not None else 0.0
            try:
                entry = next(stream)
            except RuntimeError as exc:
                self._raise_if_stuck(exc)
                raise
            except StopIteration:
                self._stream = None
                self._pass_ended = True
                self._next_worker = self._first_worker
                if debug_log is not None:
                    debug_log.end_pass()
                return
            if isinstance(entry, UnpicklableItem):
                raise DatasetError(entry.message)
            item, logical, state, skips = entry
            if skips[0] or skips[1]:
                self._skips.add(logical, *skips)
            if item is SKIPS_ONLY:
                continue
            self._worker_states[logical] = state
            self._pass_ended = False
            self._next_worker = (logical + 1) % n
            self.last_worker_id = logical
            if debug_log is not None:
                debug_log.yielded(item, logical)
            if stall is not None:
                stall.waited_for(asked, time.perf_counter())
            yield item

    def _unrotate_workers(self) -> None:
        """After the first pass of a restored loader, whose workers were rotated so that the one
        whose turn it was went first: the next passes start with worker 0, as they do in the
        uninterrupted run, so the workers start again unrotated, each from its last state."""
        self.dataset.restore(RankState(worker_states=self._current_worker_states(), next_worker=0, pass_ended=True, config=self.savable_dataset.config()))
        self._next_worker = self._first_worker = 0
        if self._iterator is not None:  # persistent workers hold the rotated pipelines
            self._iterator._shutdown_workers()
            self._iterator = None

    def _raise_if_stuck(self, exc: RuntimeError) -> None:
        """A worker that did not start and was stopped (``worker_start.py``), or that exited after
        its watchdog report (``fail_on_timeout``): raise with the report."""
        if self._stuck_reports is None or "DataLoader worker" not in str(exc):
            return
        # torch: "DataLoader worker (pid(s) 12, 34) exited unexpectedly", "... (pid 12) is killed by signal"
        named = re.search(r"\(pid(?:\(s\))? ([\d, ]+)\)", str(exc))
        pids = [int(pid) for pid in re.findall(r"\d+", named.group(1))] if named else []
        if self._start_watch is not None:
            report = self._start_watch.report_of(pids)
            if report is not None:
                raise WorkerStartTimeoutError(report) from exc
        report = self._stuck_reports.report_of(pids)
        if report is not None:
            raise WatchdogTimeoutError(
                format_message(
                    "a dataloader worker was stopped by the watchdog (fail_on_timeout=True)",
                    found=report,
                    fix="find the stuck call in the stack above; raise watchdog_timeout_seconds "
                    "(or watchdog_initial_timeout_seconds for the first item) if the work is just slow",
                )
            ) from exc

    @property
    def skipped_samples(self) -> int:
        """Skips of the default error handler so far (one may name several samples: a batch)."""
        return self._skips.skips

    def skip_report(self) -> dict[str, Any]:
        """The samples the default error handler skipped so far, also in worker processes: counts
        per dataset and shard, and the first ones with key, shard, stage and reason (see
        ``skip_report.py``)."""
        return self._skips.report()

    def stall_report(self) -> StallReport:
        """Where the time went since the loop first asked for a batch (see ``stall.py``): how long
        it waited for batches, and the workers' (without workers: the loader's) time per stage,
        per dataset for reads, decodes and cooks.  ``.summary()`` is one line, ``.as_dict()``
        the figures.  Needs ``stall_report=True`` (or ``stall_report_every_s``) when the loader
        is made."""
        if self._stall is None:
            raise ConfigError(
                format_message(
                    "this loader does not time its stages",
                    fix="make it with get_savable_loader(dataset, stall_report=True) (or stall_report_every_s=N to also log a summary every N seconds)",
                )
            )
        return self._stall.report()

    # --- state ---------------------------------------------------------------------------------
    def save_state_rank(self) -> dict:
        """This rank's position: plain JSON (see :class:`RankState`), small, exact at every step."""
        return RankState(
            worker_states=self._current_worker_states(),
            next_worker=self._next_worker,
            pass_ended=self._pass_ended,
            config=self.savable_dataset.config(),
        ).to_json()

    def _current_worker_states(self) -> tuple[dict | None, ...]:
        return tuple(_state_value(state) for state in self._worker_states)

    def restore_state_rank(self, state: dict | None) -> None:
        """Continue from ``state`` (from :meth:`save_state_rank`); only before iterating."""
        if state is None:
            return
        if self._started:
            raise StateError(format_message("restore_state_rank must be called before iterating the loader", fix="create a fresh loader, restore, then iterate"))
        if isinstance(state, dict) and REDISTRIBUTED_FROM in state:  # energon-lite checkpoint redist
            from .elastic import redistributed_rank_state

            self._restore(redistributed_rank_state(state, self.savable_dataset, self.worker_config))
            return
        self._restore(RankState.from_json(state, config=self.savable_dataset.config(), worker_config=self.worker_config))

    def _restore(self, restored: RankState) -> None:
        if self._started:
            raise StateError(format_message("a loader state must be restored before iterating the loader", fix="create a fresh loader, restore, then iterate"))
        self.dataset.restore(restored)
        self._worker_states = list(restored.worker_states)
        self._next_worker = self._first_worker = restored.next_worker
        self._pass_ended = restored.pass_ended

    def save_state_global(self, global_dst_rank: int) -> list[dict] | None:
        """Gathers every rank's state on ``global_dst_rank`` (None on the other ranks)."""
        import torch.distributed as dist

        state = self.save_state_rank()
        if not (dist.is_available() and dist.is_initialized()):
            return [state]
        group = self.worker_config.data_parallel_group
        gathered: list[Any] | None = [None] * dist.get_world_size(group) if dist.get_rank() == global_dst_rank else None
        dist.gather_object(state, gathered, dst=global_dst_rank, group=group)
        return gathered

    def restore_state_global(self, states: list[dict] | None, *, src_rank: int | None = None) -> None:
        """Restores from every rank's state (``save_state_global``; sent from ``src_rank`` when
        given).  Saved on the same topology, this rank takes its own entry; saved on another
        number of ranks or workers, the rest of the running epoch is divided over this topology
        (``elastic.py``: every sample not yet delivered comes once)."""
        import torch.distributed as dist

        if src_rank is not None and dist.is_available() and dist.is_initialized():
            box: list[Any] = [states if dist.get_rank() == src_rank else None]
            dist.broadcast_object_list(box, src=src_rank, group=self.worker_config.data_parallel_group)
            states = box[0]
        if states is None:
            return
        wc = self.worker_config
        saved = [s.get("config", {}) if isinstance(s, dict) else {} for s in states] if isinstance(states, (list, tuple)) else []
        same_topology = len(states) == wc.world_size and all(
            c.get("worker_config.world_size") == wc.world_size and c.get("worker_config.num_workers") == wc.num_workers for c in saved
        )
        if same_topology:
            self.restore_state_rank(states[wc.rank])
            return
        from .elastic import elastic_rank_state

        self._restore(elastic_rank_state(states, self.savable_dataset, wc))

    def restore_sample(self, restore_key: tuple) -> Any:
        """Rebuilds a sample or batch from its ``__restore_key__`` by random access."""
        key = as_key(restore_key)
        if len(key) < 2 or key[0] != WORKER_TAG or not isinstance(key[1], int):
            raise StateError(format_message("not a restore key of this loader", expected=f"({WORKER_TAG!r}, worker id, ...)", found=repr(restore_key)[:200]))
        pipeline = self.savable_dataset.build_worker(key[1])
        activate_cache_pool(self.cache_pool)
        return set_restore_key(pipeline.restore(key[2:]), key)

    def blend_report(self) -> list[dict[str, Any]]:
        """This rank's realized blend so far: see :func:`blend_report`."""
        return blend_report(self.save_state_rank())

    def can_restore_sample(self) -> bool:
        return True

    def config(self) -> dict[str, Any]:
        return self.savable_dataset.config()


def blend_report(states: dict | list[dict]) -> list[dict[str, Any]]:
    """Samples consumed per blended dataset and their share, computed from saved states alone.

    ``states`` is one rank's state (``save_state_rank()``) or all ranks' (``save_state_global``),
    so a blend can be checked while training or from a checkpoint.  Each row holds the dataset's
    ``path``, ``split_part``, ``target_share`` (its normalised weight; for ``blend_epochized``
    its share of the samples of one pass), ``samples`` consumed so far (samples waiting in a
    shuffle buffer are not counted) and ``share`` of all consumed samples; with
    ``blend_mode="cost"`` also ``cost`` (e.g. tokens) and ``cost_share``, counted as the blend
    yielded them (a shuffle buffer's waiting samples included).
    """
    from .pipeline.blend import blended_costs, consumed_counts

    rank_states = [states] if isinstance(states, dict) else list(states)
    datasets = rank_states[0].get("config", {}).get("datasets") if rank_states else None
    if not datasets:
        raise ConfigError(format_message("the state holds no blend", expected="a state of a loader over a metadataset with several datasets or a Blender", fix="blend reports exist for blended training datasets"))
    totals = [0] * len(datasets)
    costs = [0] * len(datasets)
    for state in rank_states:
        for worker_state in state["worker_states"]:
            counts = consumed_counts(worker_state, len(datasets)) if worker_state is not None else None
            for i, count in enumerate(counts or ()):
                totals[i] += count
            for i, cost in enumerate((blended_costs(worker_state) if worker_state is not None else None) or ()):
                costs[i] += cost
    consumed = sum(totals)
    rows = [
        {
            "path": leaf["path"],
            "split_part": leaf["split_part"],
            "target_share": leaf["target_share"],
            "samples": count,
            "share": count / consumed if consumed else 0.0,
        }
        for leaf, count in zip(datasets, totals)
    ]
    if rank_states[0]["config"].get("blend_mode") == "cost":
        # Costs of everything the blends yielded, samples waiting in a shuffle buffer included.
        for row, cost in zip(rows, costs):
            row["cost"] = cost
            row["cost_share"] = cost / sum(costs) if sum(costs) else 0.0
    return rows


def _plan(path, split_part: str, *, training: bool) -> tuple[str, BlendPlan]:
    """(a display name for ``path``, what it reads): a dataset folder, a .jsonl file, a metadataset
    YAML, a metadataset dict or a :class:`Blender`."""
    if is_metadataset_path(path):
        name = "<metadataset dict>" if isinstance(path, Mapping) else "Blender" if isinstance(path, Blender) else str(path)
        plan = load_blend_plan(path, split_part, training=training)
    else:
        name = str(path)
        plan = single_dataset_plan(path, split_part)
    zero = [leaf for leaf in plan.leaves if leaf.weight == 0]
    if zero:
        for leaf in zero:
            logger.warning("%s has weight 0: it is left out of the blend", leaf.where)
        plan = dataclasses.replace(plan, leaves=tuple(leaf for leaf in plan.leaves if leaf.weight != 0))
    return name, plan


def _warn_slow_exact_schedule(plan: BlendPlan, worker_config: WorkerConfig) -> None:
    from .pipeline.blend import TABLE_LIMIT, integer_weights

    period = sum(integer_weights([leaf.weight for leaf in plan.leaves]))
    workers = worker_config.world_size * worker_config.workers_per_rank
    if period > TABLE_LIMIT and workers > 1:
        logger.warning(
            "exact blend: the weights of %s normalise to a schedule period of %d positions (more than %d), "
            "so each worker steps through about %d schedule positions per sample (~0.6 us each); "
            "round the weights (e.g. to 4 significant digits) to make every step a table lookup",
            plan.source or "the blend", period, TABLE_LIMIT, workers,
        )


def _configure_storage(path, storage_options: dict | None) -> None:
    """``storage_options`` apply to the protocol of ``path`` when it is a URL, else to every remote
    URL the call reads (datasets named in a local metadataset YAML)."""
    if storage_options is None:
        return
    if not isinstance(storage_options, Mapping):
        raise ConfigError(format_message("storage_options must be a dict", found=type(storage_options).__name__, fix="pass e.g. {'key': ..., 'secret': ..., 'endpoint_url': ...}"))
    protocol = str(path).partition("://")[0] if is_remote(path) else "*"
    configure_storage(protocol, storage_options=storage_options)


# Keyword arguments of get_train_dataset / get_val_dataset beyond the named ones. Energon's:
# dataset_config and split_config; what its dataset factories take (parallel_shard_iters,
# subflavors, subset, sample_type; for validation also max_samples_per_sequence and
# shuffle_over_epochs_multiplier, named arguments of get_train_dataset); its deprecated decoder
# arguments and handler. Ours: trust_dataset_code, group_buffer_size, storage_options.
_DATASET_KWARGS = frozenset({
    "dataset_config", "split_config", "parallel_shard_iters", "subflavors", "subset", "sample_type",
    "auto_decode", "image_decode", "av_decode", "video_decode_audio", "handler",
    "trust_dataset_code", "group_buffer_size", "storage_options",
})
_VAL_KWARGS = frozenset({"max_samples_per_sequence", "shuffle_over_epochs_multiplier"})
_DEPRECATED_DECODER_KWARGS = ("image_decode", "av_decode", "video_decode_audio")


def _apply_deprecated_decoder_kwargs(kwargs: dict, task_encoder: Hooks) -> None:
    """Energon's deprecated ``auto_decode``, ``image_decode``, ``av_decode``, ``video_decode_audio``
    and ``handler`` (popped from ``kwargs``), with Energon's precedence: ``auto_decode=False``
    sets the task encoder's decoder to None; the decoder arguments replace the default decoder
    (a FutureWarning says to set the decoder instead) and must agree with a decoder the task
    encoder sets itself; ``handler`` is ignored for ``worker_config.global_error_handler``."""
    import warnings

    from .decode import SampleDecoder

    auto_decode = kwargs.pop("auto_decode", True)
    decoder_args = {key: kwargs.pop(key) for key in _DEPRECATED_DECODER_KWARGS if key in kwargs}
    if "handler" in kwargs:
        kwargs.pop("handler")
        warnings.warn(
            "the handler argument is deprecated and ignored (as in Energon): failing samples go to "
            "WorkerConfig.global_error_handler; pass WorkerConfig(..., global_error_handler=...) instead",
            FutureWarning,
            stacklevel=4,
        )
    if not isinstance(auto_decode, bool):
        raise ConfigError(format_message("auto_decode must be True or False", found=repr(auto_decode)))
    if not auto_decode:
        task_encoder.decoder = None  # as Energon: on the task encoder, for every later call too
        return
    if not decoder_args:
        return
    warnings.warn(
        f"the decoder arguments {', '.join(decoder_args)} are deprecated (as in Energon): set the task "
        f"encoder's decoder instead, e.g. decoder = SampleDecoder({', '.join(f'{k}={v!r}' for k, v in decoder_args.items())})",
        FutureWarning,
        stacklevel=4,
    )
    current = task_encoder.decoder
    if current is Hooks.decoder:  # the default decoder: the arguments replace it
        task_encoder.decoder = SampleDecoder(**decoder_args)
        return
    differing = (
        sorted(decoder_args) if current is None else [key for key, value in decoder_args.items() if getattr(current, key) != value]
    )
    if differing:
        raise ConfigError(
            format_message(
                f"the decoder arguments {', '.join(differing)} conflict with the decoder {type(task_encoder).__name__} sets",
                expected=f"{', '.join(f'{k}={getattr(current, k)!r}' for k in differing)} (the task encoder's decoder)" if current is not None else "no decoder arguments: the task encoder's decoder is None",
                found=", ".join(f"{k}={decoder_args[k]!r}" for k in differing),
                fix="drop the arguments and configure the task encoder's decoder (decoder = SampleDecoder(...))",
            )
        )


def _check_sample_type(spec: PipelineSpec, sample_type: Any) -> None:
    """Energon's ``sample_type`` argument: every dataset must yield that type (or a subclass)."""
    from .format.dataset_config import require_sample_type

    if not isinstance(sample_type, type):
        raise ConfigError(format_message("sample_type must be a class", found=repr(sample_type)[:80], fix="pass e.g. sample_type=CaptioningSample"))
    for leaf, dataset in zip(spec.plan.leaves, spec.datasets):
        if leaf.join is None:  # a join's sample type is its joiner's
            require_sample_type(dataset.yields, sample_type, where=leaf.where)


def _check_aux(spec: PipelineSpec) -> None:
    """``aux:`` sources are read by cookers: a dataset that is not crude would never read them."""
    from .samples import CrudeSample

    for leaf, dataset in zip(spec.plan.leaves, spec.datasets):
        if leaf.aux and dataset.yields is not CrudeSample:
            raise ConfigError(
                format_message(
                    "aux sources are read by cookers, but this dataset is not crude",
                    where=f"{leaf.where}.aux",
                    found=f"aux {', '.join(leaf.aux)} on a dataset of typed samples ({leaf.path})",
                    fix="make the dataset crude (dataset.yaml: __class__: CrudeWebdataset) and cook it with a cooker "
                    "that takes the aux names as arguments, or remove aux",
                )
            )


def _spec(path, *, training: bool, worker_config, task_encoder, packing_buffer_size, kwargs: dict, split_part: str, plan: BlendPlan | None = None, blend_mode: str | None = None, **settings) -> PipelineSpec:
    """Checks the arguments shared by both dataset constructors and builds the spec."""
    if worker_config is None:  # Energon requires one; ours defaults as Energon's default_worker_config
        worker_config = WorkerConfig.default_worker_config()
    if not isinstance(worker_config, WorkerConfig):
        raise ConfigError(format_message("worker_config must be a WorkerConfig", found=type(worker_config).__name__, fix="pass WorkerConfig.default_worker_config(num_workers)"))
    task_encoder = DefaultHooks() if task_encoder is _UNSET else task_encoder
    if not isinstance(task_encoder, Hooks):
        raise ConfigError(format_message("task_encoder must be a TaskEncoder", found=type(task_encoder).__name__))
    known = _DATASET_KWARGS if training else _DATASET_KWARGS | _VAL_KWARGS
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise ConfigError(format_message(f"unknown keyword argument {unknown[0]!r}", expected=f"one of {', '.join(sorted(known))}", found=", ".join(unknown)))
    kwargs = dict(kwargs)
    _apply_deprecated_decoder_kwargs(kwargs, task_encoder)
    sample_type, subflavors, subset = (kwargs.pop(key, None) for key in ("sample_type", "subflavors", "subset"))
    _configure_storage(path, kwargs.pop("storage_options", None))
    if plan is None:
        name, plan = _plan(path, split_part, training=training)
    else:
        name = str(path)
    plan = with_subset(with_subflavors(plan, subflavors), subset)
    if blend_mode is not None and plan.blend_mode is not None and blend_mode != plan.blend_mode:
        raise ConfigError(
            format_message(
                "blend_mode differs between the argument and the metadataset",
                where=f"{plan.source}: blend_mode",
                found=f"argument {blend_mode!r}, YAML {plan.blend_mode!r}",
                fix="drop one of them",
            )
        )
    mode = blend_mode or plan.blend_mode or "random"
    if mode == "exact" and plan.kind == "blend" and training:
        _warn_slow_exact_schedule(plan, worker_config)
    spec = PipelineSpec(path=name, split_part=split_part, training=training, worker_config=worker_config, task_encoder=task_encoder, plan=plan, blend_mode=mode, packing_buffer_size=packing_buffer_size, storage=configured_storage(), **settings, **kwargs)
    # Checked against the datasets as the spec resolved them (their metadata is read once).
    if sample_type is not None:
        _check_sample_type(spec, sample_type)
    _check_aux(spec)
    return spec


def _dataset(spec: PipelineSpec, mock: Any = None) -> Recipe:
    """The dataset of a spec: the default pipeline, or what the task encoder's ``build_*`` overrides
    compose; with ``mock`` (the argument, else the YAML's ``mock:``) its first item per worker, again
    and again (``mock.py``)."""
    from .mock import MockDataset, mock_mode

    from_yaml = mock is None
    mode = mock_mode(getattr(spec.plan, "mock", False) if from_yaml else mock, where=f"{spec.plan.source}: mock" if from_yaml else "mock=...")
    dataset = _real_dataset(spec)
    if mode is None:
        return dataset
    endless = spec.training and spec.repeat and not dataset.passes_continue
    return MockDataset(dataset, mode=mode, endless=endless, name=f"{spec.path} (split {spec.split_part})")


def _real_dataset(spec: PipelineSpec) -> PipelineDataset:
    return PipelineDataset(spec, spec.task_encoder.compose_pipeline(spec))


def get_train_dataset(
    path,
    *,
    split_part: str = "train",
    worker_config: WorkerConfig | None = None,
    batch_size: int | None,
    batch_drop_last: bool = False,
    packing_buffer_size: int | None = None,
    shuffle_buffer_size: int | None = None,
    max_samples_per_sequence: int | None = None,
    virtual_epoch_length: int = 0,
    shuffle_over_epochs_multiplier: int | None = 1,
    task_encoder: Hooks = _UNSET,
    repeat: bool = True,
    blend_mode: str | None = None,
    mock: bool | str | None = None,
    **kwargs,
) -> Recipe:
    """Energon's ``get_train_dataset``: shuffled slices, optional shuffle buffer, infinite by default.

    ``path`` is a prepared dataset, a ``.jsonl`` file, a metadataset YAML (or dict) or a
    :class:`Blender`.  ``blend_mode`` (ours): ``"random"`` draws each sample's dataset by weight
    as Energon does; ``"exact"`` follows a deterministic schedule that keeps the realized counts
    within one sample of the weights at every step of the global stream.  Default: the YAML's
    ``blend_mode``, else ``"random"``.

    Energon requires ``worker_config``, ``shuffle_buffer_size`` and ``max_samples_per_sequence``;
    here they default to ``WorkerConfig.default_worker_config()`` (rank and world size from
    torch.distributed, 4 workers) and None (no sample shuffle buffer; each slice is a whole
    shard). Other keyword arguments: Energon's ``dataset_config``, ``split_config``,
    ``parallel_shard_iters``, ``subflavors``, ``subset``, ``sample_type`` and its deprecated
    ``auto_decode``, ``image_decode``, ``av_decode``, ``video_decode_audio`` and ``handler``
    (see :func:`_apply_deprecated_decoder_kwargs`); ours: ``trust_dataset_code`` (run the
    dataset's ``sample_loader.py``), ``group_buffer_size`` and ``storage_options``.

    ``mock`` (ours; default: the YAML's ``mock:``, else off): ``True`` yields each worker's first
    real batch again and again, the same object, without reading or decoding after it (the
    training loop's ceiling); ``"copy"``: a fresh copy of it each time.  See ``mock.py``.
    """
    spec = _spec(
        path,
        training=True,
        worker_config=worker_config,
        task_encoder=task_encoder,
        packing_buffer_size=packing_buffer_size,
        kwargs=kwargs,
        split_part=split_part,
        batch_size=batch_size,
        batch_drop_last=batch_drop_last,
        shuffle_buffer_size=shuffle_buffer_size,
        max_samples_per_sequence=max_samples_per_sequence,
        virtual_epoch_length=virtual_epoch_length,
        shuffle_over_epochs_multiplier=shuffle_over_epochs_multiplier,
        repeat=repeat,
        blend_mode=blend_mode,
    )
    return _dataset(spec, mock)


def get_val_dataset(
    path,
    *,
    split_part: str = "val",
    worker_config: WorkerConfig | None = None,
    batch_size: int | None,
    batch_drop_last: bool = False,
    packing_buffer_size: int | None = None,
    limit: int | None = None,
    task_encoder: Hooks = _UNSET,
    _leaf_plan: BlendPlan | None = None,
    mock: bool | str | None = None,
    **kwargs,
) -> Recipe:
    """Energon's ``get_val_dataset``: sequential, one pass, ``limit`` batches per pass.

    Takes the keyword arguments of :func:`get_train_dataset` (``worker_config`` defaults the same
    way), plus Energon's ``max_samples_per_sequence`` and ``shuffle_over_epochs_multiplier``
    (accepted; validation reads in order, so the latter changes nothing), and ``mock``.
    """
    spec = _spec(
        path,
        training=False,
        worker_config=worker_config,
        task_encoder=task_encoder,
        packing_buffer_size=packing_buffer_size,
        kwargs=kwargs,
        split_part=split_part,
        batch_size=batch_size,
        batch_drop_last=batch_drop_last,
        limit=limit,
        repeat=False,
        plan=_leaf_plan,
    )
    return _dataset(spec, mock)


# Energon's loader arguments. Those that tune its snapshot/replay machinery or features we do
# not have (cache pools) are accepted so scripts run unchanged, and logged once; the watchdog
# ones (watchdog_timeout_seconds=60 by default, as in Energon) wrap the dataset in a
# WatchdogDataset, which changes neither items nor states.
_ENERGON_LOADER_ARGS = frozenset({
    "worker_config", "checkpoint_every_sec", "checkpoint_every_min_n_samples", "n_checkpoints",
    "gc_collect_every_n_steps", "cache_pool", "watchdog_timeout_seconds",
    "watchdog_initial_timeout_seconds", "fail_on_timeout",
})


def _make_loader(dataset: Recipe, prefetch_factor: int | None, energon_args: dict, ours: dict[str, Any]) -> SavableDataLoader:
    """``prefetch_factor`` None: the dataset's ``WorkerConfig.prefetch_factor``, else 2."""
    import warnings

    unknown = sorted(set(energon_args) - _ENERGON_LOADER_ARGS)
    if unknown:
        raise ConfigError(format_message(f"unknown loader argument {unknown[0]!r}", expected=f"prefetch_factor or one of Energon's: {', '.join(sorted(_ENERGON_LOADER_ARGS))}", found=", ".join(unknown)))
    cache_pool = energon_args.pop("cache_pool", None)
    if cache_pool is not None and not isinstance(cache_pool, CachePool):
        raise ConfigError(format_message("cache_pool must be a CachePool", expected="FileStoreCachePool(...), NoCachePool() or None", found=type(cache_pool).__name__))
    worker_config = getattr(dataset, "worker_config", None)
    given = energon_args.pop("worker_config", None)
    if given is not None:  # as Energon: deprecated, and it must be the dataset's
        if given != worker_config:
            raise ConfigError(
                format_message(
                    "the worker_config passed to the loader differs from the dataset's",
                    expected=repr(worker_config),
                    found=repr(given),
                    fix="drop worker_config here (deprecated in Energon too): the dataset's is used",
                )
            )
        warnings.warn("passing worker_config to get_loader / get_savable_loader is deprecated (as in Energon) and has no effect", FutureWarning, stacklevel=3)
    watchdog_timeout = energon_args.pop("watchdog_timeout_seconds", 60)
    watchdog_initial_timeout = energon_args.pop("watchdog_initial_timeout_seconds", None)
    fail_on_timeout = energon_args.pop("fail_on_timeout", False)
    if watchdog_timeout is not None and isinstance(dataset, Recipe):
        dataset = Watchdog(dataset, worker_config, timeout_seconds=watchdog_timeout, initial_timeout_seconds=watchdog_initial_timeout, fail_on_timeout=fail_on_timeout)
    ignored = sorted(k for k, v in energon_args.items() if v is not None)
    if ignored:
        logger.info("ignoring Energon loader arguments %s: states travel with every batch here", ", ".join(ignored))
    if prefetch_factor is None:
        prefetch_factor = getattr(worker_config, "prefetch_factor", None) or 2
    if worker_config is not None and not getattr(worker_config, "persistent_workers", True):
        logger.info("WorkerConfig(persistent_workers=False) is ignored: each worker keeps its pipeline's position, so workers persist")
    return SavableDataLoader(dataset, prefetch_factor=prefetch_factor, cache_pool=cache_pool, **ours)


def _stall_args(stall_report: bool, stall_report_every_s: float | None) -> dict[str, Any]:
    if not isinstance(stall_report, bool):
        raise ConfigError(format_message("stall_report must be True or False", found=repr(stall_report)[:80]))
    if stall_report_every_s is not None and (isinstance(stall_report_every_s, bool) or not isinstance(stall_report_every_s, (int, float)) or not stall_report_every_s > 0):
        raise ConfigError(format_message("stall_report_every_s must be a number of seconds > 0, or None", found=repr(stall_report_every_s)[:80]))
    return {"stall_report": stall_report, "stall_report_every_s": stall_report_every_s}


def get_loader(dataset: Recipe, *, prefetch_factor: int | None = None, stall_report: bool = False, stall_report_every_s: float | None = None, **energon_args) -> SavableDataLoader:
    """A loader over ``dataset`` (the same class as the savable one: saving costs nothing here).
    ``prefetch_factor`` defaults to the dataset's ``WorkerConfig.prefetch_factor``, else 2.
    As in Energon, ``watchdog_timeout_seconds`` (default 60, None: off),
    ``watchdog_initial_timeout_seconds`` (first item; default the same) and ``fail_on_timeout``
    watch each item's production: the stuck stack is logged, and with ``fail_on_timeout`` the
    process (the dataloader worker) exits.  Ours: ``stall_report=True`` times the loader's stages
    for :meth:`SavableDataLoader.stall_report`; ``stall_report_every_s=N`` also logs a one-line
    summary of the last N seconds (logger ``megatron_energon_lite.stall``, level INFO)."""
    return _make_loader(dataset, prefetch_factor, energon_args, _stall_args(stall_report, stall_report_every_s))


def get_savable_loader(dataset: Recipe, *, prefetch_factor: int | None = None, stall_report: bool = False, stall_report_every_s: float | None = None, **energon_args) -> SavableDataLoader:
    """Energon's savable loader.  Energon's checkpoint tuning arguments (``checkpoint_every_sec``,
    ``n_checkpoints``, ...) are accepted and ignored: states travel with every batch here.
    ``prefetch_factor`` defaults to the dataset's ``WorkerConfig.prefetch_factor``, else 2.
    The watchdog and stall report arguments work as in :func:`get_loader`."""
    return _make_loader(dataset, prefetch_factor, energon_args, _stall_args(stall_report, stall_report_every_s))


def get_val_datasets(path, *, split_part: str = "val", **kwargs) -> list[tuple[Recipe, dict[str, Any]]]:
    """Energon's ``get_val_datasets``: one validation dataset per leaf dataset, not concatenated.

    Each entry is ``(dataset, description)``; Energon gives its factory object as the second
    element, we give a plain dict (``path``, ``split_part``, ``subflavors``, ...).
    """
    _, plan = _plan(path, split_part, training=False)
    entries = []
    for leaf in plan.leaves:
        dataset = get_val_dataset(leaf.path, split_part=split_part, _leaf_plan=dataclasses.replace(plan, kind="single", leaves=(leaf,)), **kwargs)
        entries.append((dataset, {k: v for k, v in leaf.describe().items() if k not in ("weight", "repetitions")}))
    return entries
