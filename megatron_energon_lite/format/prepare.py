"""``prepare``: index tar shards and write ``.nv-meta/`` the way Energon 7.4 does.

Differences from Energon, on purpose:

* Shards are scanned in parallel processes with a progress bar, and a re-run only re-scans shards
  whose size or modification time changed (rows of unchanged shards are copied from the previous
  ``index.sqlite``).  What was scanned is remembered in ``.nv-meta/.lite-prepare.json``, a file
  Energon ignores.
* Split ratios use Energon's cut points, except that the last split always ends at the last
  shard: Energon's float rounding can leave a shard in no split (7,2,1 over 10 shards gives
  7/2/0; we give 7/2/1, and the same splits as Energon wherever it loses nothing).
* Nothing is written when a duplicate key, an empty shard or a corrupt tar is found: every
  metadata file is written through a temporary file and a rename, ``.info.json`` last.  A
  previous ``index.sqlite`` that cannot be read is not an error: every shard is scanned again.
* Memory does not grow with the dataset: each shard's rows go to SQLite as soon as its scan
  arrives, and the mapped pages of a tar are released behind the parser.
* Media metadata (``media_filter``) is extracted in the same pass over each tar.  A re-prepare
  without a filter keeps the one the index was built with (Energon keeps the old tables, stale
  or not); a different filter re-scans every shard.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import random
import re
import sqlite3
import uuid
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
from braceexpand import braceexpand

from ..errors import ConfigError, DatasetError, EmptyDatasetError, format_message
from ..storage import (
    AnyPath,
    RemotePath,
    as_path,
    atomic_write_text,
    is_no_room,
    list_files,
    local_file,
    local_scratch,
    local_view,
    no_room_error,
    remove_scratch,
    remove_stale_temporaries,
    replace_with,
    temporary_name,
)
from .media_metadata import (
    MediaFilter,
    MediaIndexWriter,
    MediaScan,
    read_media_filter,
    scan_media,
)
from .metadata import (
    INDEX_SQLITE,
    INDEX_UUID,
    META_DIR,
    DatasetInfo,
    SplitConfig,
    is_prepared,
    meta_dir,
    read_info,
    read_split_config,
    write_info,
    write_split_config,
)
from .process_pool import scan_in_order
from .sqlite_index import (
    DuplicateKey,
    DuplicateSampleKeyError,
    IndexMismatchError,
    SqliteIndexWriter,
)
from .tar_index import INDEX_DTYPE, index_name, write_tar_index
from .tar_reader import SampleEntry, TarMember, group_samples, iter_members

logger = logging.getLogger(__name__)

PREPARE_STATE = ".lite-prepare.json"
PREPARE_STATE_VERSION = 2  # 2: stamps are [size, version string] (mtime or ETag)
DEFAULT_SPLIT_NAMES = ("train", "val", "test")


@dataclass
class ShardScan:
    """What scanning one tar found."""

    name: str
    offsets: np.ndarray  # N+1 uint64 entries, Energon's .tar.idx content
    samples: list[SampleEntry]
    media: MediaScan | None = None


@dataclass
class PrepareResult:
    """Summary of a prepare run, for the CLI and tests."""

    root: AnyPath
    shard_counts: dict[str, int]
    scanned: list[str]  # shards that were (re-)indexed in this run
    reused: list[str]  # shards whose previous index was kept
    splits: dict[str, list[str]] = field(default_factory=dict)
    media_filter: MediaFilter | None = None
    media_entries: int = 0  # rows in media_metadata
    media_skipped: int = 0  # media parts of scanned shards that could not be parsed

    @property
    def total_samples(self) -> int:
        return sum(self.shard_counts.values())


def discover_shards(root: AnyPath, exclude: str | None = None) -> list[str]:
    """Tar paths under ``root``, relative and posix, in Energon's order."""
    if isinstance(root, RemotePath):  # one recursive listing
        found = [name for name in root.list_files() if name.endswith((".tar", ".tgz"))]
    else:
        found = [p.relative_to(root).as_posix() for pattern in ("**/*.tar", "**/*.tgz") for p in root.glob(pattern) if p.is_file()]
    # Energon sorts Path objects, i.e. component by component: "d/a/b.tar" < "d/a-c.tar".
    names = sorted(found, key=lambda n: PurePosixPath(n).parts)
    names = [n for n in names if not n.startswith(META_DIR + "/")]
    if exclude:
        pattern = _compile(exclude, "--exclude")
        names = [n for n in names if not pattern.search(n)]
    return names


def _compile(regex: str, option: str) -> re.Pattern:
    try:
        return re.compile(regex)
    except re.error as exc:
        raise ConfigError(
            format_message(
                f"invalid regular expression for {option}",
                found=f"{regex!r} ({exc})",
                fix="pass a Python regular expression, e.g. 'shards/train/.*'",
            )
        ) from None


# While scanning, mapped pages behind the parser are handed back to the kernel every few MiB,
# so that a big tar does not count towards the process's resident memory as a whole.
_RELEASE_STEP = 8 << 20


def _release_pages(mapped: mmap.mmap, start: int, upto: int) -> int:
    """Drops the mapping's pages in ``[start, upto)`` (page-aligned) from this process; returns
    the new start.  The data stays in the page cache; a later read maps it again."""
    upto -= upto % mmap.PAGESIZE
    if upto > start and hasattr(mapped, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
        mapped.madvise(mmap.MADV_DONTNEED, start, upto - start)
        return upto
    return start


def _stream_members(mapped: mmap.mmap, where: str, found: dict[str, int]) -> Iterator[TarMember]:
    """``iter_members`` over the whole tar, without keeping the members: ``found`` gets the
    member count and the end-of-archive offset (``"end"``) once the tar is read."""
    members = iter_members(mapped, where=where, verify_checksums=True)
    released = 0
    try:
        while True:
            try:
                member = next(members)
            except StopIteration as stop:
                found["end"] = stop.value
                return
            found["members"] += 1
            if member.header_offset - released >= _RELEASE_STEP:
                released = _release_pages(mapped, released, member.header_offset)
            yield member
    finally:
        members.close()


def scan_shard(root: AnyPath, name: str, media_filter: MediaFilter | None = None) -> ShardScan:
    """Reads every header of one tar once and groups members into samples.

    With a ``media_filter``, the media parts' metadata is extracted from the same mapping.  A
    remote tar is streamed once into a temporary local file and mapped from there.
    """
    path = root / name
    found = {"members": 0, "end": 0}
    with local_file(path) as local, open(local, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            raise EmptyDatasetError(
                format_message(
                    "empty shard", where=str(path), fix="remove the file or re-create it"
                )
            )
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            samples = list(group_samples(_stream_members(mapped, str(path), found)))
            media = None
            if media_filter is not None and samples:
                media = scan_media(media_filter, mapped, samples, where=str(path))
    if not samples:
        raise EmptyDatasetError(
            format_message(
                "shard holds no samples",
                where=str(path),
                expected="members named KEY.PART (e.g. 000001.jpg)",
                found=f"{found['members']} regular files, none named like a sample part",
                fix="remove the shard or exclude it with --exclude",
            )
        )
    offsets = np.fromiter((s.offset for s in samples), dtype=INDEX_DTYPE, count=len(samples))
    offsets = np.append(offsets, np.asarray([found["end"]], dtype=INDEX_DTYPE))
    return ShardScan(name, offsets, samples, media)


def _scan_task(args: tuple[AnyPath, str, MediaFilter | None]) -> ShardScan:
    return scan_shard(*args)


def split_counts_by_ratio(num_shards: int, ratio: Sequence[float]) -> list[int]:
    """Shard counts per split: Energon's cut points, except that the last split ends at the end.

    Energon cuts at ``int(N * running_sum_of_normalised_ratios)``; float rounding can leave the
    running sum just under 1 and drop the last shard from every split (7,2,1 over 10 shards gives
    7/2/0).  We take the same cut points, so splits match Energon's everywhere else, but the last
    split always ends at shard N (7/2/1).
    """
    total = float(sum(ratio))
    if len(ratio) == 0 or any(r < 0 for r in ratio) or total <= 0:
        raise ConfigError(
            format_message(
                "invalid split ratio",
                expected="non-negative numbers with a positive sum, e.g. 8,1,1",
                found=",".join(map(str, ratio)),
            )
        )
    counts, running, previous = [], 0.0, 0
    for i, r in enumerate(ratio):
        running += r / total
        end = num_shards if i == len(ratio) - 1 else min(num_shards, int(num_shards * running))
        counts.append(end - previous)
        previous = end
    return counts


def splits_by_ratio(
    shards: Sequence[str], ratio: Sequence[float] | Sequence[tuple[str, float]], *, shuffle: bool = False
) -> dict[str, list[str]]:
    """Consecutive runs of shards per split: ``ratio`` as ``(8, 1, 1)`` (train, val, test) or as
    Energon's ``[("train", 8), ("val", 1), ...]``."""
    split_names = list(DEFAULT_SPLIT_NAMES)
    if ratio and all(isinstance(r, (tuple, list)) and len(r) == 2 for r in ratio):
        split_names, ratio = [str(name) for name, _ in ratio], [float(r) for _, r in ratio]
    names = list(shards)
    if shuffle:
        random.Random(42).shuffle(names)  # Energon's seed, so the same shards go to each split
    counts = split_counts_by_ratio(len(names), ratio)
    result, start = {}, 0
    for split_name, count in zip(split_names, counts):
        result[split_name] = names[start : start + count]
        start += count
    return result


def splits_by_patterns(
    shards: Sequence[str], patterns: Sequence[tuple[str, str]]
) -> dict[str, list[str]]:
    """``[("train", "shards/train/.*"), ...]``: brace-expanded regexes matched at the start."""
    result: dict[str, list[str]] = {}
    for split_name, pattern in patterns:
        regexes = [_compile(p, f"--split-parts {split_name}") for p in braceexpand(pattern)]
        matched = [s for s in shards if any(r.match(s) for r in regexes)]
        if not matched:
            raise ConfigError(
                format_message(
                    f"split pattern for {split_name!r} matches no shard",
                    found=repr(pattern),
                    expected=f"a regex matching the start of shard paths such as {shards[0]!r}",
                    fix="fix the pattern (it is a regular expression, not a glob)",
                )
            )
        result.setdefault(split_name, []).extend(m for m in matched if m not in result.get(split_name, ()))
    return result


def _load_prepare_state(root: AnyPath) -> dict:
    path = meta_dir(root) / PREPARE_STATE
    try:
        state = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return state if state.get("version") == PREPARE_STATE_VERSION else {}


def _stamps(root: AnyPath, names: Iterable[str]) -> dict[str, list]:
    """``[size, version]`` (mtime locally, ETag remotely) of each existing file, listed at once."""
    return {name: [stat.size, stat.version] for name, stat in list_files(root, list(names)).items()}


def _unchanged_shards(
    root: Path, names: Iterable[str], media_filter: MediaFilter | None
) -> dict[str, tuple[int, int]]:
    """Shards whose tar and index are as the previous run left them -> (old shard id, count).

    The previous run's record is trusted only if ``index.sqlite`` is the very file it wrote, so
    an interrupted run or an index rebuilt by another tool leads to a full re-scan; so does a
    media filter other than the previous run's.
    """
    state = _load_prepare_state(root)
    index_stamp = _stamps(root, [f"{META_DIR}/{INDEX_SQLITE}"]).get(f"{META_DIR}/{INDEX_SQLITE}")
    if not state or index_stamp is None or state.get("index_stamp") != index_stamp:
        return {}
    if media_filter is not None and state.get("media_filter") != media_filter.to_json():
        return {}
    recorded = state.get("shards", {})
    names = [name for name in names if name in recorded]
    stamps = _stamps(root, [n for name in names for n in (name, index_name(name))])
    unchanged = {}
    for name in names:
        entry = recorded[name]
        if name in stamps and index_name(name) in stamps and entry["stamps"] == stamps[name] + stamps[index_name(name)]:
            unchanged[name] = (entry["id"], entry["count"])
    return unchanged



def _duplicate_error(duplicates: list[DuplicateKey], names: list[str]) -> DuplicateSampleKeyError:
    return DuplicateSampleKeyError.from_duplicates(duplicates, names)


def prepare_dataset(
    root: str | os.PathLike,
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
    confirm_overwrite: Callable[[], bool] | None = None,
    media_filter: MediaFilter | None = None,
    shards: Sequence[str] | None = None,
) -> PrepareResult:
    """Indexes the tars under ``root`` and writes Energon-compatible metadata.

    Exactly one of ``split_ratio`` (e.g. ``(8, 1, 1)`` for train/val/test) and ``split_parts``
    (``[(name, regex), ...]``) is needed unless ``tar_index_only`` keeps the existing splits.
    ``dataset_yaml`` is the text of ``.nv-meta/<dataset_yaml_name>`` to write, if any.
    ``shards``: the tar paths (relative to ``root``) to index instead of every tar found there.
    ``media_filter`` stores media metadata (Energon's ``--media-metadata-by-*``); None keeps the
    filter of an existing index, if it has one.
    """
    root = as_path(root)
    if not root.is_dir():
        raise DatasetError(format_message("dataset folder not found", where=str(root)))
    if tar_index_only:
        if not is_prepared(root):
            raise DatasetError(
                format_message(
                    "--tar-index-only needs a prepared dataset",
                    where=str(root),
                    fix="run prepare without --tar-index-only first",
                )
            )
        names = list(read_info(root).shard_counts)
    else:
        if (split_ratio is None) == (split_parts is None):
            raise ConfigError(
                format_message(
                    "give either a split ratio or split patterns",
                    expected="--split-ratio 8,1,1 or --split-parts train:REGEX (repeatable)",
                    found="both" if split_ratio is not None else "neither",
                )
            )
        if is_prepared(root) and not force_overwrite:
            if confirm_overwrite is None or not confirm_overwrite():
                raise ConfigError(
                    format_message(
                        "the dataset is already prepared",
                        where=str(meta_dir(root)),
                        fix="pass --force-overwrite to prepare it again (unchanged shards are "
                        "not re-indexed), or --tar-index-only to keep splits and dataset.yaml",
                    )
                )
        names = [str(name) for name in shards] if shards is not None else discover_shards(root, exclude)
    if not names:
        raise DatasetError(
            format_message(
                "no tar files found",
                where=str(root),
                expected="*.tar files in the folder or its subfolders",
                fix="point prepare at the folder that holds the shards",
            )
        )

    # Splits first: a bad pattern must fail before any work is done.
    splits: dict[str, list[str]] = {}
    if not tar_index_only:
        if split_parts is not None:
            splits = splits_by_patterns(names, split_parts)
        else:
            splits = splits_by_ratio(names, split_ratio, shuffle=shuffle_tars)

    meta = meta_dir(root)
    meta.mkdir(exist_ok=True)
    if not isinstance(root, RemotePath):  # what a killed or out-of-room prepare left behind
        remove_stale_temporaries({meta, *((root / name).parent for name in names)})
    if media_filter is None:
        media_filter = read_media_filter(meta / INDEX_SQLITE)
        if media_filter is not None:
            logger.info("keeping the media metadata of %s (%s)", meta / INDEX_SQLITE, media_filter.to_json())
    unchanged = _unchanged_shards(root, names, media_filter)

    # SQLite needs local files: the new index is built next to the old one locally (so the final
    # rename is atomic), in a temporary folder for a remote dataset (then uploaded).
    scratch, owned = local_scratch(meta)
    try:
        tmp_index = temporary_name(scratch / INDEX_SQLITE)
        previous_index = local_view(meta / INDEX_SQLITE) if unchanged or media_filter is not None else None
        build = dict(num_workers=num_workers, progress=progress, media_filter=media_filter)
        try:
            try:
                built = _build_index(tmp_index, previous_index, root, names, unchanged, **build)
            except _UnusablePreviousIndex as exc:
                logger.warning("%s", exc)
                unchanged = {}
                built = _build_index(tmp_index, previous_index, root, names, unchanged, **build)
        except (OSError, sqlite3.OperationalError) as exc:
            if is_no_room(exc):
                raise no_room_error(tmp_index, exc) from None
            raise
        for name, offsets in built.offsets.items():
            write_tar_index(root / name, offsets)
        replace_with(meta / INDEX_SQLITE, tmp_index)
    finally:
        remove_scratch(scratch, owned)
    counts = built.counts
    to_scan = [n for n in names if n not in unchanged]
    failures = built.media_failures
    atomic_write_text(meta / INDEX_UUID, str(uuid.uuid4()))
    if splits:
        write_split_config(root, SplitConfig(split_parts=splits, exclude=_kept_excludes(root)))
    if dataset_yaml is not None:
        atomic_write_text(meta / dataset_yaml_name, dataset_yaml)
    _write_prepare_state(root, names, counts, media_filter)
    write_info(root, DatasetInfo(shard_counts=counts))
    return PrepareResult(
        root,
        counts,
        scanned=to_scan,
        reused=list(unchanged),
        splits=splits,
        media_filter=media_filter,
        media_entries=built.media_entries,
        media_skipped=len(failures),
    )


class _UnusablePreviousIndex(DatasetError):
    """The previous ``index.sqlite`` cannot be read: its shards are scanned again instead."""


def _previous_index_error(path: Path | None, exc: Exception) -> _UnusablePreviousIndex:
    return _UnusablePreviousIndex(
        format_message(
            "the previous index cannot be read; every shard is scanned again",
            where=str(path),
            expected="a readable SQLite index written by prepare",
            found=f"{type(exc).__name__}: " + " ".join(str(exc).split()),
        )
    )


@dataclass
class _Built:
    """What building the new index produced besides the file itself."""

    counts: dict[str, int]  # samples per shard, in shard order
    offsets: dict[str, np.ndarray]  # .tar.idx content of each scanned shard
    media_entries: int = 0
    media_failures: list[str] = field(default_factory=list)


def _build_index(
    tmp_index: Path,
    previous_index: Path | None,
    root: AnyPath,
    names: list[str],
    unchanged: dict[str, tuple[int, int]],
    *,
    num_workers: int | None,
    progress: bool,
    media_filter: MediaFilter | None,
) -> _Built:
    """Scans the changed shards and writes the new index, one shard at a time.

    Each scan's rows go to SQLite as soon as it arrives and only its offsets (8 bytes per
    sample) and media rows are kept, so memory does not grow with the dataset's sample count.
    """
    to_scan = [n for n in names if n not in unchanged]
    scans = _scan_all(root, to_scan, num_workers=num_workers, progress=progress, media_filter=media_filter)
    try:
        built, media = _write_index(tmp_index, previous_index, names, scans, unchanged)
    finally:
        scans.close()
    built.media_failures = [f for scan in media.values() for f in scan.failures]
    for failure in built.media_failures:
        logger.warning("%s", failure)
    built.media_entries = _write_media(tmp_index, previous_index, media_filter, names, media, unchanged)
    return built


def _write_index(
    tmp_index: Path,
    previous_index: Path | None,
    names: list[str],
    scans: Iterator[ShardScan],
    unchanged: dict[str, tuple[int, int]],
) -> tuple[_Built, dict[str, MediaScan]]:
    """Writes the samples table of the new index from ``scans`` (the changed shards, in order)."""
    writer = SqliteIndexWriter(tmp_index, scratch=True)
    duplicates: list[DuplicateKey] = []
    built = _Built(counts={}, offsets={})
    media: dict[str, MediaScan] = {}
    try:
        if unchanged:
            try:
                writer.attach_previous(previous_index)
            except sqlite3.Error as exc:
                raise _previous_index_error(previous_index, exc) from None
        for shard_id, name in enumerate(names):
            if name in unchanged:
                old_id, built.counts[name] = unchanged[name]
                try:
                    duplicates += writer.copy_shard(old_id, shard_id, expected_rows=built.counts[name])
                except (sqlite3.DatabaseError, IndexMismatchError) as exc:
                    raise _previous_index_error(previous_index, exc) from None
            else:
                scan = next(scans)
                duplicates += writer.add_shard(shard_id, scan.samples, scan.offsets)
                built.counts[name] = len(scan.samples)
                built.offsets[name] = scan.offsets
                if scan.media is not None:
                    media[name] = scan.media
                del scan  # the samples of one shard at a time
        if duplicates:
            raise _duplicate_error(duplicates, names)
        writer.finish()
    except BaseException:
        writer.abort()
        raise
    return built, media


def _write_media(
    index: Path,
    previous: Path | None,
    media_filter: MediaFilter | None,
    names: list[str],
    media: dict[str, MediaScan],
    unchanged: dict[str, tuple[int, int]],
) -> int:
    """Adds the media tables to the new index: fresh rows, and copies for unchanged shards."""
    if media_filter is None:
        return 0
    writer = MediaIndexWriter(index)
    try:
        if previous is not None:
            try:
                writer.copy_shards(previous, [unchanged[n][0] for n in names if n in unchanged])
            except sqlite3.DatabaseError as exc:
                raise _previous_index_error(previous, exc) from None
        for name in names:
            if name in media:
                writer.add(media[name].rows)
    except BaseException:
        writer.abort()
        raise
    return writer.finish(media_filter)


def _kept_excludes(root: AnyPath) -> list[str]:
    """A re-prepare keeps the excludes a user wrote into the old split config."""
    try:
        return read_split_config(root).exclude
    except ConfigError:
        return []


def _scan_all(
    root: AnyPath,
    names: list[str],
    *,
    num_workers: int | None,
    progress: bool,
    media_filter: MediaFilter | None = None,
) -> Iterator[ShardScan]:
    """Scans ``names`` (in parallel processes) and yields the scans in the order of ``names``."""
    jobs = [(root, name, media_filter) for name in names]
    return scan_in_order(_scan_task, jobs, num_workers=num_workers, progress=progress, desc="Indexing shards", unit="shard")


def _write_prepare_state(
    root: AnyPath, names: list[str], counts: dict[str, int], media_filter: MediaFilter | None
) -> None:
    sqlite_name = f"{META_DIR}/{INDEX_SQLITE}"
    stamps = _stamps(root, [sqlite_name, *(n for name in names for n in (name, index_name(name)))])
    shards = {
        name: {
            "id": shard_id,
            "count": counts[name],
            "stamps": stamps[name] + stamps[index_name(name)],
        }
        for shard_id, name in enumerate(names)
    }
    state = {
        "version": PREPARE_STATE_VERSION,
        "index_stamp": stamps[sqlite_name],
        "shards": shards,
        "media_filter": media_filter.to_json() if media_filter is not None else None,
    }
    atomic_write_text(meta_dir(root) / PREPARE_STATE, json.dumps(state, indent=1))
