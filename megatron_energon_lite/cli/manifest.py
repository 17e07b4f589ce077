"""``energon-lite manifest``: read the per-step data manifest a loader wrote (``manifest.py``).

``show DIR --step N [--rank R]`` lists the samples of step N on every rank (or rank R);
``stats DIR`` prints each dataset's share over windows of steps, samples seen twice within an
epoch of their dataset, and each dataset's coverage; ``--plot FILE`` draws the shares as a PNG
(needs matplotlib).  Torn or damaged file tails are reported on stderr; the valid part is read.
"""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import EnergonLiteError
from ..format.split_reader import SplitReader
from ..format.weight_schedule import target_shares
from ..manifest import ManifestSample, ManifestStep, RankFile, manifest_problems, read_manifest, read_rank_files, read_run
from ..preview.collect import collect_indexed
from ..preview.html import write_html
from ..storage import as_path
from .params import Command
from .share_plot import Shares, plot_shares

_FOLDER = click.Path(exists=True, file_okay=False, path_type=Path)


def _read(folder: Path) -> tuple[list[RankFile], list[ManifestStep]]:
    """The folder's files and steps; torn or damaged tails are reported on stderr."""
    files = read_rank_files(folder)
    for problem in manifest_problems(files):
        click.echo(f"warning: {problem}", err=True)
    return files, list(read_manifest(folder, files=files))


class SampleKeys:
    """Looks up the ``__key__`` of listed samples in their shards (prepared WebDataset folders),
    reading each sample's bytes by its position, checked against the shard the manifest names."""

    def __init__(self) -> None:
        self._readers: dict[tuple[str, str], SplitReader | str] = {}

    def key(self, sample: ManifestSample) -> str:
        if sample.shard is None or sample.split_index is None:
            return "?"
        reader = self._readers.get((sample.dataset_path, sample.split_part))
        if reader is None:
            try:
                reader = SplitReader(sample.dataset_path, sample.split_part)
            except EnergonLiteError as exc:  # a JSONL file, a token dataset, a folder now gone
                reader = f"? ({str(exc).splitlines()[0]})"
            self._readers[(sample.dataset_path, sample.split_part)] = reader
        if isinstance(reader, str):
            return reader
        shard, _ = reader.locate(sample.split_index) if sample.split_index < len(reader) else (None, None)
        if shard is None or reader.split.names[shard] != sample.shard:
            return "? (the dataset's shards changed since the run)"
        try:
            raw = reader.read(sample.split_index, check_key=True)
        except EnergonLiteError as exc:
            return f"? ({str(exc).splitlines()[0]})"
        return "? (excluded by the split)" if raw is None else raw.key


@click.command(cls=Command, name="show")
@click.argument("folder", type=_FOLDER)
@click.option("--step", "step_number", type=click.IntRange(min=0), required=True, help="The step (the rank's batch count, from 0).")
@click.option("--rank", type=click.IntRange(min=0), default=None, help="Only this rank.")
@click.option("--keys/--no-keys", default=True, show_default=True, help="Read each sample's __key__ from its shard (the datasets must be readable here).")
@click.option("--html", "html_path", default=None, metavar="OUT.html", help="Write the step's samples to one self-contained HTML page (the preview's renderer) instead of listing them.")
def show(folder: Path, step_number: int, rank: int | None, keys: bool, html_path: str | None) -> None:
    """The samples of step N on every rank: dataset, shard, index in the shard, sample key and restore key."""
    problems: list[str] = []
    step, first, last = None, None, None
    for found in read_manifest(folder, problems=problems):  # step by step: the rest is not held
        first = found.step if first is None else first
        last = found.step
        if found.step == step_number:
            step = found  # read on all the same, to report damage further on
    for problem in problems:
        click.echo(f"warning: {problem}", err=True)
    if step is None or (rank is not None and rank not in step.batches):
        known = f"steps {first}..{last}" if first is not None else "no steps"
        raise click.ClickException(f"{folder} has no step {step_number}{'' if rank is None else f' on rank {rank}'} (it holds {known})")
    if html_path is not None:
        groups = [
            (f"step {step.step} rank {r}: batch key {key[:4]}", [(s.dataset_path, s.split_part, s.split_index) for s in samples])
            for r, (key, samples) in sorted(step.batches.items())
            if rank is None or r == rank
        ]
        count = write_html(as_path(html_path), collect_indexed(groups), title=f"{folder} step {step.step}")
        click.echo(f"Wrote {count} samples to {html_path}")
        return
    lookup = SampleKeys() if keys else None
    for r, (key, samples) in sorted(step.batches.items()):
        if rank is not None and r != rank:
            continue
        click.echo(f"step {step.step} rank {r}: {len(samples)} sample(s), batch key {key[:4]}")
        for sample in samples:
            where = f"{sample.shard} #{sample.index_in_shard}" if sample.shard is not None else "(not one sample)"
            name = f"  __key__ {lookup.key(sample)}" if lookup is not None else ""
            click.echo(f"  dataset {sample.dataset} {sample.dataset_path} [{sample.split_part}]  {where}{name}  restore key {sample.restore_key}")


def share_windows(steps: list[ManifestStep], window: int) -> tuple[list[str], list[tuple[int, list[float]]]]:
    """Dataset names and, per window of ``window`` steps (its first step), each dataset's share."""
    names: dict[int, str] = {}
    rows: list[tuple[int, list[int]]] = []
    for step in steps:
        first = step.step - step.step % window
        if not rows or rows[-1][0] != first:
            rows.append((first, []))
        counts = rows[-1][1]
        for sample in step.samples():
            names.setdefault(sample.dataset, sample.dataset_path)
            counts.extend([0] * (sample.dataset + 1 - len(counts)))
            counts[sample.dataset] += 1
    order = [names.get(k, f"dataset {k}") for k in range(max(names, default=-1) + 1)]
    shares = [(first, [c / sum(counts) if sum(counts) else 0.0 for c in counts + [0] * (len(order) - len(counts))]) for first, counts in rows]
    return order, shares


def repeats_and_coverage(steps: list[ManifestStep], shuffle_buffer: int = 0) -> tuple[list[tuple[int, int, int]], dict[int, int]]:
    """``(step, dataset, split index)`` of each sample seen again within an epoch, and the
    distinct samples seen per dataset.  Each worker of each rank goes through its own slice of
    each dataset epoch by epoch, so epochs are counted per (rank, worker, dataset) stream: an
    epoch ends when the stream has delivered every sample it delivers in the whole manifest.
    A shuffle buffer of ``shuffle_buffer`` samples lets the next epoch begin while up to that
    many samples of the last one wait in it: those may come late without counting."""
    streams: dict[tuple[int, int, int], list[tuple[int, int]]] = {}
    for step in steps:
        for rank, (key, samples) in step.batches.items():
            worker = key[1] if len(key) > 1 and key[0] == "Worker" and isinstance(key[1], int) else 0
            for sample in samples:
                if sample.split_index is not None:
                    streams.setdefault((rank, worker, sample.dataset), []).append((step.step, sample.split_index))
    repeats = []
    seen: dict[int, set[int]] = {}
    for (_, _, dataset), delivered in streams.items():
        whole = {index for _, index in delivered}
        seen.setdefault(dataset, set()).update(whole)
        epoch: set[int] = set()
        late: set[int] = set()  # the last epoch's samples still in the shuffle buffer
        for step_number, index in delivered:
            if index in late:
                late.discard(index)
                continue
            if index in epoch:
                if len(whole) - len(epoch) > shuffle_buffer:
                    repeats.append((step_number, dataset, index))
                else:  # the next epoch began while the buffer held the rest of this one
                    late, epoch = whole - epoch, set()
            epoch.add(index)
            if len(epoch) == len(whole):
                epoch.clear()
                late.clear()
    return sorted(repeats), {k: len(v) for k, v in seen.items()}


@click.command(cls=Command, name="stats")
@click.argument("folder", type=_FOLDER)
@click.option("--window", type=click.IntRange(min=1), default=100, show_default=True, help="Steps per window of the shares.")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Write the shares per window as a PNG (needs matplotlib).")
def stats(folder: Path, window: int, plot: Path | None) -> None:
    """Each dataset's share over windows of steps, samples seen twice within an epoch, coverage."""
    files, steps = _read(folder)
    totals: dict[int, int] = {}
    paths: dict[int, str] = {}
    for rank_file in files:
        for k, table in enumerate(rank_file.header.get("datasets") or []):
            totals[k] = sum(table["counts"])
            paths[k] = f"{table['path']} [{table['split_part']}]"
    ranks = sorted({r for s in steps for r in s.batches})
    click.echo(f"{folder}: {len(steps)} step(s) on {len(ranks)} rank(s), {sum(len(s.samples()) for s in steps)} sample(s)")
    names, shares = share_windows(steps, window)
    targets = window_targets(read_run(folder).get("config", {}), files, [first for first, _ in shares], window)
    click.echo(f"shares per window of {window} steps" + (" (target in brackets: the blend's mean target share over the window)" if targets else "") + ":")
    click.echo("  first step  " + "  ".join(f"ds{k:<{15 if targets else 5}}" for k in range(len(names))))
    for i, (first, row) in enumerate(shares):
        cells = [f"{share:7.3f}" + (f" ({targets[i][1][k]:.3f})" if targets and k < len(targets[i][1]) else "") for k, share in enumerate(row)]
        click.echo(f"  {first:>10}  " + "  ".join(cells))
    repeats, seen = repeats_and_coverage(steps, read_run(folder).get("config", {}).get("shuffle_buffer_size") or 0)
    click.echo("coverage:")
    for k in sorted(set(paths) | set(seen)):
        total = totals.get(k)
        click.echo(f"  ds{k} {paths.get(k, names[k] if k < len(names) else '?')}: {seen.get(k, 0)} of {total if total is not None else '?'} samples seen" + (f" ({seen.get(k, 0) / total:.1%})" if total else ""))
    click.echo(f"samples seen more than once within an epoch: {len(repeats)}")
    for step, dataset, index in repeats[:20]:
        click.echo(f"  step {step}: ds{dataset} split index {index}")
    if plot is not None:
        plot_shares(plot, names, realized=shares, target=targets or None, xlabel="step (first of each window)", title=f"{folder.name}: realized share per window of {window} steps")


def window_targets(config: dict, files: list[RankFile], firsts: list[int], window: int) -> Shares:
    """Per window of steps, each dataset's mean target share over the blend clocks it covers
    (a step of every rank takes ``ranks x batch size`` global samples); empty when the run's
    configuration has no weighted blend or the ranks' count is unknown."""
    datasets = config.get("datasets") or []
    ranks = {rank_file.header.get("world_size") for rank_file in files}
    if config.get("blend_kind") != "blend" or len(datasets) < 2 or len(ranks) != 1 or not isinstance(next(iter(ranks)), int):
        return []
    per_step = next(iter(ranks)) * (config.get("batch_size") or 1)
    targets = target_shares(datasets)
    return [(first, targets.mean(first * per_step, (first + window) * per_step)) for first in firsts]


@click.group(name="manifest", context_settings={"help_option_names": ["-h", "--help"]}, invoke_without_command=True)
@click.pass_context
def manifest(ctx: click.Context) -> None:
    """Read the per-step data manifest of a run: the samples of a step on every rank, and the realized blend."""
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())


manifest.add_command(show)
manifest.add_command(stats)
