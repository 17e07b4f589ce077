"""``energon-lite preview``: print the first samples of one or more splits.

Each sample is printed as Energon's ``energon preview`` prints it: ``Sample <index>`` and one
line per field, `` - <name> (<type>): <value>``, but values compactly (images as size and mode,
tensors as shape) and without asking "Continue?" after each sample: ``-n`` says how many.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import click

from ..decode import SampleDecoder
from ..errors import EmptyDatasetError
from ..format.metadata import read_split_config
from ..pipeline.load import SampleLoader
from ..samples import CrudeSample, format_value
from ..storage import AnyPath
from .params import DATASET_PATH, Command

#: Fields Energon's preview leaves out: bookkeeping, not data.
_HIDDEN_FIELDS = ("__restore_key__", "__subflavors__", "__sources__")


def _field_types(sample_type: type) -> dict[str, Any]:
    """Resolved annotations of a sample class (the written ones where they cannot be resolved)."""
    try:
        return typing.get_type_hints(sample_type)
    except Exception:  # noqa: BLE001 - a forward reference we cannot resolve: show it as written
        return {f.name: f.type for f in dataclasses.fields(sample_type)}


def sample_lines(index: int, sample: Any) -> list[str]:
    """The lines ``preview`` prints for one sample (Energon's layout, our compact values)."""
    lines = [f"Sample {index}"]
    if isinstance(sample, CrudeSample):  # a dict of parts: no field types
        for name, value in sample.items():
            if name not in _HIDDEN_FIELDS:
                lines.append(f" - {name}: {format_value(value)}")
        return lines
    types = _field_types(type(sample))
    for field in dataclasses.fields(sample):
        if field.name not in _HIDDEN_FIELDS:
            lines.append(f" - {field.name} ({types.get(field.name, field.type)}): {format_value(getattr(sample, field.name))}")
    return lines


def _preview_split(path: AnyPath, split: str, *, num_samples: int, offset: int, dataset_config: str | None, trust: bool) -> None:
    try:
        loader = SampleLoader(path, split, dataset_config=dataset_config, decoder=SampleDecoder(image_decode="pil"), trust_dataset_code=trust)
    except EmptyDatasetError:
        click.echo(f"Dataset {split} is empty. Skipping.")  # as energon preview
        return
    try:
        end = min(len(loader), offset + num_samples)
        click.echo(f"{path} split {split}: samples {offset}..{end - 1} of {len(loader)}")
        for index in range(offset, end):
            sample = loader.load(index)
            if sample is None:
                click.echo(f"Sample {index}\n (excluded by split.yaml)")
            else:
                click.echo("\n".join(sample_lines(index, sample)))
    finally:
        loader.close()


@click.command(cls=Command)
@click.argument("path", type=DATASET_PATH)
@click.option("--split-parts", default=None, help="Comma-separated splits to show, e.g. train,val (default: the first split in split.yaml).")
@click.option("--num-samples", "-n", type=click.IntRange(min=1), default=5, show_default=True, help="Samples to show per split.")
@click.option("--offset", type=click.IntRange(min=0), default=0, show_default=True, help="First sample index.")
@click.option("--dataset-config", default=None, help="Dataset file in .nv-meta/ (default dataset.yaml).")
@click.option("--trust-dataset-code", is_flag=True, help="Allow dataset.yaml to run the dataset's sample_loader.py.")
def preview(path: AnyPath, split_parts: str | None, num_samples: int, offset: int, dataset_config: str | None, trust_dataset_code: bool) -> None:
    """Print samples of the dataset at PATH (images as size and mode, tensors as shape)."""
    if split_parts is None:
        split_parts = next(iter(read_split_config(path).split_parts), "train") if path.is_dir() else "train"
    for split in [s.strip() for s in split_parts.split(",") if s.strip()]:
        _preview_split(path, split, num_samples=num_samples, offset=offset, dataset_config=dataset_config, trust=trust_dataset_code)
