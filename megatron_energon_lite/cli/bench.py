"""``energon-lite bench``: how fast the loader feeds a training loop, and how fast it could.

Runs the training loader (``get_train_dataset`` + ``get_savable_loader``, an endless stream, for
any split) over DATASET_OR_YAML for ``--seconds`` and prints batches/s and samples/s, the time to
the first batch, the loader's stall report (where the time went) and the mock ceiling: the same
loop over ``mock=True`` (each worker's first batch again and again, no I/O or decode), which is
what the loader costs a training loop at the least.  ``--plot OUT.png`` draws batches/s per
worker over time (Pillow; no matplotlib).

Samples per batch: the length of the first dimension of the batch's first field (a tensor) or the
length of that field (a list); for a task encoder whose batches have neither, only batches are
counted.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib
import importlib.util
import math
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from ..storage import AnyPath
from .params import DATASET_PATH, Command, ValueProblem

__all__ = ["Run", "bench", "load_task_encoder", "plot_throughput", "samples_in", "stall_lines"]

#: The PNG ``--plot`` writes: width x height in pixels.
PLOT_SIZE = (900, 500)
#: Line colours of the workers in the plot (then repeated).
COLOURS = ((31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75), (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207))


def load_task_encoder(spec: str | None) -> Any:
    """``module:Class`` (or ``path/to/file.py:Class``; a dotted attribute path works too) ->
    an instance of that task encoder (a ready instance is taken as is); None: the default one."""
    from ..energon.task_encoder import DefaultTaskEncoder, TaskEncoder  # on use only: loads torch, which the CLI's other commands never need

    if spec is None:
        return DefaultTaskEncoder()
    hint = "'--task-encoder'"
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueProblem(f"{spec!r} is not module:Class (e.g. my_project.encoders:MyTaskEncoder)", param_hint=hint)
    try:
        if module_name.endswith(".py"):
            location = importlib.util.spec_from_file_location(Path(module_name).stem, module_name)
            if location is None or location.loader is None or not Path(module_name).is_file():
                raise FileNotFoundError(f"no such file: {module_name}")
            module = importlib.util.module_from_spec(location)
            sys.modules[location.name] = module
            location.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path:  # as `python -m`: modules of the current folder import
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any failure of the user's module is reported with its name
        raise ValueProblem(f"cannot import the task encoder {spec!r}: {type(exc).__name__}: {exc}", param_hint=hint) from exc
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ValueProblem(f"cannot import the task encoder {spec!r}: {module_name} has no attribute {attribute!r}", param_hint=hint)
        target = getattr(target, part)
    try:
        encoder = target() if isinstance(target, type) else target
    except Exception as exc:  # noqa: BLE001
        raise ValueProblem(f"cannot create the task encoder {spec!r}: {type(exc).__name__}: {exc}", param_hint=hint) from exc
    if not isinstance(encoder, TaskEncoder):
        raise ValueProblem(f"{spec!r} is not a TaskEncoder (found {type(encoder).__name__})", param_hint=hint)
    return encoder


def _first_field(batch: Any) -> Any:
    if isinstance(batch, Mapping):
        values = [v for k, v in batch.items() if not str(k).startswith("__")]
        return values[0] if values else None
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        names = [f.name for f in dataclasses.fields(batch) if not f.name.startswith("__")]
        return getattr(batch, names[0]) if names else None
    if isinstance(batch, (list, tuple)) and batch and not isinstance(batch, str):
        return batch[0]
    return None


def _length(value: Any) -> int | None:
    shape = getattr(value, "shape", None)
    if shape is not None:
        try:
            return int(shape[0]) if len(shape) > 0 else None
        except (TypeError, ValueError, IndexError):
            return None
    if isinstance(value, (list, tuple)) and not isinstance(value, str):
        return len(value)
    return None


def samples_in(batch: Any) -> int | None:
    """Samples in ``batch``: its first dimension if it is a tensor, else that of its first field
    (a tensor's first dimension, a list's length); None when that says nothing."""
    length = _length(batch) if hasattr(batch, "shape") else None
    if length is None:
        length = _length(_first_field(batch))
    return length if length is not None and length > 0 else None


@dataclasses.dataclass
class Run:
    """One measured loop: what arrived when, from which worker."""

    seconds: float  # the measured window (after the first batch)
    first_batch_s: float
    #: (seconds since the window began, logical worker, samples or None) per batch.
    events: list[tuple[float, int, int | None]]
    workers: int
    stall: dict | None = None
    stall_summary: str | None = None
    stall_error: str | None = None

    @property
    def batches(self) -> int:
        return len(self.events)

    @property
    def samples(self) -> int | None:
        counts = [n for _, _, n in self.events]
        return None if not counts or any(n is None for n in counts) else sum(counts)

    def per_s(self, count: int | None) -> float | None:
        return None if count is None or self.seconds <= 0 else count / self.seconds


def _shut_down(loader: Any) -> None:
    iterator = getattr(loader, "_iterator", None)  # persistent workers: stop them now
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()


def measure(dataset: Any, seconds: float, *, progress: bool, desc: str, stall: bool) -> Run:
    """Loops over a loader of ``dataset`` for ``seconds`` after its first batch."""
    from tqdm import tqdm

    from ..loader import get_savable_loader  # on use only: loads torch, which the CLI's other commands never need

    loader = get_savable_loader(dataset, stall_report=stall)
    workers = max(loader.worker_config.workers_per_rank, 1)
    bar = tqdm(total=seconds, desc=desc, unit="s", file=sys.stderr, disable=not progress, bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total:.1f} s{postfix}")
    start = time.perf_counter()
    stream = iter(loader)
    try:
        next(stream)
        first = time.perf_counter() - start
        events: list[tuple[float, int, int | None]] = []
        begin = last_shown = time.perf_counter()
        while True:
            try:
                batch = next(stream)
            except StopIteration:  # a stream that ends (a task encoder's own pipeline): go on
                stream = iter(loader)
                continue
            now = time.perf_counter() - begin
            events.append((now, loader.last_worker_id or 0, samples_in(batch)))
            del batch
            if now >= seconds:
                break
            if now - last_shown >= 0.1:
                last_shown = now
                bar.n = round(min(now, seconds), 1)
                bar.set_postfix_str(f"{len(events) / now:,.1f} batches/s")
        bar.n = round(seconds, 1)
        bar.refresh()
        run = Run(seconds=events[-1][0] if events else 0.0, first_batch_s=first, events=events, workers=workers)
        if stall:
            _stall_report(loader, run)
        return run
    finally:
        bar.close()
        stream.close()
        _shut_down(loader)
        del stream, loader
        gc.collect()


def _stall_report(loader: Any, run: Run) -> None:
    try:
        report = loader.stall_report()
        run.stall_summary = str(report.summary())
        run.stall = dict(report.as_dict())
    except Exception as exc:  # noqa: BLE001 - a report that fails must not lose the measurement
        run.stall_error = f"{type(exc).__name__}: {exc}"


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def _stage_rows(stages: Any, indent: str) -> list[str]:
    if not isinstance(stages, Mapping) or not stages:
        return []
    rows = sorted(((str(name), v if isinstance(v, Mapping) else {}) for name, v in stages.items()), key=lambda row: -_number(row[1].get("s")))
    width = max(len("stage"), *(len(name) for name, _ in rows))
    lines = [f"{indent}{'stage':<{width}}  {'seconds':>9}  {'share':>6}"]
    for name, value in rows:
        lines.append(f"{indent}{name:<{width}}  {_number(value.get('s')):>9.2f}  {_number(value.get('share')) * 100:>5.1f}%")
    return lines


def stall_lines(report: Mapping[str, Any]) -> list[str]:
    """The stall report's table: the loop's wait, then the workers' time per stage (most first),
    then per dataset; from ``stall_report().as_dict()`` (missing parts are left out)."""
    lines = []
    if "wall_s" in report:
        line = f"  loop waited {_number(report.get('waited_s')):.2f} s of {_number(report.get('wall_s')):.2f} s ({_number(report.get('waited_share')) * 100:.1f}%)"
        if "worker_s" in report:
            line += f"; loader work {_number(report.get('worker_s')):.2f} s"
        if report.get("workers") and "worker_busy_share" in report:
            line += f" (workers busy {_number(report.get('worker_busy_share')) * 100:.1f}% of their time)"
        lines.append(line)
    lines += _stage_rows(report.get("stages"), "  ")
    datasets = report.get("datasets")
    if isinstance(datasets, Mapping):
        for name, value in datasets.items():
            rows = _stage_rows(value.get("stages") if isinstance(value, Mapping) else None, "    ")
            if rows:
                lines += [f"  dataset {name}:", *rows]
    return lines


def _nice_step(span: float, ticks: int = 5) -> float:
    raw = max(span, 1e-9) / ticks
    power = 10 ** math.floor(math.log10(raw))
    return next(step * power for step in (1, 2, 2.5, 5, 10) if step * power >= raw)


def _format_tick(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 or float(value).is_integer() else f"{value:g}"


def _font(size: int):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # an old Pillow: the small bitmap font
        return ImageFont.load_default()


def plot_throughput(run: Run, path: str | os.PathLike, *, bin_s: float, title: str, size: tuple[int, int] = PLOT_SIZE) -> None:
    """A PNG of batches/s per worker over the measured window, in bins of ``bin_s`` seconds."""
    from PIL import Image, ImageDraw

    width, height = size
    left, right, top, bottom = 80, 130, 44, 56
    # Whole bins only: a last, partial bin (the window ends a little after a bin edge) would
    # show a drop that is not there.
    bins = max(1, math.floor(run.seconds / bin_s + 1e-6))
    rates = [[0.0] * bins for _ in range(run.workers)]
    for t, worker, _ in run.events:
        if 0 <= worker < run.workers and int(t / bin_s) < bins:
            rates[worker][int(t / bin_s)] += 1 / bin_s
    x_max = bins * bin_s
    y_step = _nice_step(max((max(r) for r in rates), default=0.0) or 1.0)
    y_max = y_step * max(1, math.ceil(max((max(r) for r in rates), default=0.0) / y_step))
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    small, normal = _font(12), _font(14)
    x0, x1, y0, y1 = left, width - right, height - bottom, top

    def x_of(t: float) -> float:
        return x0 + (x1 - x0) * t / x_max

    def y_of(v: float) -> float:
        return y0 - (y0 - y1) * v / y_max

    # Grid, ticks and tick labels.
    value = 0.0
    while value <= y_max + 1e-9:
        y = y_of(value)
        draw.line([(x0, y), (x1, y)], fill=(230, 230, 230))
        draw.line([(x0 - 5, y), (x0, y)], fill="black")
        draw.text((x0 - 8, y), _format_tick(value), fill="black", font=small, anchor="rm")
        value += y_step
    x_step = _nice_step(x_max, 8)
    value = 0.0
    while value <= x_max + 1e-9:
        x = x_of(value)
        draw.line([(x, y0), (x, y0 + 5)], fill="black")
        draw.text((x, y0 + 8), _format_tick(value), fill="black", font=small, anchor="mt")
        value += x_step
    draw.line([(x0, y1), (x0, y0), (x1, y0)], fill="black", width=2)
    # Axis labels and title.
    draw.text(((x0 + x1) / 2, height - 8), "time (s)", fill="black", font=normal, anchor="md")
    label = f"batches/s (bins of {bin_s:g} s)"
    box = draw.textbbox((0, 0), label, font=normal)
    text = Image.new("RGBA", (box[2] - box[0] + 4, box[3] - box[1] + 6), (255, 255, 255, 0))
    ImageDraw.Draw(text).text((2 - box[0], 3 - box[1]), label, fill="black", font=normal)
    text = text.rotate(90, expand=True)
    image.paste(text, (8, int((y0 + y1) / 2 - text.height / 2)), text)
    draw.text(((x0 + x1) / 2, 12), title, fill="black", font=normal, anchor="mt")
    # One line per worker, and the legend.
    for worker, series in enumerate(rates):
        colour = COLOURS[worker % len(COLOURS)]
        points = [(x_of((i + 0.5) * bin_s), y_of(v)) for i, v in enumerate(series)]
        if len(points) > 1:
            draw.line(points, fill=colour, width=2, joint="curve")
        for x, y in points:
            draw.ellipse([(x - 2.5, y - 2.5), (x + 2.5, y + 2.5)], fill=colour)
        legend_y = top + 8 + 20 * worker
        if legend_y < height - bottom:
            draw.line([(x1 + 16, legend_y), (x1 + 40, legend_y)], fill=colour, width=3)
            draw.text((x1 + 46, legend_y), f"worker {worker}", fill="black", font=small, anchor="lm")
    image.save(path, format="PNG")


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.1f}"


@click.command(cls=Command)
@click.argument("path", metavar="DATASET_OR_YAML", type=DATASET_PATH)
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True, help="Samples per batch.")
@click.option("--num-workers", type=click.IntRange(min=0), default=len(os.sched_getaffinity(0)), show_default="the cores this process may use", help="Dataloader worker processes (0: in this process).")
@click.option("--task-encoder", default=None, metavar="MODULE:CLASS", help="Task encoder to load with, e.g. my_project.encoders:MyTaskEncoder or path/to/file.py:MyTaskEncoder (default: the default task encoder).")
@click.option("--seconds", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True, help="How long to measure, after the first batch.")
@click.option("--mock-seconds", type=click.FloatRange(min=0), default=None, help="How long to measure the mock ceiling (default: a quarter of --seconds, at least 1 s; 0: skip it).")
@click.option("--split-part", default="train", show_default=True, help="Split to read (as an endless training stream).")
@click.option("--shuffle-buffer-size", type=click.IntRange(min=1), default=None, help="Sample shuffle buffer, as get_train_dataset's.")
@click.option("--max-samples-per-sequence", type=click.IntRange(min=1), default=None, help="As get_train_dataset's.")
@click.option("--trust-dataset-code", is_flag=True, help="Allow dataset.yaml to run the dataset's sample_loader.py.")
@click.option("--plot", type=click.Path(dir_okay=False, writable=True), default=None, metavar="OUT.png", help="Write a PNG of batches/s per worker over time.")
@click.option("--no-progress", is_flag=True, help="Do not show the progress bar.")
def bench(
    path: AnyPath,
    batch_size: int,
    num_workers: int,
    task_encoder: str | None,
    seconds: float,
    mock_seconds: float | None,
    split_part: str,
    shuffle_buffer_size: int | None,
    max_samples_per_sequence: int | None,
    trust_dataset_code: bool,
    plot: str | None,
    no_progress: bool,
) -> None:
    """Measure the loader's throughput on DATASET_OR_YAML against its mock-data ceiling."""
    from ..loader import get_train_dataset  # on use only: loads torch, which the CLI's other commands never need
    from ..worker import WorkerConfig

    encoder = load_task_encoder(task_encoder)

    def dataset(mock: bool):
        return get_train_dataset(
            path,
            split_part=split_part,
            worker_config=WorkerConfig(rank=0, world_size=1, num_workers=num_workers),
            batch_size=batch_size,
            shuffle_buffer_size=shuffle_buffer_size,
            max_samples_per_sequence=max_samples_per_sequence,
            task_encoder=encoder,
            trust_dataset_code=trust_dataset_code,
            mock=mock,
        )

    built = time.perf_counter()
    real = dataset(False)
    built = time.perf_counter() - built
    click.echo(f"energon-lite bench: {path} (split {split_part}), batch size {batch_size}, {num_workers} workers, {type(encoder).__name__}")
    run = measure(real, seconds, progress=not no_progress, desc="loader", stall=True)
    batches_s, samples_s = run.per_s(run.batches), run.per_s(run.samples)
    click.echo(f"time to first batch: {run.first_batch_s:.2f} s (and {built:.2f} s before it to build the dataset)")
    click.echo(f"measured {run.seconds:.1f} s after it: {run.batches} batches, {run.samples if run.samples is not None else 'n/a'} samples")
    click.echo(f"  batches/s: {_rate(batches_s)}")
    click.echo(f"  samples/s: {_rate(samples_s)}" + ("" if samples_s is not None else " (batches have no first dimension to count samples by)"))
    if run.workers > 1 and run.seconds > 0:
        counts = [sum(1 for _, w, _ in run.events if w == worker) for worker in range(run.workers)]
        click.echo("  batches/s per worker: " + ", ".join(f"{w}: {n / run.seconds:,.1f}" for w, n in enumerate(counts)))
    if run.stall_summary is not None:
        click.echo(f"stall report: {run.stall_summary}")
        for line in stall_lines(run.stall or {}):
            click.echo(line)
    elif run.stall_error is not None:
        click.echo(f"stall report: failed ({run.stall_error})")
    if mock_seconds is None:
        mock_seconds = min(seconds, max(1.0, seconds / 4))
    if mock_seconds > 0:
        mock = measure(dataset(True), mock_seconds, progress=not no_progress, desc="mock ceiling", stall=False)
        mock_batches_s, mock_samples_s = mock.per_s(mock.batches), mock.per_s(mock.samples)
        click.echo(f"mock ceiling (mock=True, {mock.seconds:.1f} s): {_rate(mock_batches_s)} batches/s, {_rate(mock_samples_s)} samples/s")
        if batches_s is not None and mock_batches_s:
            click.echo(f"real / mock: {batches_s / mock_batches_s * 100:.1f}% of the ceiling")
    if plot is not None:
        bin_s = 0.5 if seconds >= 5 else _nice_step(seconds, 10)
        plot_throughput(run, plot, bin_s=bin_s, title=f"{Path(str(path)).name}: batches/s per worker (batch size {batch_size}, {num_workers} workers)")
        click.echo(f"plot: {plot} ({PLOT_SIZE[0]}x{PLOT_SIZE[1]})")
