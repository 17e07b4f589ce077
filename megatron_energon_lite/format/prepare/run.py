"""One prepare run: :func:`prepare_dataset`, the order of its steps, and its result."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ...errors import ConfigError, DatasetError, format_message
from ...storage import AnyPath, as_path
from ..media_metadata import MediaFilter
from ..metadata import is_prepared, meta_dir, read_info, unreadable_shard_name
from .discover import _discover
from .incremental import _kept_media_filter, _load_prepare_state, _remove_leftovers, _unchanged_shards
from .splits import _choose_splits
from .write import ShardScans, _build_and_install, _write_metadata


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
    shard_scans: ShardScans | None = None,
) -> PrepareResult:
    """Indexes the tars under ``root`` and writes Energon-compatible metadata.

    Exactly one of ``split_ratio`` (e.g. ``(8, 1, 1)`` for train/val/test) and ``split_parts``
    (``[(name, regex), ...]``) is needed unless ``tar_index_only`` keeps the existing splits.
    ``dataset_yaml`` is the text of ``.nv-meta/<dataset_yaml_name>`` to write, if any.
    ``shards``: the tar paths (relative to ``root``) to index instead of every tar found there.
    ``media_filter`` stores media metadata (Energon's ``--media-metadata-by-*``); None keeps the
    filter of an existing index, if it has one.  ``shard_scans``: where the changed shards'
    scans come from (None: scanned here, in ``num_workers`` processes; a prepare across ranks
    reads them from the ranks' part files, :mod:`.nodes`).
    """
    root = as_path(root)
    names, dotted, splits = _shards_and_splits(
        root,
        split_ratio=split_ratio,
        split_parts=split_parts,
        exclude=exclude,
        tar_index_only=tar_index_only,
        shuffle_tars=shuffle_tars,
        force_overwrite=force_overwrite,
        confirm_overwrite=confirm_overwrite,
        shards=shards,
    )
    meta = meta_dir(root)
    meta.mkdir(exist_ok=True)
    _remove_leftovers(root, meta, names, dotted)
    if media_filter is None:
        media_filter = _kept_media_filter(meta)
    state = _load_prepare_state(root)
    unchanged = _unchanged_shards(root, names, media_filter, state)
    built, unchanged = _build_and_install(
        root,
        meta,
        names,
        unchanged,
        state,
        num_workers=num_workers,
        progress=progress,
        media_filter=media_filter,
        shard_scans=shard_scans,
    )
    _write_metadata(
        root,
        meta,
        names,
        built,
        splits=splits,
        state=state,
        unchanged=unchanged,
        media_filter=media_filter,
        dataset_yaml=dataset_yaml,
        dataset_yaml_name=dataset_yaml_name,
    )
    return PrepareResult(
        root,
        built.counts,
        scanned=[n for n in names if n not in unchanged],
        reused=list(unchanged),
        splits=splits,
        media_filter=media_filter,
        media_entries=built.media_entries,
        media_skipped=len(built.media_failures),
    )


def _shards_and_splits(
    root: AnyPath,
    *,
    split_ratio: Sequence[float] | None,
    split_parts: Sequence[tuple[str, str]] | None,
    exclude: str | None,
    tar_index_only: bool,
    shuffle_tars: bool,
    force_overwrite: bool,
    confirm_overwrite: Callable[[], bool] | None,
    shards: Sequence[str] | None,
) -> tuple[list[str], set[str] | None, dict[str, list[str]]]:
    """The checks a prepare makes before any work, and what it works on: the shards, the
    folders the walk saw temporaries in (see :func:`~.discover._discover`) and the splits."""
    if not root.is_dir():
        raise DatasetError(format_message("dataset folder not found", where=str(root)))
    dotted: set[str] | None = set() if shards is None and not tar_index_only else None  # see discover._discover
    if tar_index_only:
        names = _prepared_shards(root)
    else:
        _check_may_prepare(root, split_ratio, split_parts, force_overwrite=force_overwrite, confirm_overwrite=confirm_overwrite)
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

    _check_shard_names(names)
    # Splits first: a bad pattern must fail before any work is done.
    splits: dict[str, list[str]] = {}
    if not tar_index_only:
        splits = _choose_splits(names, split_ratio, split_parts, shuffle=shuffle_tars)

    return names, dotted, splits


def _prepared_shards(root: AnyPath) -> list[str]:
    """``tar_index_only``: the shards of the prepared dataset, in their order."""
    if not is_prepared(root):
        raise DatasetError(
            format_message(
                "--tar-index-only needs a prepared dataset",
                where=str(root),
                fix="run prepare without --tar-index-only first",
            )
        )
    return list(read_info(root).shard_counts)


def _check_may_prepare(
    root: AnyPath,
    split_ratio: Sequence[float] | None,
    split_parts: Sequence[tuple[str, str]] | None,
    *,
    force_overwrite: bool,
    confirm_overwrite: Callable[[], bool] | None,
) -> None:
    """A full prepare needs one way to split, and leave to replace the metadata of a prepared
    dataset (``force_overwrite``, or ``confirm_overwrite`` answering yes)."""
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


def _check_shard_names(names: list[str]) -> None:
    """Refuses the tar files whose names the loader would refuse (the loader's own rule), before
    any work is done: they would be indexed, then fail in every job that reads the split."""
    bad = [(name, problem) for name in names if (problem := unreadable_shard_name(name)) is not None]
    if bad:
        raise DatasetError(
            format_message(
                f"{len(bad)} shard name(s) that the loader cannot read",
                where=", ".join(repr(name) for name, _ in bad[:5]) + (" ..." if len(bad) > 5 else ""),
                expected="UTF-8 file names without '{' or '}'",
                found=bad[0][1],
                fix="rename those files, or leave them out with --exclude",
            )
        )
