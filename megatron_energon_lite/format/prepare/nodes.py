"""``prepare`` across ranks (nodes): each rank indexes a share of the shards, rank 0 merges.

1. Every rank lists the shards and the splits as a single-process prepare does (the same checks
   and errors, before any work), and finds the shards changed since the previous run
   (``.lite-prepare.json``: an incremental run shares out only those).
2. The changed shards are shared out by byte size (:func:`shares_by_size`), a pure function of
   the shard list and sizes: every rank computes the same shares without talking to the others.
3. Each rank scans its share in its own process pool.  Each shard's scan goes to a part file,
   ``.nv-meta/.lite-prepare-parts/<digest>.json``, written atomically and named by the shard,
   its stamp (size and mtime, or ETag) and the media filter: a part exists only for a finished
   scan of the tar as it is now.  A re-run (a rank killed or failed) skips the shards whose part
   exists and scans a changed tar again.
4. Rank 0 waits for every part (under torchrun: a gloo all-gather of each rank's outcome; with
   explicit ``--rank``/``--world-size``: by watching the parts folder, with a timeout), then
   runs the single-process prepare with the parts as its scans: the same index build, the same
   metadata writers, so the same result.  A part missing or unreadable at that point is scanned
   by rank 0 itself.  The parts folder is removed once the merge has succeeded.

A rank that fails (a corrupt shard) reports it: nothing is merged, and the error names the rank
and the shard.  The dataset must be on storage every rank sees (a shared filesystem or an
object store).
"""

from __future__ import annotations

import hashlib
import heapq
import json
import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Iterator, Mapping, Protocol, Sequence

import numpy as np

from ...errors import DatasetError, format_message
from ...storage import AnyPath, RemotePath, as_path, atomic_write_text
from ..media_metadata import MediaFilter, MediaRow, MediaScan
from ..metadata import META_DIR, meta_dir
from ..process_pool import scan_in_order
from ..safe_parse import parse_json
from ..tar_index import INDEX_DTYPE
from .incremental import _kept_media_filter, _load_prepare_state, _stamps, _unchanged_shards
from .run import PrepareResult, _shards_and_splits, prepare_dataset
from .scan import _scan, _scan_task, _Scanned, _scanned, _ShardColumns
from .write import ShardScans, _sync_files

__all__ = ["FileRanks", "PARTS_DIR", "Ranks", "TorchRanks", "prepare_across_ranks", "shares_by_size"]

logger = logging.getLogger(__package__)

PARTS_DIR = ".lite-prepare-parts"
PART_VERSION = 1
#: How often rank 0 looks for the other ranks' parts (explicit ``--rank`` mode): soon at first
#: (the others may be about done), then less often, at most every few seconds (a listing each).
_FIRST_POLL_SECONDS = 0.05
_MAX_POLL_SECONDS = 3.0


def shares_by_size(names: Sequence[str], sizes: Mapping[str, int], world_size: int) -> list[list[str]]:
    """The shards of each rank: the biggest shard first to the rank with the fewest bytes so far
    (ties: the lower rank), each share then in the order of ``names``.  No rank gets more than
    the fair share plus one shard's bytes."""
    loads = [(0, rank) for rank in range(world_size)]
    shares: list[list[int]] = [[] for _ in range(world_size)]
    for position in sorted(range(len(names)), key=lambda i: (-sizes[names[i]], i)):
        load, rank = heapq.heappop(loads)
        shares[rank].append(position)
        heapq.heappush(loads, (load + sizes[names[position]], rank))
    return [[names[i] for i in sorted(share)] for share in shares]


@dataclass
class _Plan:
    """What every rank works out alike before it scans."""

    shares: list[list[str]]  # the changed shards of each rank
    parts: dict[str, str]  # changed shard -> the name of its part file
    stamps: dict[str, list]  # changed shard -> [size, version] as listed
    media_filter: MediaFilter | None


def _part_name(name: str, stamp: list | None, media_filter: MediaFilter | None) -> str:
    key = json.dumps([name, stamp, media_filter.to_json() if media_filter is not None else None])
    return hashlib.sha256(key.encode()).hexdigest()[:40] + ".json"


def _parts_folder(root: AnyPath) -> AnyPath:
    return meta_dir(root) / PARTS_DIR


def _make_plan(root: AnyPath, names: list[str], media_filter: MediaFilter | None, world_size: int) -> _Plan:
    if media_filter is None:
        media_filter = _kept_media_filter(meta_dir(root))
    unchanged = _unchanged_shards(root, names, media_filter, _load_prepare_state(root))
    changed = [name for name in names if name not in unchanged]
    stamps = _stamps(root, changed)  # a vanished tar gets no stamp: its scan reports it
    shares = shares_by_size(changed, {name: stamps[name][0] if name in stamps else 0 for name in changed}, world_size)
    parts = {name: _part_name(name, stamps.get(name), media_filter) for name in changed}
    return _Plan(shares, parts, stamps, media_filter)


def _existing_parts(root: AnyPath, plan: _Plan, names: Sequence[str]) -> set[str]:
    """The ``names`` whose part file exists (one listing remotely, one ``stat`` each locally)."""
    paths = {name: f"{META_DIR}/{PARTS_DIR}/{plan.parts[name]}" for name in names}
    found = _stamps(root, paths.values())
    return {name for name, path in paths.items() if path in found}


# -- one shard's part file --------------------------------------------------------------------


def _part_task(args: tuple[AnyPath, str, MediaFilter | None, list | None, str]) -> None:
    """Scans one shard (in a pool worker) and writes its part file."""
    root, name, media_filter, stamp, part = args
    samples, offsets, media, tar_stat = _scan(root, name, media_filter)
    if not isinstance(root, RemotePath) and stamp != [tar_stat.st_size, str(tar_stat.st_mtime_ns)]:
        raise DatasetError(
            format_message(
                "the shard changed while it was being indexed",
                where=str(root / name),
                fix="run prepare again once nothing writes to the shards",
            )
        )
    columns = _ShardColumns.of(samples, offsets)
    record = {
        "version": PART_VERSION,
        "shard": name,
        "stamp": stamp,
        **{field: getattr(columns, field) for field in _COLUMN_TYPES},
        "offsets": offsets.tolist(),
        "media": None if media is None else {
            "rows": [list(column) for column in zip(*((r.entry_key, r.metadata_type, r.metadata_json) for r in media.rows))] or [[], [], []],
            "failures": media.failures,
        },
    }
    # Not flushed one by one: the rank syncs its parts at once when its share is done.
    atomic_write_text(_parts_folder(root) / part, json.dumps(record, separators=(",", ":")), durable=False)


#: The columns of :class:`~.scan._ShardColumns` a part file holds as they are (offsets aside),
#: in the class's order, with the type of their values.
_COLUMN_TYPES = {"keys": str, "part_samples": int, "part_names": str, "part_offsets": int, "part_sizes": int}


class _BadPart(ValueError):
    pass


def _column(values: object, field: str, wanted: type, length: int | None = None) -> list:
    """One column of a part file, checked: a list (of ``length``) of strings, or of integers
    from 0 up."""
    if not isinstance(values, list) or (length is not None and len(values) != length):
        raise _BadPart(f"{field}: not a list{'' if length is None else f' of {length}'}")
    if not all(type(value) is wanted for value in values) or (wanted is int and values and min(values) < 0):
        raise _BadPart(f"{field}: not all {'strings' if wanted is str else 'integers from 0 up'}")
    return values


def _read_part(path: AnyPath, name: str, stamp: list | None) -> tuple[_ShardColumns, MediaScan | None] | None:
    """A part file's scan, or None when it is not the scan of ``name`` at ``stamp``; a missing
    part raises ``FileNotFoundError``."""
    try:
        record = parse_json(path.read_bytes(), str(path))
        if not isinstance(record, dict) or record.get("version") != PART_VERSION:
            raise _BadPart(f"not a part file of version {PART_VERSION}")
        if record.get("shard") != name or record.get("stamp") != stamp:
            raise _BadPart(f"it holds {record.get('shard')!r} at {record.get('stamp')}, not {name!r} at {stamp}")
        keys = _column(record["keys"], "keys", str)
        offsets = np.asarray(_column(record["offsets"], "offsets", int, len(keys) + 1), dtype=INDEX_DTYPE)
        if not keys or np.any(offsets[1:] <= offsets[:-1]):
            raise _BadPart("its sample offsets do not increase")
        count = len(record["part_samples"])
        parts = [_column(record[field], field, wanted, count) for field, wanted in list(_COLUMN_TYPES.items())[1:]]
        columns = _ShardColumns(keys, offsets, *parts)
        if count and max(columns.part_samples) >= len(keys):
            raise _BadPart("a part names a sample the shard does not have")
        media = record["media"]
        if media is not None:
            rows = media["rows"]
            if not isinstance(rows, list) or len(rows) != 3:
                raise _BadPart("media: not three columns")
            entry_keys, types, texts = (_column(column, "media", str, len(rows[0])) for column in rows)
            media = MediaScan([MediaRow(*row) for row in zip(entry_keys, types, texts)], _column(media["failures"], "media", str))
    except FileNotFoundError:
        raise  # not written (yet): the caller decides
    except (OSError, ValueError, KeyError, TypeError) as exc:  # ValueError: also bad JSON, _BadPart
        logger.warning("%s: ignoring this part file of %s (the shard is scanned again): %s", path, name, exc)
        return None
    return columns, media


def _part_scans(root: AnyPath, media_filter: MediaFilter | None, share: _ShareInBackground) -> ShardScans:
    """The merge's scans: each changed shard's part file as :func:`~.scan._scan_task` would
    have scanned it, waited for while ``share`` (rank 0's share and the ranks' report) is under
    way; a shard without a valid part once it is over is scanned here. The scans end only
    after ``share`` has, raising its error if it failed: the merge installs nothing then."""

    def scans(jobs: list[tuple]) -> Iterator[_Scanned]:
        stamps = _stamps(root, [job[1] for job in jobs])
        local = not isinstance(root, RemotePath)
        for job in jobs:
            _root, name, shard_id, _filter, owner = job
            stamp = stamps.get(name)
            found = _awaited_part(_parts_folder(root) / _part_name(name, stamp, media_filter), name, stamp, share)
            if found is None:
                logger.warning("%s: no part file from its rank; scanning it on rank 0", root / name)
                yield _scan_task(job)
                continue
            columns, media = found
            yield _scanned(root, name, shard_id, owner, columns, media, stamp if local else None)
        while not share.finished(timeout=_MAX_POLL_SECONDS):
            pass

    return scans


def _awaited_part(path: AnyPath, name: str, stamp: list | None, share: _ShareInBackground) -> tuple[_ShardColumns, MediaScan | None] | None:
    """:func:`_read_part` of a part that may not be written yet: looked for again (soon, then
    less often) until it is there or ``share`` is over; None when it is unusable or still missing."""
    pause = _FIRST_POLL_SECONDS
    while True:
        over = share.finished(timeout=0)
        try:
            return _read_part(path, name, stamp)
        except FileNotFoundError:
            if over:
                return None
        share.finished(timeout=pause)
        pause = min(pause * 2, _MAX_POLL_SECONDS)


def _remove_parts(root: AnyPath) -> None:
    folder = _parts_folder(root)
    if isinstance(folder, RemotePath):
        folder.fs.invalidate_cache(folder.url)  # other ranks wrote there: not from an old listing
        for part in list(folder.iterdir()):
            part.unlink(missing_ok=True)
    else:
        shutil.rmtree(folder, ignore_errors=True)


# -- how the ranks learn of each other ----------------------------------------------------


class Ranks(Protocol):
    """The ranks of one distributed prepare, as one of them sees them."""

    rank: int
    world_size: int

    def begin(self, root: AnyPath) -> None:
        """Called before this rank scans its share."""

    def end_share(self, root: AnyPath, plan: _Plan, error: str | None) -> None:
        """Called when this rank's share is done (``error``: why it failed).  Raises when any
        rank failed; on rank 0, returns once every part is there."""

    def close(self) -> None:
        """Called when the prepare is over (leaves a process group joined for it)."""


def _failed_error(failures: Mapping[int, str]) -> DatasetError:
    ranks = ", ".join(str(rank) for rank in sorted(failures))
    return DatasetError(
        format_message(
            f"prepare failed on rank(s) {ranks}; nothing was merged",
            found="; ".join(f"rank {rank}: {' '.join(error.split())}" for rank, error in sorted(failures.items())),
            fix="fix or --exclude the shard(s) named, then run the same command again: "
            "the shards the ranks indexed already are not scanned again",
        )
    )


class TorchRanks:
    """The ranks of a ``torch.distributed`` group (under ``torchrun``): each rank's outcome
    goes to every rank with one all-gather.  Joins (and later leaves) a gloo group from the
    ``RANK``/``WORLD_SIZE``/``MASTER_ADDR`` environment when none is initialised; ``timeout``
    bounds the wait for the slowest rank."""

    def __init__(self, timeout: float) -> None:
        import torch.distributed as dist

        self._dist = dist
        self._own_group = not dist.is_initialized()
        if self._own_group:
            dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()

    def begin(self, root: AnyPath) -> None:
        pass

    def end_share(self, root: AnyPath, plan: _Plan, error: str | None) -> None:
        outcomes: list[str | None] = [None] * self.world_size
        self._dist.all_gather_object(outcomes, error)
        failures = {rank: outcome for rank, outcome in enumerate(outcomes) if outcome is not None}
        if failures:
            raise _failed_error(failures)
        if self.rank == 0:
            unseen = _missing_by_rank(root, plan)
            if unseen:
                raise DatasetError(
                    format_message(
                        "rank 0 does not see the part files that other ranks wrote",
                        where=str(_parts_folder(root)),
                        found=", ".join(f"rank {rank}: {count} missing" for rank, count in sorted(unseen.items())),
                        expected="the dataset on storage every rank sees (a shared filesystem or an object store)",
                        fix="prepare a dataset on node-local disks on one node, or move it to shared storage",
                    )
                )

    def close(self) -> None:
        if self._own_group:
            self._dist.destroy_process_group()


def _missing_by_rank(root: AnyPath, plan: _Plan) -> dict[int, int]:
    """How many shards of each rank's share have no part file yet (ranks with none missing
    are left out)."""
    changed = [name for share in plan.shares for name in share]
    existing = _existing_parts(root, plan, changed)
    missing = {rank: sum(name not in existing for name in share) for rank, share in enumerate(plan.shares)}
    return {rank: count for rank, count in missing.items() if count}


class FileRanks:
    """Ranks started on their own (``--rank R --world-size N``) that meet through the dataset's
    storage: every rank writes its parts; rank 0 waits for all of them (up to ``timeout``
    seconds), looking every few seconds.  A failed rank leaves a note,
    ``.lite-prepare-parts/failed-rank-R.json``, that rank 0 reports at once; the rank removes
    it when it starts again."""

    def __init__(self, rank: int, world_size: int, timeout: float) -> None:
        self.rank = rank
        self.world_size = world_size
        self.timeout = timeout

    def _note(self, root: AnyPath, rank: int) -> AnyPath:
        return _parts_folder(root) / f"failed-rank-{rank}.json"

    def begin(self, root: AnyPath) -> None:
        self._note(root, self.rank).unlink(missing_ok=True)

    def end_share(self, root: AnyPath, plan: _Plan, error: str | None) -> None:
        if error is not None:
            outstanding = sorted(set(plan.shares[self.rank]) - _existing_parts(root, plan, plan.shares[self.rank]))
            note = {"world_size": self.world_size, "error": error, "parts": [plan.parts[name] for name in outstanding]}
            atomic_write_text(self._note(root, self.rank), json.dumps(note))
            raise _failed_error({self.rank: error})
        if self.rank != 0:
            return
        deadline = time.monotonic() + self.timeout
        pause = _FIRST_POLL_SECONDS
        while missing := _missing_by_rank(root, plan):
            failures = {rank: text for rank in missing if (text := self._failure(root, plan, rank)) is not None}
            if failures:
                raise _failed_error(failures)
            if time.monotonic() >= deadline:
                raise DatasetError(
                    format_message(
                        f"rank 0 waited {self.timeout:g} s for the other ranks' part files; nothing was merged",
                        where=str(_parts_folder(root)),
                        found=", ".join(f"rank {rank}: {count} shard(s) not indexed" for rank, count in sorted(missing.items())),
                        fix="start (or restart) those ranks with the same command and their --rank, then run rank 0 "
                        "again: the shards indexed already are not scanned again; or raise --wait-timeout",
                    )
                )
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 2, _MAX_POLL_SECONDS)

    def _failure(self, root: AnyPath, plan: _Plan, rank: int) -> str | None:
        """The error of ``rank``'s note, if it failed in this run: its note names a part of this
        plan that is still missing (a note from an earlier run names others, or none missing)."""
        path = self._note(root, rank)
        try:
            note = parse_json(path.read_bytes(), str(path))
        except (OSError, ValueError):  # none (FileNotFoundError), or not one we wrote
            return None
        if not isinstance(note, dict) or note.get("world_size") != self.world_size or not isinstance(note.get("parts"), list):
            return None
        share = plan.shares[rank]
        wanted = {plan.parts[name] for name in share} - {plan.parts[name] for name in _existing_parts(root, plan, share)}
        return str(note.get("error")) if wanted & set(map(str, note["parts"])) else None

    def close(self) -> None:
        pass


# -- the run ------------------------------------------------------------------------------------


def prepare_across_ranks(
    root: str | os.PathLike,
    ranks: Ranks,
    *,
    split_ratio: Sequence[float] | None = None,
    split_parts: Sequence[tuple[str, str]] | None = None,
    exclude: str | None = None,
    num_workers: int | None = None,
    progress: bool = True,
    tar_index_only: bool = False,
    shuffle_tars: bool = False,
    force_overwrite: bool = False,
    dataset_yaml: str | None = None,
    dataset_yaml_name: str = "dataset.yaml",
    media_filter: MediaFilter | None = None,
) -> PrepareResult | None:
    """:func:`~.run.prepare_dataset` with the scanning shared over ``ranks``: this rank scans its
    share (with ``num_workers`` processes); rank 0 then merges and returns the result, the other
    ranks return None.  The arguments are those of ``prepare_dataset`` and must be the same on
    every rank.  Nothing is asked: a dataset already prepared needs ``force_overwrite``."""
    root = as_path(root)
    names, _dotted, _splits = _shards_and_splits(
        root,
        split_ratio=split_ratio,
        split_parts=split_parts,
        exclude=exclude,
        tar_index_only=tar_index_only,
        shuffle_tars=shuffle_tars,
        force_overwrite=force_overwrite,
        confirm_overwrite=None,
        shards=None,
    )
    meta_dir(root).mkdir(exist_ok=True)
    plan = _make_plan(root, names, media_filter, ranks.world_size)
    _parts_folder(root).mkdir(exist_ok=True)
    ranks.begin(root)
    if ranks.rank != 0:
        _index_share(root, ranks, plan, num_workers=num_workers, progress=progress)
        return None
    # Rank 0 merges while it indexes its share: the merge takes the parts in shard order as they
    # appear, and installs nothing until the share is done and every rank reported success.
    share = _ShareInBackground(root, ranks, plan, num_workers=num_workers, progress=progress)
    try:
        result = prepare_dataset(
            root,
            split_ratio=split_ratio,
            split_parts=split_parts,
            exclude=exclude,
            num_workers=num_workers,
            progress=progress,
            tar_index_only=tar_index_only,
            shuffle_tars=shuffle_tars,
            force_overwrite=True,  # checked above, before any rank scanned: the merge itself replaces the metadata
            dataset_yaml=dataset_yaml,
            dataset_yaml_name=dataset_yaml_name,
            media_filter=plan.media_filter,
            shard_scans=_part_scans(root, plan.media_filter, share),
        )
    finally:
        share.join()  # a merge that failed first still lets the share and its report to the others end
    _remove_parts(root)
    return result


def _index_share(root: AnyPath, ranks: Ranks, plan: _Plan, *, num_workers: int | None, progress: bool) -> None:
    """Scans this rank's share into part files, then reports to the others (:meth:`Ranks.end_share`:
    raises when any rank failed; on rank 0 returns once every part is there). Rank 0 scans in
    worker processes even with one worker: its own process merges meanwhile."""
    share = plan.shares[ranks.rank]
    try:
        done = _existing_parts(root, plan, share)
        jobs = [(root, name, plan.media_filter, plan.stamps.get(name), plan.parts[name]) for name in share if name not in done]
        logger.info("rank %d of %d: %d shard(s) to index, %d indexed before", ranks.rank, ranks.world_size, len(jobs), len(done))
        desc = f"Indexing shards (rank {ranks.rank})"
        for _ in scan_in_order(_part_task, jobs, num_workers=num_workers, progress=progress, desc=desc, unit="shard", in_process=ranks.rank != 0):
            pass
        if not isinstance(root, RemotePath):
            _sync_files([os.path.join(os.fspath(_parts_folder(root)), job[-1]) for job in jobs])
    except Exception as exc:
        ranks.end_share(root, plan, f"{type(exc).__name__}: {exc}")
        raise
    ranks.end_share(root, plan, None)


class _ShareInBackground:
    """Rank 0's :func:`_index_share` on a thread of its own, while the merge runs."""

    def __init__(self, root: AnyPath, ranks: Ranks, plan: _Plan, *, num_workers: int | None, progress: bool) -> None:
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(root, ranks, plan, num_workers, progress), name="energon-lite-prepare-share")
        self._thread.start()

    def _run(self, root: AnyPath, ranks: Ranks, plan: _Plan, num_workers: int | None, progress: bool) -> None:
        try:
            _index_share(root, ranks, plan, num_workers=num_workers, progress=progress)
        except BaseException as exc:  # handed to the merge, which raises it
            self._error = exc

    def finished(self, timeout: float | None = None) -> bool:
        """Whether the share and the ranks' report are over (waiting up to ``timeout``); raises
        the error that ended them (a failed rank: nothing may be merged)."""
        self._thread.join(timeout)
        if self._error is not None:
            raise self._error
        return not self._thread.is_alive()

    def join(self) -> None:
        self._thread.join()
