"""``energon-lite prepare-media PATH``: Energon's media metadata for a folder of media files.

Same options as ``energon prepare-media``.  A plain folder (what ``aux:`` sources read) gets
``.nv-meta/index.sqlite`` with one row per media file, see
:mod:`~megatron_energon_lite.energon.media.filesystem_prepare`; a re-run reads only new and changed files.
A prepared tar dataset gets media metadata for the parts of its samples instead, as in Energon
(the same as ``energon-lite prepare --tar-index-only`` with the filter).

Exit status as ``energon prepare-media``: 0 when the metadata was stored; 1 when the path, the
options or the folder are wrong (no filter, two filters, no media file).  Energon hangs where a
file cannot be decoded by header or glob; here such files are counted and logged, and the run
goes on.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from ..format.media_metadata import MediaFilter
from ..format.metadata import is_prepared
from ..format.prepare import prepare_dataset
from ..energon.media.filesystem_prepare import prepare_media_folder
from ..storage import as_path
from .params import Command


@click.command("prepare-media", cls=Command)
@click.argument("path")
@click.option("--progress/--no-progress", default=True, help="Show a progress bar.")
@click.option("--num-workers", type=click.IntRange(min=1), default=min(16, os.cpu_count() or 1), show_default=True, help="Processes that read files in parallel.")
@click.option("--media-metadata-by-glob", metavar="PATTERNS", help="Media are the files whose name (or path relative to PATH) matches one of these globs, e.g. '*.jpg,*.wav' (comma-separated).")
@click.option("--media-metadata-by-header", is_flag=True, help="Media are the files recognised by their first bytes (every file is read).")
@click.option("--media-metadata-by-extension", is_flag=True, help="Media are the files with an image/audio/video extension.")
@click.option("--tmp-path", type=click.Path(path_type=Path, file_okay=False), default=None, help="For a folder on object storage: the local folder to build index.sqlite in (and copy files to) before the upload; default: a temporary folder. Accepted for a remote tar dataset, which does not need it.")
def prepare_media(
    path: str,
    progress: bool,
    num_workers: int,
    media_metadata_by_glob: str | None,
    media_metadata_by_header: bool,
    media_metadata_by_extension: bool,
    tmp_path: Path | None,
) -> None:
    """Store media metadata (size, format, duration, ...) of the media files under PATH in
    PATH/.nv-meta/index.sqlite, for aux: sources. Exactly one --media-metadata-by-... option."""
    media_filter = MediaFilter.from_options(
        glob=media_metadata_by_glob, header=media_metadata_by_header, extension=media_metadata_by_extension
    )
    root = as_path(path)
    if media_filter is not None and is_prepared(root):
        _prepare_tar_dataset(root, media_filter, num_workers=num_workers, progress=progress, tmp_path=tmp_path)
        return
    click.echo("Preparing filesystem dataset and computing media metadata...")
    result = prepare_media_folder(root, media_filter, progress=progress, num_workers=num_workers, tmp_path=tmp_path)
    removed = f", {_count(result.removed, 'file')} removed since the last run" if result.removed else ""
    click.echo(f"Considered {_count(result.files, 'file')} ({len(result.scanned)} read, {len(result.reused)} unchanged{removed}).")
    skipped = f"; {_count(result.skipped, 'file')} could not be decoded (see the warnings)" if result.skipped else ""
    click.echo(
        f"Stored media metadata of {_count(result.entries, 'entry', 'entries')} "
        f"(by {result.media_filter.strategy.value.lower()}) in {result.index}{skipped}."
    )
    if result.ignored:
        click.echo(f"Ignored {_count(result.ignored, 'path')}: symlinks out of the folder or dangling, or unreadable (see the warnings).")
    click.echo(f"Done. Stored metadata for {result.entries} files.")  # energon's line


def _count(items, one: str, many: str | None = None) -> str:
    n = items if isinstance(items, int) else len(items)
    return f"{n} {one if n == 1 else many or one + 's'}"


def _prepare_tar_dataset(root, media_filter: MediaFilter, *, num_workers: int, progress: bool, tmp_path: Path | None) -> None:
    """As ``energon prepare-media`` on a prepared tar dataset: media metadata of its parts.

    ``tmp_path`` is not needed: a remote dataset's index is built in a temporary folder.
    """
    del tmp_path
    click.echo("Preparing webdataset and computing media metadata...")
    result = prepare_dataset(root, tar_index_only=True, media_filter=media_filter, num_workers=num_workers, progress=progress)
    skipped = f"; {result.media_skipped} media parts could not be parsed (see the warnings)" if result.media_skipped else ""
    click.echo(f"Indexed {len(result.shard_counts)} shards ({len(result.scanned)} scanned, {len(result.reused)} unchanged){skipped}.")
    click.echo(f"Done. Stored metadata for {result.media_entries} files.")  # energon's line
