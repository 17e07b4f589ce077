"""``energon-lite preview``: show the first samples of one or more splits.

Each sample is printed as Energon's ``energon preview`` prints it: ``Sample <index>`` and one
line per field, `` - <name> (<type>): <value>``, but values compactly, images drawn under their
line when the output is a terminal, and without asking "Continue?" after each sample: ``-n``
says how many. ``--html`` and ``--grid`` write the same samples to a page or a contact sheet
instead. The work is in :mod:`megatron_energon_lite.preview`; this module only reads the flags.
"""

from __future__ import annotations

import shutil
import sys

import click

from ..format.metadata import read_split_config, require_prepared
from ..format.metadataset import is_metadataset_path
from ..preview import (
    GRAPHICS,
    TerminalRenderer,
    collect,
    detect_graphics,
    write_grid,
    write_html,
)
from ..storage import AnyPath, as_path
from .blend_tree import split_names
from .params import DATASET_PATH, Command


def _default_split(path: AnyPath) -> str:
    """The first split of split.yaml (of the YAML's ``splits:`` for a metadataset)."""
    if is_metadataset_path(path):
        return split_names(path)[0]
    if path.is_dir():
        require_prepared(path)  # the message `info` gives, not a missing split.yaml
        return next(iter(read_split_config(path).split_parts), "train")
    return "train"


@click.command(cls=Command)
@click.argument("path", type=DATASET_PATH)
@click.option("--split-parts", default=None, help="Comma-separated splits to show, e.g. train,val (default: the first split in split.yaml).")
@click.option("--num-samples", "-n", type=click.IntRange(min=1), default=5, show_default=True, help="Samples to show per split (per dataset of a metadataset).")
@click.option("--offset", type=click.IntRange(min=0), default=0, show_default=True, help="First sample index.")
@click.option("--dataset-config", default=None, help="Dataset file in .nv-meta/ (default dataset.yaml).")
@click.option("--trust-dataset-code", is_flag=True, help="Allow dataset.yaml to run the dataset's sample_loader.py.")
@click.option(
    "--graphics",
    type=click.Choice(GRAPHICS),
    default="auto",
    show_default=True,
    help="How to draw images in the terminal: kitty or sixel graphics, colour half-blocks, or none. "
    "auto: kitty where kitty runs, sixel where TERM names it, else blocks; none when not writing to a terminal.",
)
@click.option("--html", "html_path", default=None, metavar="OUT.html", help="Write one self-contained HTML page of the samples instead of printing them.")
@click.option("--grid", "grid_path", default=None, metavar="OUT.png", help="Write a contact sheet (thumbnails with captions) instead of printing the samples.")
@click.option("--grid-columns", type=click.IntRange(min=1), default=5, show_default=True, help="Cells per row of --grid.")
def preview(
    path: AnyPath,
    split_parts: str | None,
    num_samples: int,
    offset: int,
    dataset_config: str | None,
    trust_dataset_code: bool,
    graphics: str,
    html_path: str | None,
    grid_path: str | None,
    grid_columns: int,
) -> None:
    """Show samples of the dataset or metadataset at PATH: drawn in the terminal, or as an HTML page or a contact sheet.

    PATH is a prepared dataset folder, a .jsonl file or a metadataset .yaml (each of its
    datasets is shown under a header with its entry and weight). In a terminal, images and
    video frames are drawn and audio is shown as a waveform; --html and --grid write files.
    """
    splits = [s.strip() for s in (split_parts or _default_split(path)).split(",") if s.strip()]
    sections = collect(path, splits, num_samples=num_samples, offset=offset, dataset_config=dataset_config, trust_dataset_code=trust_dataset_code)
    if html_path is not None or grid_path is not None:
        sections = list(sections)  # both files show the same samples, loaded once
        if html_path is not None:
            count = write_html(as_path(html_path), sections, title=str(path))
            click.echo(f"Wrote {count} samples to {html_path}")
        if grid_path is not None:
            count = write_grid(as_path(grid_path), sections, columns=grid_columns)
            click.echo(f"Wrote {count} samples to {grid_path}")
        return
    if graphics == "auto":
        graphics = detect_graphics(sys.stdout.isatty())
    renderer = TerminalRenderer(graphics, shutil.get_terminal_size().columns)
    for section in sections:
        for line in renderer.section_lines(section):
            # color=True: click would strip the colour codes of half-blocks when not on a tty
            click.echo(line, color=graphics != "none")
