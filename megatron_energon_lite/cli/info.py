"""``energon-lite info``: what a prepared dataset (or a metadataset YAML) holds."""

from __future__ import annotations

from pathlib import Path

import click
import numpy as np

from ..errors import EnergonLiteError
from ..format.dataset_config import load_dataset_config
from ..format.indexed import IndexedReader, indexed_prefix
from ..format.jsonl import JsonlReader
from ..format.media_metadata import media_counts
from ..format.metadata import (
    meta_dir,
    read_info,
    read_split_config,
    resolve_split,
)
from ..format.metadataset import is_metadataset_path, load_blend_plan
from ..format.sqlite_index import part_counts
from ..storage import AnyPath, list_files
from .blend_tree import echo_trees, read_trees
from .params import DATASET_PATH, Command, counted
from .share_plot import plan_targets, plot_shares, schedule_clocks, schedule_points


def _size(num_bytes: float) -> str:
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    unit = 0
    while num_bytes >= 1024 and unit < len(units) - 1:
        num_bytes /= 1024
        unit += 1
    return f"{num_bytes:.1f} {units[unit]}"


def echo_indexed(prefix: AnyPath) -> None:
    """Counts, sizes and document lengths of the Megatron indexed dataset at ``prefix``."""
    reader = IndexedReader(prefix)
    mode = ", multimodal" if reader.index.sequence_modes is not None else ""
    click.echo(f"Megatron indexed dataset {prefix}")
    click.echo(f"  dtype:       {reader.dtype.name}{mode}")
    click.echo(f"  documents:   {reader.num_documents}, sequences: {reader.num_sequences}, tokens: {reader.num_tokens}")
    for name, size in ((".bin", reader.bin_size), (".idx", reader.idx_size)):
        click.echo(f"  {name + ':':<12} {_size(size)} ({size} bytes)")
    lengths = np.diff(reader.document_starts)
    if len(lengths):
        click.echo(
            f"  doc length:  min {int(lengths.min())}, median {float(np.median(lengths)):g}, max {int(lengths.max())} tokens"
        )
    reader.close()


def _plot_schedule(path: AnyPath, split: str, until: int | None, output: Path) -> None:
    """The target share of each dataset of ``split`` at each point of its schedules, and a PNG of
    the shares over the clock."""
    plan = load_blend_plan(path, split, training=True)
    if plan.kind != "blend":
        raise click.UsageError(f"split {split} of {path} is a {plan.kind} plan: only a blend with weights has a schedule to draw")
    targets = plan_targets(plan)
    names = [f"{leaf.path} [{leaf.split_part}]" for leaf in plan.leaves]
    clocks, end = schedule_clocks(plan, until)
    points = [x for x in schedule_points(plan) if x <= end] or [0]
    click.echo(f"\nTarget shares of split {split} (clock: samples the blend has yielded, all ranks):")
    click.echo("  " + f"{'clock':>10}  " + "  ".join(f"ds{k:<5}" for k in range(len(names))))
    for clock in points:
        click.echo("  " + f"{clock:>10}  " + "  ".join(f"{share:7.3f}" for share in targets.at(clock)))
    for k, name in enumerate(names):
        click.echo(f"  ds{k}: {name}")
    plot_shares(output, names, target=[(clock, targets.at(clock)) for clock in clocks], xlabel="clock (samples the blend has yielded, all ranks)", title=f"{Path(str(path)).name}, split {split}: target shares")


def _describe_config(root: AnyPath, name: str | None) -> str:
    """The sample type line; raises our error when the dataset yaml exists but cannot be read."""
    if not (meta_dir(root) / (name or "dataset.yaml")).exists():
        return f"none ({name or 'dataset.yaml'} not written: prepare with --sample-type, or add it by hand)"
    config = load_dataset_config(root, name, trust_dataset_code=False)
    if config.kind == "crude":
        return "crude (CrudeWebdataset: samples are dicts, cooked by the task encoder)"
    mapping = ", ".join(f"{k}: {v.expression}" for k, v in config.field_map.items())
    factory = f", factory {config.factory_class.__module__}.{config.factory_class.__qualname__}" if config.factory_class is not None else ""
    return f"{getattr(config.sample_type, '__name__', 'sample')} ({config.kind}{': ' + mapping if mapping else ''}{factory})"


@click.command(cls=Command)
@click.argument("path", type=DATASET_PATH)
@click.option("--split-config", default=None, help="Split file in .nv-meta/ (default split.yaml).")
@click.option("--dataset-config", default=None, help="Dataset file in .nv-meta/ (default dataset.yaml).")
@click.option("--plot-schedule", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Metadataset only: draw the split's target shares over the blend's clock (global samples) as a PNG.")
@click.option("--split", "schedule_split", default="train", show_default=True, help="The split whose schedule --plot-schedule draws.")
@click.option("--until", type=click.IntRange(min=1), default=None, help="Draw the schedule up to this clock (global samples; default: a quarter past its last point).")
def info(path: AnyPath, split_config: str | None, dataset_config: str | None, plot_schedule: Path | None, schedule_split: str, until: int | None) -> None:
    """Print sample counts, sizes, splits, sample type and parts of the dataset at PATH.

    For a metadataset YAML: each split's blend, with one line per dataset it reads, and with
    --plot-schedule a picture of its weight schedule.  For a Megatron indexed dataset (its
    prefix, X.idx or X.bin): tokens, documents and their lengths.
    """
    if plot_schedule is not None and not is_metadataset_path(path):
        raise click.UsageError("--plot-schedule draws a metadataset's blend: give a metadataset YAML")
    if is_metadataset_path(path):
        if split_config or dataset_config:
            raise click.UsageError("--split-config and --dataset-config apply to a dataset folder; a metadataset sets them per entry")
        problems = echo_trees(path, read_trees(path))
        if problems:
            click.echo(f"{problems} entr{'y' if problems == 1 else 'ies'} of {path} cannot be read", err=True)
            raise SystemExit(1)
        if plot_schedule is not None:
            _plot_schedule(path, schedule_split, until, plot_schedule)
        return
    prefix = indexed_prefix(path)
    if prefix is not None:
        if split_config or dataset_config:
            raise click.UsageError("--split-config and --dataset-config apply to a dataset folder, not to a Megatron .bin/.idx dataset")
        echo_indexed(prefix)
        return
    if path.is_file():
        reader = JsonlReader(path)
        click.echo(f"JSONL dataset {path}: {len(reader)} records, {_size(path.stat().st_size)}")
        return
    dataset_info = read_info(path)
    counts = dataset_info.shard_counts
    total = dataset_info.total_samples
    size = sum(stat.size for stat in list_files(path, list(counts)).values())
    click.echo(f"Dataset {path}")
    click.echo(f"  written by:  {dataset_info.energon_version or 'unknown'}")
    click.echo(f"  shards:      {len(counts)}, samples: {total}, size: {_size(size)}")
    splits = read_split_config(path, split_config)
    for split in splits.split_parts:
        resolved = resolve_split(path, split, split_config=split_config, info=dataset_info, allow_empty=True)
        share = 100.0 * resolved.total_samples / total if total else 0.0
        excluded = sum(len(keys) for keys in resolved.excluded_keys.values())
        note = f", {excluded} samples excluded by key" if excluded else ""
        click.echo(f"  split {split + ':':<6} {counted(len(resolved.shards), 'shard')}, {counted(resolved.total_samples, 'sample')} ({share:.1f}%){note}")
    try:
        sample_type = _describe_config(path, dataset_config)
    except EnergonLiteError as exc:
        broken = exc
        sample_type = f"cannot be read: {str(exc).splitlines()[0]}"
    else:
        broken = None
    click.echo(f"  sample type: {sample_type}")
    parts = part_counts(path)
    if parts is not None:
        click.echo("  parts:       " + ", ".join(f"{name} ({count})" for name, count in parts.items()))
    media = media_counts(path)
    if media is not None:
        click.echo(f"  media:       {sum(media.values())} entries with metadata" + "".join(f", {kind}: {count}" for kind, count in media.items()))
    if broken is not None:  # the counts above still help; the exit status says the dataset cannot load
        raise broken
