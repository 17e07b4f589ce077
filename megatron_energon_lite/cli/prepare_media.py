"""``energon-lite prepare-media FOLDER``: Energon's media metadata for a plain folder (not yet)."""

from __future__ import annotations

import click

from ..media.filesystem_prepare import prepare_filesystem_dataset
from .params import Command


@click.command("prepare-media", cls=Command)
@click.argument("path")
@click.option("--num-workers", type=int, default=None, help="Parallel workers (Energon's option).")
@click.option("--media-metadata-by-extension", is_flag=True, help="Media recognised by file extension.")
@click.option("--media-metadata-by-glob", default=None, help="Media recognised by glob patterns.")
@click.option("--media-metadata-by-header", is_flag=True, help="Media recognised by file header.")
def prepare_media(path: str, **options: object) -> None:
    """Store media metadata for the files of a folder (for aux: sources). Not supported yet:
    exits 1 saying so."""
    prepare_filesystem_dataset(path, **options)
