"""``energon-lite prepare``: same flags as ``energon prepare``, parallel and incremental."""

from __future__ import annotations

import dataclasses
import json
import os

import click

from ..errors import ConfigError, format_message
from ..format.dataset_config import render_dataset_yaml
from ..format.jsonl import write_jsonl_index
from ..format.media_metadata import MediaFilter
from ..format.metadata import is_prepared, meta_dir
from ..format.prepare import prepare_dataset
from ..format.split_reader import SplitReader
from ..samples import registered_sample_types, sample_type_by_name
from ..storage import AnyPath, atomic_write_text
from .params import DATASET_PATH

CRUDE = "CrudeWebdataset"


def _parse_ratio(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.replace(" ", "").split(","))
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a list of numbers; use e.g. 8,1,1") from None
    if len(values) != 3:
        raise click.BadParameter(f"{text!r} has {len(values)} values; give train,val,test, e.g. 8,1,1")
    return values


def _parse_split_parts(values: tuple[str, ...]) -> list[tuple[str, str]] | None:
    if not values:
        return None
    parsed = []
    for value in values:
        name, sep, pattern = value.partition(":")
        if not sep or not name or not pattern:
            raise click.BadParameter(f"{value!r} is not NAME:REGEX, e.g. 'train:shards/train/.*'", param_hint="--split-parts")
        parsed.append((name, pattern))
    return parsed


def _sample_fields(sample_type: str) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(sample_type_by_name(sample_type)) if not f.name.startswith("__")]


def _check_sample_type(sample_type: str | None, field_map: str | None, interactive: bool) -> dict | None:
    """Validates --sample-type and --field-map before any indexing work starts."""
    if sample_type is None:
        if field_map is not None:
            raise click.BadParameter("--field-map needs --sample-type", param_hint="--field-map")
        return None
    names = [*registered_sample_types(), CRUDE]
    if sample_type not in names:
        raise click.BadParameter(f"{sample_type!r} is not one of {', '.join(names)}", param_hint="--sample-type")
    if sample_type == CRUDE:
        return None
    if field_map is None:
        if interactive:
            return None
        raise click.BadParameter(
            f"{sample_type} needs --field-map in non-interactive mode, e.g. '{{\"image\": \"jpg\", \"caption\": \"txt\"}}'",
            param_hint="--field-map",
        )
    try:
        mapping = json.loads(field_map)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not valid JSON ({exc})", param_hint="--field-map") from None
    if not isinstance(mapping, dict):
        raise click.BadParameter("must be a JSON object of field name -> part expression", param_hint="--field-map")
    fields = [f.name for f in _sample_fields(sample_type)]
    unknown = [k for k in mapping if k not in fields]
    if unknown:
        raise click.BadParameter(f"{sample_type} has no field {unknown[0]!r}; its fields are {', '.join(fields)}", param_hint="--field-map")
    return mapping


def _ask_dataset_yaml(sample_type: str | None, parts: list[str]) -> str | None:
    if sample_type is None:
        if not click.confirm("Do you want to create a dataset.yaml interactively?", default=True):
            return None
        choices = [*registered_sample_types(), CRUDE]
        for i, name in enumerate(choices):
            click.echo(f"  {i}: {name}")
        index = click.prompt("Sample type number", type=click.IntRange(0, len(choices) - 1))
        sample_type = choices[index]
    if sample_type == CRUDE:
        return render_dataset_yaml(CRUDE, None)
    click.echo(f"Parts found in the first samples: {', '.join(parts)}")
    mapping = {}
    for f in _sample_fields(sample_type):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        answer = click.prompt(
            f"Part expression for field {f.name!r}{'' if required else ' (optional, empty to skip)'}",
            default="" if not required else None,
            show_default=False,
        )
        if answer.strip():
            mapping[f.name] = answer.strip()
    return render_dataset_yaml(sample_type, mapping)


def _first_parts(root: AnyPath, split: str) -> list[str]:
    reader = SplitReader(root, split, allow_empty=True)
    try:
        parts: list[str] = []
        for index in range(min(2, len(reader))):
            sample = reader.read(index)
            if sample is not None:
                parts += [p for p in sample.parts if p not in parts]
        return parts
    finally:
        reader.close()


@click.command()
@click.argument("path", type=DATASET_PATH)
@click.option("--progress/--no-progress", default=True, help="Show a progress bar.")
@click.option("--split-parts", multiple=True, metavar="NAME:REGEX", help="Assign shards matching REGEX (re.match on the relative path) to split NAME. Repeatable.")
@click.option("--exclude", metavar="REGEX", help="Skip shards whose path matches REGEX (re.search).")
@click.option("--num-workers", type=click.IntRange(min=1), default=min(16, os.cpu_count() or 1), show_default=True, help="Processes that index shards in parallel.")
@click.option("--tar-index-only", is_flag=True, help="Only (re)build .tar.idx and index.sqlite; keep splits and dataset.yaml.")
@click.option("--shuffle-tars", is_flag=True, help="Shuffle shards (seed 42, as Energon) before the ratio split.")
@click.option("--non-interactive", is_flag=True, help="Never ask; fail when information is missing.")
@click.option("--split-ratio", metavar="TRAIN,VAL,TEST", help="Split shards by ratio, e.g. 8,1,1 (no shard is lost to rounding).")
@click.option("--force-overwrite", is_flag=True, help="Prepare again an already prepared dataset (unchanged shards are reused).")
@click.option("--skip-dataset-yaml", is_flag=True, help="Do not write dataset.yaml.")
@click.option("--dataset-yaml-name", default="dataset.yaml", show_default=True, help="File name of the dataset yaml in .nv-meta/.")
@click.option("--sample-type", metavar="NAME", help="Sample class, e.g. CaptioningSample, or CrudeWebdataset.")
@click.option("--field-map", metavar="JSON", help="Field -> part expression, e.g. '{\"image\": \"jpg\", \"caption\": \"txt\"}'.")
@click.option("--media-metadata-by-extension", is_flag=True, help="Store media metadata (size, duration, ...) of parts with an image/audio/video extension.")
@click.option("--media-metadata-by-glob", metavar="PATTERNS", help="Store media metadata of parts matching globs such as '*.jpg,*.wav' (comma-separated).")
@click.option("--media-metadata-by-header", is_flag=True, help="Store media metadata of parts recognised by their first bytes.")
def prepare(
    path: AnyPath,
    progress: bool,
    split_parts: tuple[str, ...],
    exclude: str | None,
    num_workers: int,
    tar_index_only: bool,
    shuffle_tars: bool,
    non_interactive: bool,
    split_ratio: str | None,
    force_overwrite: bool,
    skip_dataset_yaml: bool,
    dataset_yaml_name: str,
    sample_type: str | None,
    field_map: str | None,
    media_metadata_by_extension: bool,
    media_metadata_by_glob: str | None,
    media_metadata_by_header: bool,
) -> None:
    """Index the tar shards under PATH and write .nv-meta/ (or index a .jsonl file)."""
    media_filter = MediaFilter.from_options(
        glob=media_metadata_by_glob, header=media_metadata_by_header, extension=media_metadata_by_extension
    )
    if media_filter is not None and path.is_file():
        raise ConfigError(format_message("JSONL datasets do not support media metadata", found=str(path), fix="remove --media-metadata-by-..."))
    if path.is_file():
        if path.suffix != ".jsonl":
            raise ConfigError(format_message("prepare takes a dataset folder or a .jsonl file", found=str(path)))
        count = write_jsonl_index(path)
        click.echo(f"Indexed {count} records of {path} into {path.name}.idx")
        return
    interactive = not non_interactive
    mapping = _check_sample_type(sample_type, field_map, interactive)
    patterns = _parse_split_parts(split_parts)
    ratio = _parse_ratio(split_ratio) if split_ratio else None
    if patterns is not None and ratio is not None:
        raise click.BadParameter("give --split-ratio or --split-parts, not both", param_hint="--split-ratio")
    if not tar_index_only and patterns is None and ratio is None:
        if not interactive:
            raise click.BadParameter("non-interactive prepare needs --split-ratio or --split-parts (or --tar-index-only)", param_hint="--split-ratio")
    if not tar_index_only and is_prepared(path) and not force_overwrite:
        if not interactive:
            raise ConfigError(format_message("the dataset is already prepared", where=str(meta_dir(path)), fix="pass --force-overwrite (unchanged shards are not re-indexed) or --tar-index-only"))
        if not click.confirm("The dataset is already prepared. Overwrite its metadata?", default=False):
            raise click.Abort()
        force_overwrite = True
    if not tar_index_only and patterns is None and ratio is None:
        ratio = _parse_ratio(click.prompt("Train/val/test split ratio, e.g. 8,1,1"))

    write_yaml_now = None
    if not skip_dataset_yaml and not tar_index_only and sample_type is not None and (mapping is not None or sample_type == CRUDE):
        write_yaml_now = render_dataset_yaml(sample_type, mapping)
    result = prepare_dataset(
        path,
        split_ratio=ratio,
        split_parts=patterns,
        exclude=exclude,
        num_workers=num_workers,
        progress=progress,
        tar_index_only=tar_index_only,
        shuffle_tars=shuffle_tars,
        force_overwrite=force_overwrite,
        dataset_yaml=write_yaml_now,
        dataset_yaml_name=dataset_yaml_name,
        media_filter=media_filter,
    )
    click.echo(
        f"Indexed {len(result.shard_counts)} shards, {result.total_samples} samples "
        f"({len(result.scanned)} scanned, {len(result.reused)} unchanged)."
    )
    if result.media_filter is not None:
        skipped = f", {result.media_skipped} media parts could not be parsed (see the warnings)" if result.media_skipped else ""
        click.echo(f"Stored media metadata of {result.media_entries} entries (by {result.media_filter.strategy.value.lower()}){skipped}.")
    for split, shards in result.splits.items():
        click.echo(f"  split {split}: {len(shards)} shards, {sum(result.shard_counts[s] for s in shards)} samples")
    first_split = next((s for s, shards in result.splits.items() if shards), None)
    parts = _first_parts(path, first_split) if first_split else []
    if parts:
        click.echo(f"Parts of the first samples: {', '.join(parts)}")
    if interactive and write_yaml_now is None and not skip_dataset_yaml and not tar_index_only:
        text = _ask_dataset_yaml(sample_type, parts)
        if text is not None:
            atomic_write_text(meta_dir(path) / dataset_yaml_name, text)
            click.echo(f"Wrote {meta_dir(path) / dataset_yaml_name}")
    click.echo("Done")
