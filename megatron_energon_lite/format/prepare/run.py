"""One prepare run: :func:`prepare_dataset`, the order of its steps, and its result."""

from __future__ import annotations

import logging
import os
import sqlite3
import uuid
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ...errors import ConfigError, DatasetError, format_message
from ...storage import (
    AnyPath,
    RemotePath,
    as_path,
    atomic_write_text,
    is_no_room,
    local_scratch,
    local_view,
    no_room_error,
    remove_scratch,
    remove_stale_temporaries,
    replace_with,
    temporary_name,
)
from ..media_metadata import MediaFilter, read_media_filter
from ..metadata import INDEX_SQLITE, INDEX_UUID, DatasetInfo, is_prepared, meta_dir, read_info, write_info
from ..split_cache import write_split_cache
from ..tar_index import INDEX_DTYPE, index_name, write_tar_index
from .discover import _discover
from .incremental import _load_prepare_state, _pending_index, _unchanged_shards, _update_in_place, _write_prepare_state
from .splits import _write_splits, splits_by_patterns, splits_by_ratio
from .write import _build_index, _sync_files, _unlink_quietly, _UnusablePreviousIndex

# The package's name, the one prepare's log records had when it was a single module.
logger = logging.getLogger(__package__)


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
    dotted: set[str] | None = set() if shards is None and not tar_index_only else None  # see _discover
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
        names = [str(name) for name in shards] if shards is not None else _discover(root, exclude, dotted)
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
    local = not isinstance(root, RemotePath)
    base = os.fspath(root) if local else ""
    if local:  # what a killed or out-of-room prepare left behind
        folders = {name.rpartition("/")[0] for name in names}  # ~100 for 10,000 shards
        if dotted is not None:  # the walk just listed them: only where it saw a ".NAME"
            folders &= dotted
        remove_stale_temporaries({os.fspath(meta), *(os.path.join(base, folder) for folder in folders)})
    if media_filter is None:
        media_filter = read_media_filter(meta / INDEX_SQLITE)
        if media_filter is not None:
            logger.info("keeping the media metadata of %s (%s)", meta / INDEX_SQLITE, media_filter.to_json())
    state = _load_prepare_state(root)
    unchanged = _unchanged_shards(root, names, media_filter, state)

    # SQLite needs local files: the new index is built next to the old one locally (so the final
    # rename is atomic), in a temporary folder for a remote dataset (then uploaded).  Locally the
    # workers write each new .tar.idx under a temporary name; they are renamed into place only
    # once the whole index is built (and removed if it is not).
    owner = os.getpid() if local else None
    pending: set[str] = set()  # shards whose temporary .tar.idx may exist
    scratch, owned = local_scratch(meta)
    done = False
    try:
        tmp_index = temporary_name(scratch / INDEX_SQLITE)
        previous_index = local_view(meta / INDEX_SQLITE) if unchanged or media_filter is not None else None
        build = dict(num_workers=num_workers, progress=progress, media_filter=media_filter, owner=owner, pending=pending)
        try:
            try:
                in_place = _update_in_place(names, unchanged, state)
                built = _build_index(tmp_index, previous_index, root, names, unchanged, in_place=in_place, **build)
            except _UnusablePreviousIndex as exc:
                logger.warning("%s", exc)
                unchanged = {}
                built = _build_index(tmp_index, previous_index, root, names, unchanged, **build)
        except (OSError, sqlite3.OperationalError) as exc:
            if is_no_room(exc):
                raise no_room_error(tmp_index, exc) from None
            raise
        if local:
            written = {name: _pending_index(base, name, owner) for name in built.index_stamps}
            _sync_files(list(written.values()))
            for name, temporary in written.items():
                os.replace(temporary, os.path.join(base, index_name(name)))
                pending.discard(name)
        else:
            for name, data in built.index_data.items():
                write_tar_index(root / name, np.frombuffer(data, dtype=INDEX_DTYPE))
        replace_with(meta / INDEX_SQLITE, tmp_index)
        done = True
    finally:
        if not done and pending:
            for name in pending:
                _unlink_quietly(_pending_index(base, name, owner))
        remove_scratch(scratch, owned)
    counts = built.counts
    to_scan = [n for n in names if n not in unchanged]
    failures = built.media_failures
    atomic_write_text(meta / INDEX_UUID, str(uuid.uuid4()))
    split_record = _write_splits(root, splits, state) if splits else state.get("split")
    if dataset_yaml is not None:
        atomic_write_text(meta / dataset_yaml_name, dataset_yaml)
    _write_prepare_state(
        root, names, counts, media_filter, previous=state, unchanged=unchanged, tar_stamps=built.tar_stamps, index_stamps=built.index_stamps, split_record=split_record
    )
    write_info(root, DatasetInfo(shard_counts=counts))
    write_split_cache(root)  # after both files it copies: every rank then starts without parsing them
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
