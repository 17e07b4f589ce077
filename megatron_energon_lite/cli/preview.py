"""``energon-lite preview``: print the first samples of a split compactly."""

from __future__ import annotations

import click

from ..decode import SampleDecoder
from ..format.metadata import read_split_config
from ..pipeline.load import SampleLoader
from ..samples import CrudeSample, format_value
from ..storage import AnyPath
from .params import DATASET_PATH


@click.command()
@click.argument("path", type=DATASET_PATH)
@click.option("--split-parts", default=None, help="Split to show (default: the first one in split.yaml).")
@click.option("--num-samples", "-n", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--offset", type=click.IntRange(min=0), default=0, show_default=True, help="First sample index.")
@click.option("--dataset-config", default=None, help="Dataset file in .nv-meta/ (default dataset.yaml).")
@click.option("--trust-dataset-code", is_flag=True, help="Allow dataset.yaml to run the dataset's sample_loader.py.")
def preview(path: AnyPath, split_parts: str | None, num_samples: int, offset: int, dataset_config: str | None, trust_dataset_code: bool) -> None:
    """Print samples of the dataset at PATH (images as size and mode, tensors as shape)."""
    if split_parts is None and path.is_dir():
        split_parts = next(iter(read_split_config(path).split_parts), "train")
    loader = SampleLoader(
        path,
        split_parts or "train",
        dataset_config=dataset_config,
        decoder=SampleDecoder(image_decode="pil"),
        trust_dataset_code=trust_dataset_code,
    )
    try:
        end = min(len(loader), offset + num_samples)
        click.echo(f"{path} split {split_parts}: samples {offset}..{end - 1} of {len(loader)}")
        for index in range(offset, end):
            sample = loader.load(index)
            if sample is None:
                shown = "(excluded by split.yaml)"
            elif isinstance(sample, CrudeSample):  # parts only; the metadata is in the key
                shown = f"{sample['__key__']}: " + format_value({k: v for k, v in sample.items() if not k.startswith("__")})
            else:
                shown = format_value(sample)
            click.echo(f"[{index}] {shown}")
    finally:
        loader.close()
