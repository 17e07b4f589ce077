"""``SavableDataLoader``: iteration over the worker streams (``streams.py``), the watchdog's and
the worker start's reports, skipped samples, the stall report, and the rank's state.

State plumbing (DESIGN.md, State rule 6): the main process keeps the last state it *consumed* from
each worker and whose turn is next, so ``save_state_rank()`` is exact at every step without
snapshots or replay.  On restore, worker ids are rotated so that the worker whose turn it was
yields first.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import time
from typing import Any, Iterator

import torch
import torch.utils.data

from ..cache.base import CachePool
from ..errors import (
    ConfigError,
    DatasetError,
    StateError,
    WatchdogTimeoutError,
    WorkerStartTimeoutError,
    format_message,
)
from ..format.safe_parse import check_nesting
from ..manifest import MANIFEST_ENV, ManifestWriter, dataset_tables, run_identity
from ..pipeline.node import as_key, get_restore_key, set_restore_key, unkeyed
from ..pipeline.recipe import Recipe
from ..pipeline.runtime import Runtime
from ..policy import PLAIN, Policy
from ..pipeline.watchdog import StuckReports
from .blend_report import blend_report
from .dataset import PipelineDataset
from .changed_data import continued_rank_state
from .debug_log import LoaderLog
from .elastic import elastic_rank_state, redistributed_rank_state
from .handover.bundles import (
    MAX_BUNDLE_ITEMS,
    BundleLimits,
    Interleave,
    bundle_seconds_from_env,
)
from .handover.queues import DirectForkContext, direct_queues_from_env
from .handover.slabs import SlabRing, slab_bytes_from_env
from .rank_state import REDISTRIBUTED_FROM, DataCheck, RankState, check_saved_data, saved_manifest_step, saved_sample_skips
from .env_settings import DATA_CHANGE_ENV, JOIN_NEW_SHARDS_ENV, SKIPS_ENV, opt_in, skips_from_env
from .grown import grown_states, prefix_records
from .reweight import apply_weight_edit
from .sample_skips import SkipList, resolve_skips
from .skip_report import SkipLedger
from .stall import StageTimes, StallClock, StallReport
from .streams import (
    SKIPS_ONLY,
    WORKER_TAG,
    PackedState,
    UnpicklableItem,
    WorkerStreams,
    convert_item,
    state_value,
)
from .worker_start import StartWatch, worker_start_seconds_from_env

__all__ = ["SavableDataLoader"]

logger = logging.getLogger("megatron_energon_lite.loader")  # loader.py's, unchanged by the split: the name users configure


def _dataset_names(dataset: Any) -> list[str]:
    """The plan's datasets, for the stall report (none when ``dataset`` is not our pipeline)."""
    dataset = _pipeline_dataset(dataset)
    if dataset is None:
        return []
    names = [str(leaf.path) for leaf in dataset.spec.plan.leaves]
    return [f"{name} (#{k})" if names.count(name) > 1 else name for k, name in enumerate(names)]


def _pipeline_dataset(dataset: Any) -> PipelineDataset | None:
    """The pipeline under the watchdog and mock wrappers (None: a dataset of the user's own)."""
    while not isinstance(dataset, PipelineDataset) and isinstance(getattr(dataset, "dataset", None), Recipe):
        dataset = dataset.dataset
    return dataset if isinstance(dataset, PipelineDataset) else None


def _manifest_writer(folder: str | os.PathLike[str] | None, dataset: Recipe) -> ManifestWriter | None:
    """The manifest of ``folder``, else of ``ENERGON_LITE_MANIFEST`` (unset or empty: none).  The
    variable reaches every loader of a program (training and validation ones), so each gets a
    subfolder named by its split and run fingerprint (a resumed run finds its own again)."""
    config, data = dataset.config(), dataset.data_record()
    if folder is None:
        root = os.environ.get(MANIFEST_ENV, "").strip()
        if not root:
            return None
        folder = os.path.join(root, f"{config.get('split_part', 'data')}-{run_identity(config, data)['fingerprint'][:12]}")
    wc = dataset.worker_config
    pipeline = _pipeline_dataset(dataset)
    return ManifestWriter(
        folder,
        rank=wc.rank,
        world_size=wc.world_size,
        num_workers=wc.num_workers,
        config=config,
        data=data,
        datasets=dataset_tables(pipeline.spec) if pipeline is not None else [],
    )


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
        policy: Policy = PLAIN,
        manifest: str | os.PathLike[str] | None = None,
    ) -> None:
        if not isinstance(dataset, Recipe):
            raise ConfigError(format_message("get_loader expects the result of get_train_dataset, get_val_dataset or a dataset wrapper", found=type(dataset).__name__))
        self.savable_dataset = dataset
        self.worker_config = dataset.worker_config
        #: Ours, or Energon's (``policy.py``): which configuration changes a restore accepts.
        self.policy = policy
        num_workers = self.worker_config.num_workers
        extra: dict[str, Any] = {}
        if num_workers > 0:
            # Workers write their messages themselves (see handover/queues.py).
            context = DirectForkContext() if direct_queues_from_env() else "fork"
            extra = dict(prefetch_factor=prefetch_factor, persistent_workers=True, multiprocessing_context=context)
        super().__init__(
            WorkerStreams(dataset),
            batch_size=None,
            shuffle=False,
            num_workers=num_workers,
            collate_fn=convert_item,
            pin_memory=torch.cuda.is_available(),
            **extra,
        )
        self._stuck_reports = StuckReports() if num_workers > 0 else None
        self.dataset.stuck_reports = self._stuck_reports
        start_seconds = worker_start_seconds_from_env() if num_workers > 0 else 0
        self._start_watch = StartWatch(num_workers, start_seconds) if start_seconds > 0 else None
        self.dataset.start_watch = self._start_watch
        # Made before the workers are forked, so that they share it (see handover/slabs.py).
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
        self._worker_states: list[dict | PackedState | None] = [None] * self.worker_config.workers_per_rank
        self._next_worker = 0
        #: The logical worker (0 .. workers_per_rank - 1) that produced the last item yielded.
        self.last_worker_id: int | None = None
        #: The restore key of the last item yielded, for :meth:`restore_sample`.  Also for a plain
        #: dict, which is handed out as the hook made it, without a ``__restore_key__``.
        self.last_restore_key: tuple | None = None
        self._first_worker = 0  # the logical worker served by physical worker 0
        self._started = False
        #: The loop over the loader ended (StopIteration) after the last item it yielded.
        self._pass_ended = False
        #: Samples the default error handler skipped (logged here with key and reason, also when
        #: a worker process skipped them).
        self._skips = SkipLedger(num_workers)

        self.id = self.next_id()
        #: Batches delivered on this rank, restored progress included: the manifest's step.
        self.step = 0
        #: The per-step manifest (``manifest.py``), None unless asked for.
        self._manifest = _manifest_writer(manifest, dataset)
        #: The samples this loader skips (a replay's, ``sample_skips.py``): named by the
        #: environment, restored from a state, or given to the restore.
        self._sample_skips = SkipList()
        from_env = skips_from_env()
        if from_env is not None:
            pipeline = _pipeline_dataset(dataset)
            if pipeline is not None and pipeline.spec.training:  # validation loaders read other data
                self._use_skips(self._resolve_skips(from_env[0], from_env[1], f"{SKIPS_ENV}={os.environ[SKIPS_ENV]}"))
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
            except (ConnectionError, EOFError) as exc:
                # A worker killed while the main process fetched a batch too large for a slab
                # (its tensors come over the worker's socket): name the dead worker, as torch does
                # when it sees the death first.
                dead = self._dead_workers()
                if not dead:
                    raise
                error = RuntimeError(f"DataLoader worker (pid(s) {', '.join(dead)}) exited unexpectedly while its batch was being received")
                self._raise_if_stuck(error)
                raise error from exc
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
                self._skips.add(logical, *skips, step=self.step)
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
            self.last_restore_key = get_restore_key(item)
            if self._manifest is not None:
                self._manifest.add(self.step, self.last_restore_key)
            self.step += 1
            yield unkeyed(item)

    def _unrotate_workers(self) -> None:
        """After the first pass of a restored loader, whose workers were rotated so that the one
        whose turn it was went first: the next passes start with worker 0, as they do in the
        uninterrupted run, so the workers start again unrotated, each from its last state."""
        self.dataset.restore(RankState(worker_states=self._current_worker_states(), next_worker=0, pass_ended=True, config=self.savable_dataset.config()))
        self._next_worker = self._first_worker = 0
        if self._iterator is not None:  # persistent workers hold the rotated pipelines
            self._iterator._shutdown_workers()
            self._iterator = None

    def _dead_workers(self, grace_s: float = 5.0) -> list[str]:
        """``"PID (exit code or signal)"`` of this loader's workers that have exited, waiting up to
        ``grace_s`` for a death the kernel has not reported yet (a broken connection to a worker
        comes before its exit status)."""
        workers = list(getattr(self._iterator, "_workers", None) or ())
        deadline = time.monotonic() + grace_s
        while True:
            dead = [w for w in workers if w.exitcode is not None]
            if dead or not workers or time.monotonic() >= deadline:
                return [f"{w.pid} ({f'killed by signal {-w.exitcode}' if w.exitcode < 0 else f'exit code {w.exitcode}'})" for w in dead]
            time.sleep(0.05)

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

    @property
    def replay_skipped_samples(self) -> int:
        """Samples dropped so far because the loader's skip list names them (each logged at INFO)."""
        return self._skips.replayed

    @property
    def sample_skips(self) -> SkipList:
        """The samples this loader skips (a replay's skip list; empty: none)."""
        return self._sample_skips

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
        if self._manifest is not None:  # a checkpoint's steps are on disk when it is
            self._manifest.flush()
        return RankState(
            worker_states=self._current_worker_states(),
            next_worker=self._next_worker,
            pass_ended=self._pass_ended,
            config=self.savable_dataset.config(),
            data=self.savable_dataset.data_record(),
            manifest_step=self.step if self._manifest is not None else None,
            sample_skips=self._sample_skips or None,
        ).to_json()

    def _current_worker_states(self) -> tuple[dict | None, ...]:
        return tuple(state_value(state) for state in self._worker_states)

    def restore_state_rank(
        self,
        state: dict | None,
        *,
        allow_weight_edit: bool | None = None,
        join_new_shards: bool | None = None,
        allow_data_change: bool | None = None,
        skip_samples: Any = None,
        ignore_unknown_skips: bool = False,
    ) -> None:
        """Continue from ``state`` (from :meth:`save_state_rank`); only before iterating.

        ``allow_weight_edit``: a state saved over a blend whose weights, weight schedules or
        datasets have changed since continues with the new mix (``reweight.py``; None: as
        ``ENERGON_LITE_ALLOW_WEIGHT_EDIT`` says); otherwise it is refused, naming the change.

        Data that changed since the save (``changed_data.py``): shards appended join from the
        next epoch, or with ``join_new_shards`` (None: ``ENERGON_LITE_JOIN_NEW_SHARDS``) the
        running one; shards changed, removed or moved are refused, naming each, unless
        ``allow_data_change`` (None: ``ENERGON_LITE_ALLOW_DATA_CHANGE``): then the running
        epoch's undelivered samples of the shards still there (same name and sample count) are
        delivered and the rest is counted in a log line.

        ``skip_samples``: samples to leave out from here on (a replay; ``sample_skips.py``: by
        ``__key__``, manifest entry or step, or position), dropped where they would enter
        batching or packing; added to the state's own list, and saved with the next states.
        Names that match no sample are refused unless ``ignore_unknown_skips``."""
        named = self._named_skips(skip_samples, ignore_unknown_skips)
        if state is None:
            self._use_skips(self._sample_skips.merged(named))
            return
        if self._started:
            raise StateError(format_message("restore_state_rank must be called before iterating the loader", fix="create a fresh loader, restore, then iterate"))
        check_nesting(state, "the loader state passed to restore_state_rank", StateError)
        (state,) = apply_weight_edit([state], self.savable_dataset.config(), self.savable_dataset.data_record(), allow=allow_weight_edit)
        found = self._check_saved_data([state], allow_data_change, every_rank=False)
        if self._continue_changed([state], found, join_new_shards, skip_samples, ignore_unknown_skips):
            return
        (state,) = grown_states([state], self.savable_dataset, found.grown)
        if isinstance(state, dict) and REDISTRIBUTED_FROM in state:  # energon-lite checkpoint redist
            restored = redistributed_rank_state(state, self.savable_dataset, self.worker_config, self.policy)
            self._restore(dataclasses.replace(restored, manifest_step=saved_manifest_step(state), sample_skips=saved_sample_skips(state)), named)
            return
        self._restore(RankState.from_json(state, config=self.savable_dataset.config(), worker_config=self.worker_config, policy=self.policy), named)

    def _check_saved_data(self, states: list[Any], allow_data_change: bool | None, *, every_rank: bool) -> DataCheck:
        """How the data of ``states`` (one rank's, or ``every_rank``'s) differs from this loader's."""
        allow = opt_in(allow_data_change, "allow_data_change", DATA_CHANGE_ENV)
        dataset = self.savable_dataset
        current, config, prefix_record = dataset.data_record(), dataset.config(), prefix_records(dataset)
        found = DataCheck()
        for rank, state in enumerate(states):
            where = f"rank {rank}'s state" if every_rank else "the state"
            found = found.merged(check_saved_data(state, current, config, where=where, prefix_record=prefix_record, allow_change=allow))
        return found

    def _continue_changed(self, states: list[Any], found: DataCheck, join_new_shards: bool | None, skip_samples: Any, ignore_unknown_skips: bool) -> bool:
        """Restores ``states`` over changed data (``changed_data.py``) when the data changed
        (``allow_data_change`` given) or grew and the new shards join the running epoch; False
        (nothing done) otherwise."""
        join = opt_in(join_new_shards, "join_new_shards", JOIN_NEW_SHARDS_ENV)
        if not (found.changed or (found.grown and join)):
            return False
        restored = continued_rank_state(states, self.savable_dataset, self.worker_config, self.policy, join=join)
        saved = states[0]
        self._restore(
            dataclasses.replace(restored, manifest_step=saved_manifest_step(saved), sample_skips=saved_sample_skips(states if len(states) > 1 else saved)),
            self._named_skips(skip_samples, ignore_unknown_skips),
        )
        return True

    def _named_skips(self, skip_samples: Any, ignore_unknown: bool) -> SkipList:
        if skip_samples is None:
            return SkipList()
        if self._started:
            raise StateError(format_message("samples to skip must be given before iterating the loader", fix="create a fresh loader, restore with skip_samples=..., then iterate"))
        return self._resolve_skips(skip_samples, ignore_unknown, "skip_samples")

    def _resolve_skips(self, entries: Any, ignore_unknown: bool, what: str) -> SkipList:
        pipeline = _pipeline_dataset(self.savable_dataset)
        if pipeline is None:
            raise ConfigError(format_message(f"{what}: this loader's dataset is not one of get_train_dataset / get_val_dataset", fix="skip lists name samples of the loader's datasets"))
        if not isinstance(ignore_unknown, bool):
            raise ConfigError(format_message("ignore_unknown_skips must be True or False", found=repr(ignore_unknown)[:80]))
        return resolve_skips(entries, pipeline.spec, manifest=None if self._manifest is None else self._manifest.folder, ignore_unknown=ignore_unknown)

    def _use_skips(self, skips: SkipList) -> None:
        """Skips ``skips`` from the next batch on (the workers start after this)."""
        if skips and len(skips) != len(self._sample_skips):
            listed = "; ".join(s.describe() for s in skips.samples[:10])
            logger.info("the loader skips %d sample(s) named in its skip list: %s%s", len(skips), listed, " ..." if len(skips) > 10 else "")
        self._sample_skips = skips
        self.dataset.sample_skips = skips.identities() or None

    def _restore(self, restored: RankState, named: SkipList) -> None:
        if self._started:
            raise StateError(format_message("a loader state must be restored before iterating the loader", fix="create a fresh loader, restore, then iterate"))
        self._use_skips((restored.sample_skips or SkipList()).merged(self._sample_skips).merged(named))
        self.dataset.restore(restored)
        self._worker_states = list(restored.worker_states)
        self._next_worker = self._first_worker = restored.next_worker
        self._pass_ended = restored.pass_ended
        if restored.manifest_step is not None:
            self.step = restored.manifest_step
        elif self._manifest is not None:
            logger.warning("the restored state records no manifest step (saved by a loader without manifest=): this run's manifest counts steps from 0")

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

    def restore_state_global(
        self,
        states: list[dict] | None,
        *,
        src_rank: int | None = None,
        allow_weight_edit: bool | None = None,
        join_new_shards: bool | None = None,
        allow_data_change: bool | None = None,
        skip_samples: Any = None,
        ignore_unknown_skips: bool = False,
    ) -> None:
        """Restores from every rank's state (``save_state_global``; sent from ``src_rank`` when
        given).  Saved on the same topology, this rank takes its own entry; saved on another
        number of ranks or workers, the rest of the running epoch is divided over this topology
        (``elastic.py``: every sample not yet delivered comes once).  ``allow_weight_edit``,
        ``join_new_shards``, ``allow_data_change``, ``skip_samples`` and
        ``ignore_unknown_skips``: as in :meth:`restore_state_rank` (over changed data the rest
        of the running epoch is divided over every rank, as on another topology)."""
        import torch.distributed as dist

        if src_rank is not None and dist.is_available() and dist.is_initialized():
            box: list[Any] = [states if dist.get_rank() == src_rank else None]
            dist.broadcast_object_list(box, src=src_rank, group=self.worker_config.data_parallel_group)
            states = box[0]
        if states is None:
            self.restore_state_rank(None, skip_samples=skip_samples, ignore_unknown_skips=ignore_unknown_skips)
            return
        check_nesting(states, "the loader states passed to restore_state_global", StateError)
        if isinstance(states, (list, tuple)):
            states = apply_weight_edit(states, self.savable_dataset.config(), self.savable_dataset.data_record(), allow=allow_weight_edit)
            found = self._check_saved_data(list(states), allow_data_change, every_rank=True)
            if self._continue_changed(list(states), found, join_new_shards, skip_samples, ignore_unknown_skips):
                return
        wc = self.worker_config
        saved = [s.get("config") if isinstance(s, dict) and isinstance(s.get("config"), dict) else {} for s in states] if isinstance(states, (list, tuple)) else []
        same_topology = len(states) == wc.world_size and all(
            c.get("worker_config.world_size") == wc.world_size and c.get("worker_config.num_workers") == wc.num_workers for c in saved
        )
        if same_topology:
            self.restore_state_rank(states[wc.rank], join_new_shards=join_new_shards, allow_data_change=allow_data_change, skip_samples=skip_samples, ignore_unknown_skips=ignore_unknown_skips)
            return

        if isinstance(states, (list, tuple)):
            states = grown_states(states, self.savable_dataset, found.grown)
        step = saved_manifest_step(states[0]) if isinstance(states, (list, tuple)) and states else None
        restored = elastic_rank_state(states, self.savable_dataset, wc, self.policy)
        self._restore(dataclasses.replace(restored, manifest_step=step, sample_skips=saved_sample_skips(list(states))), self._named_skips(skip_samples, ignore_unknown_skips))

    def restore_sample(self, restore_key: tuple) -> Any:
        """Rebuilds a sample or batch from its ``__restore_key__`` (for a plain dict, which has none:
        :attr:`last_restore_key` after it was yielded) by random access."""
        key = as_key(restore_key)
        if len(key) < 2 or key[0] != WORKER_TAG or not isinstance(key[1], int):
            raise StateError(format_message("not a restore key of this loader", expected=f"({WORKER_TAG!r}, worker id, ...)", found=repr(restore_key)[:200]))
        pipeline = self.savable_dataset.build_worker(key[1], Runtime(cache_pool=self.cache_pool))
        return unkeyed(set_restore_key(pipeline.restore(key[2:]), key))

    def blend_report(self) -> list[dict[str, Any]]:
        """This rank's realized blend so far: see :func:`blend_report`."""
        return blend_report(self.save_state_rank())

    def can_restore_sample(self) -> bool:
        return True

    def config(self) -> dict[str, Any]:
        return self.savable_dataset.config()
