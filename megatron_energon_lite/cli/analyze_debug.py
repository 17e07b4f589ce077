"""``energon-lite analyze-debug``: which sample keys a training run saw at which step.

Reads the JSONL debug logs written with ``WorkerConfig(worker_log_level>=1,
worker_debug_path=...)`` (ours or Energon's, see :mod:`megatron_energon_lite.loader.debug_log`) and
draws a heatmap: one row per unique sample key (in order of first use), one column per step,
coloured by the log file (rank or worker) the key came from.

Where the steps come from, the first that the logs have:

1. the loader's ``SavableDataLoader.yield`` / ``BasicDataLoader.yield`` records of one loader
   (the one of the chosen modality; asked when there are several): step = ``global_idx``;
2. the workers' ``yield_batch`` records of the chosen modalities: step = the worker's ``idx``;
3. Energon's sample-loader records (``WebdatasetSampleLoaderDataset._slices_iter.yield``):
   step = ``count``, the loading order from disk (also with ``--force-loading-order``).
"""

from __future__ import annotations

import colorsys
import json
from dataclasses import dataclass, field
from pathlib import Path

import click
import numpy as np

from ..loader.debug_log import find_config_value
from .params import Command, ValueProblem

_LOADER_INIT = ("SavableLoader.__init__", "BasicDataLoader.__init__")
_LOADER_YIELD = ("SavableDataLoader.yield", "BasicDataLoader.yield")
_WORKER_YIELD = "yield_batch"
_SAMPLE_LOADER_YIELD = "WebdatasetSampleLoaderDataset._slices_iter.yield"
_WANTED = (*_LOADER_INIT, *_LOADER_YIELD, _WORKER_YIELD, _SAMPLE_LOADER_YIELD)


@dataclass
class LoaderInfo:
    """A loader seen in the logs: its id, mode, dataset path and how many steps it yielded."""

    id: int
    modality: str | None
    path: str | None
    steps: int = 0


@dataclass
class LogFile:
    """What one log file holds, by record kind."""

    path: Path
    loaders: dict[int, LoaderInfo] = field(default_factory=dict)
    loader_steps: list[tuple[int, int, list[str]]] = field(default_factory=list)  # (loader id, global_idx, keys)
    worker_steps: list[tuple[str | None, int, list[str]]] = field(default_factory=list)  # (mode, idx, keys)
    sample_steps: list[tuple[int, str]] = field(default_factory=list)  # (count, key)
    bad_lines: int = 0


def _modality(config: object) -> str | None:
    training = find_config_value(config, ("training",))
    return None if not isinstance(training, bool) else ("train" if training else "val")


def read_log(path: Path) -> LogFile:
    """Parses the records of ``path`` that the analysis uses; other lines are skipped."""
    log = LogFile(path)
    with path.open("r", encoding="utf-8", errors="replace") as file:
        for line in file:
            if '"t"' not in line or not any(kind in line for kind in _WANTED):
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                log.bad_lines += 1  # e.g. the last line of a log that was still being written
                continue
            kind = record.get("t")
            if kind in _LOADER_INIT:
                config = record.get("config")
                path_value = find_config_value(config, ("_path", "path"))
                log.loaders[record["id"]] = LoaderInfo(record["id"], _modality(config), None if path_value is None else str(path_value))
            elif kind in _LOADER_YIELD:
                loader = log.loaders.setdefault(record["id"], LoaderInfo(record["id"], None, None))
                loader.steps = max(loader.steps, record["global_idx"] + 1)
                log.loader_steps.append((record["id"], record["global_idx"], list(record.get("keys") or [])))
            elif kind == _WORKER_YIELD:
                log.worker_steps.append((record.get("m"), record["idx"], list(record.get("keys") or [])))
            elif kind == _SAMPLE_LOADER_YIELD:
                log.sample_steps.append((record["count"], record["key"]))
    return log


def _log_files(paths: tuple[Path, ...]) -> list[Path]:
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files += sorted(path.glob("*.jsonl"))
        else:
            files.append(path)
    if not files:
        raise ValueProblem(f"no *.jsonl log files in {', '.join(map(str, paths))}; pass the folder of worker_debug_path or its files")
    return files


def _merge_loaders(logs: list[LogFile]) -> dict[int, LoaderInfo]:
    """Loaders by id over all files (each rank's loader with the same id is one loader)."""
    merged: dict[int, LoaderInfo] = {}
    for log in logs:
        for loader_id, info in log.loaders.items():
            known = merged.setdefault(loader_id, LoaderInfo(loader_id, info.modality, info.path))
            known.modality = known.modality or info.modality
            known.path = known.path or info.path
            if info.modality not in (None, known.modality) or info.path not in (None, known.path):
                raise ValueProblem(
                    f"loader id {loader_id} reads {known.modality} {known.path} in one log but {info.modality} {info.path} in {log.path}; "
                    "analyze the logs of one training run at a time"
                )
            known.steps = max(known.steps, info.steps)
    return merged


def _choose_loader(loaders: dict[int, LoaderInfo], modalities: list[str]) -> int | None:
    click.echo("Available loaders:")
    for info in loaders.values():
        click.echo(f"  {info.id}: {info.modality or 'unknown'} {info.path or 'unknown path'} {info.steps} steps")
    candidates = [i.id for i in loaders.values() if i.steps and (i.modality is None or i.modality in modalities)]
    if len(candidates) <= 1:
        return candidates[0] if candidates else None
    return int(click.prompt("Choose loader id", type=click.Choice([str(c) for c in candidates])))


def _steps_from_loader(logs: list[LogFile], loader_id: int, skip: int) -> list[tuple[int, int, list[str]]]:
    return [(global_idx - skip, source, keys) for source, log in enumerate(logs) for lid, global_idx, keys in log.loader_steps if lid == loader_id and global_idx >= skip and keys]


def _steps_from_workers(logs: list[LogFile], modalities: list[str], skip: int) -> list[tuple[int, int, list[str]]]:
    return [(idx - skip, source, keys) for source, log in enumerate(logs) for mode, idx, keys in log.worker_steps if (mode is None or mode in modalities) and idx >= skip and keys]


def _steps_from_sample_loader(logs: list[LogFile], skip: int) -> list[tuple[int, int, list[str]]]:
    return [(count - skip, source, [key]) for source, log in enumerate(logs) for count, key in log.sample_steps if count >= skip]


def palette(count: int, colorize: bool) -> np.ndarray:
    """``count`` distinct RGB colours (the first white), or all white without ``colorize``."""
    colors = np.full((max(1, count), 3), 255, dtype=np.int64)
    if colorize:
        for i in range(1, count):
            hue = (i * 0.6180339887) % 1.0  # golden-ratio steps keep neighbouring sources apart
            colors[i] = [round(255 * c) for c in colorsys.hsv_to_rgb(hue, 0.9, 1.0)]
    return colors


def write_heatmap(path: Path, steps: list[tuple[int, int, list[str]]], *, max_samples: int, max_steps: int, gain: float, colorize: bool, sources: int) -> tuple[int, int, int, int]:
    """Draws the heatmap and returns (unique keys, steps, keys per pixel row, steps per pixel column)."""
    key_ids: dict[str, int] = {}
    rows, cols, srcs = [], [], []
    for step, source, keys in sorted(steps, key=lambda s: (s[0], s[1])):
        for key in keys:
            rows.append(key_ids.setdefault(key, len(key_ids)))
            cols.append(step)
            srcs.append(source)
    num_keys, num_steps = len(key_ids), max(cols) + 1
    row_factor = -(-num_keys // max(1, max_samples))
    col_factor = -(-num_steps // max(1, max_steps))
    image = np.zeros((-(-num_keys // row_factor), -(-num_steps // col_factor), 3), dtype=np.int64)
    colors = palette(sources, colorize)
    np.add.at(image, (np.asarray(rows) // row_factor, np.asarray(cols) // col_factor), colors[np.asarray(srcs) % len(colors)])
    scale = 255.0 * gain / max(1, int(image.max()))
    pixels = np.clip(image * scale, 0, 255).astype(np.uint8)
    from PIL import Image

    Image.fromarray(pixels).save(path)
    return num_keys, num_steps, row_factor, col_factor


@click.command(cls=Command, name="analyze-debug")
@click.argument("log_paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--heatmap-path", type=click.Path(dir_okay=False, path_type=Path), default=Path("heatmap.png"), show_default=True, help="Where to write the heatmap PNG.")
@click.option("--heatmap-steps", type=click.IntRange(min=1), default=1000, show_default=True, help="Most pixel columns: steps are binned to fit.")
@click.option("--heatmap-samples", type=click.IntRange(min=1), default=1000, show_default=True, help="Most pixel rows: sample keys are binned to fit.")
@click.option("--heatmap-gain", type=float, default=10, show_default=True, help="Brightness factor of the heatmap.")
@click.option("--force-loading-order", is_flag=True, help="Use the loading order from disk (Energon's sample-loader records) instead of the batches.")
@click.option("--include-modality", default="train", show_default=True, help="Modalities to include, comma-separated: train, val.")
@click.option("--skip", type=click.IntRange(min=0), default=0, show_default=True, help="Leave out this many steps at the start.")
@click.option("--no-colors", is_flag=True, help="Draw every log file in white instead of one colour per file.")
def analyze_debug(log_paths: tuple[Path, ...], heatmap_path: Path, heatmap_steps: int, heatmap_samples: int, heatmap_gain: float, force_loading_order: bool, include_modality: str, skip: int, no_colors: bool) -> None:
    """Analyze the debug logs at LOG_PATHS (folders of *.jsonl, or files): which sample keys
    came at which step, as counts and a heatmap PNG."""
    files = _log_files(log_paths)
    click.echo(f"Analyzing {len(files)} logs...")
    logs = [read_log(path) for path in files]
    bad = sum(log.bad_lines for log in logs)
    if bad:
        click.echo(f"Skipped {bad} lines that are not complete JSON records")
    modalities = [m.strip() for m in include_modality.split(",") if m.strip()]
    steps: list[tuple[int, int, list[str]]] = []
    if not force_loading_order:
        loaders = _merge_loaders(logs)
        if loaders:
            loader_id = _choose_loader(loaders, modalities)
            if loader_id is not None:
                info = loaders[loader_id]
                click.echo(f"Reading for loader {loader_id}: {info.modality or 'unknown'} {info.path or 'unknown path'}")
                steps = _steps_from_loader(logs, loader_id, skip)
        if not steps:
            steps = _steps_from_workers(logs, modalities, skip)
            if steps:
                click.echo("No loader batch records; using the workers' yield_batch records (steps are per worker)")
    if not steps:
        click.echo("Forcing the loading order from disk" if force_loading_order else "No batch information in logs, trying sample loader logs...")
        click.echo("  Shuffle buffer and batching are not considered, only the loading order from disk (all modalities)")
        steps = _steps_from_sample_loader(logs, skip)
    if not steps:
        raise ValueProblem(
            f"no data found in {len(files)} log(s): no records with sample keys for modality {include_modality!r}; "
            "log with WorkerConfig(worker_log_level=1 or more, worker_debug_path=...), and pass --include-modality val for validation loaders"
        )
    num_keys, num_steps, row_factor, col_factor = write_heatmap(
        heatmap_path, steps, max_samples=heatmap_samples, max_steps=heatmap_steps, gain=heatmap_gain, colorize=not no_colors, sources=len(logs)
    )
    empty = num_steps - len({step for step, _, _ in steps})
    click.echo(f"Found {num_keys} unique sample keys, {num_steps} steps")
    if empty:
        click.echo(f"No data for {empty} of the steps")
    click.echo(f"Wrote heatmap to {heatmap_path}")
    click.echo("Heatmap axes:")
    click.echo(f"  x-axis: {num_steps} steps ({col_factor} per pixel)")
    click.echo(f"  y-axis: {num_keys} sample keys, in order of first use ({row_factor} per pixel)")
