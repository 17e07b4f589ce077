"""``energon-lite lint``: check indexes against counts, then decode every sample of each split.

A metadataset YAML is parsed and shown like ``info`` shows it, then every dataset it reads is
linted (the splits the YAML reads of it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import click
import numpy as np
from tqdm import tqdm

from ..decode import SampleDecoder
from ..errors import EmptyDatasetError, EnergonLiteError
from ..format.metadata import read_info, read_split_config
from ..format.metadataset import is_metadataset_path
from ..format.process_pool import scan_pool
from ..format.split_cache import SPLIT_CACHE, split_cache_problems
from ..format.tar_index import index_name, read_tar_index
from ..pipeline.load import SampleLoader
from ..storage import AnyPath, list_files
from .blend_tree import echo_trees, leaf_datasets, read_trees
from .params import DATASET_PATH, Command


@dataclass(frozen=True)
class Finding:
    """One problem: where it is and what is wrong.

    ``problem`` is the headline (findings with the same headline are one kind of problem and are
    shown together); ``detail`` holds the error's where/expected/found/fix lines.
    """

    where: str
    problem: str
    detail: tuple[str, ...] = ()

    @classmethod
    def of_error(cls, where: str, exc: BaseException) -> Finding:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
        return cls(where, lines[0], tuple(lines[1:]))

    def line(self) -> str:
        return " ".join((f"BAD {self.where}: {self.problem}", *self.detail))


#: Places listed per kind of problem without --verbose.
_SHOWN_PLACES = 3


def check_indexes(root: AnyPath) -> list[Finding]:
    """Every shard's ``.tar.idx`` exists, matches ``.info.json`` and fits inside its tar."""
    findings = []
    counts = read_info(root).shard_counts
    stats = list_files(root, [n for shard in counts for n in (shard, index_name(shard))])  # one listing per folder remotely
    for shard, count in counts.items():
        tar = root / shard
        if shard not in stats:
            findings.append(Finding(shard, "shard file is missing"))
            continue
        try:
            offsets = read_tar_index(tar, expected_samples=count, tar_size=stats[shard].size, index_stat=stats.get(index_name(shard)))
        except EnergonLiteError as exc:
            findings.append(Finding.of_error(shard, exc))
            continue
        if np.any(np.diff(offsets.astype(np.int64)) <= 0):
            findings.append(Finding(shard, ".tar.idx offsets are not strictly increasing (corrupt index)"))
        elif int(offsets[-1]) > stats[shard].size:
            findings.append(Finding(shard, f".tar.idx ends at byte {int(offsets[-1])} but the tar has {stats[shard].size} bytes (truncated tar)"))
    return findings


def check_split_cache(root: AnyPath, split_config: str | None) -> list[Finding]:
    """The split cache (``.nv-meta/.lite-split-cache.json``) says what the files say, where the
    loader would read it (the loader ignores one that does not, with a warning)."""
    return [
        Finding(f"{SPLIT_CACHE} split {split}", f"{problem}; the loader ignores the cache (run `energon-lite prepare` to rewrite it)")
        for split, problem in split_cache_problems(root, split_config)
    ]


# Decodes every image fully, to numpy: the same Pillow work as the loader without importing torch.
_LINT_DECODER = SampleDecoder(image_decode="rgb8", untrusted_pickle="bytes")


@dataclass(frozen=True)
class _Job:
    root: AnyPath
    split: str
    start: int
    end: int
    dataset_config: str | None
    split_config: str | None
    trust: bool


def _decode_range(job: _Job) -> tuple[int, list[Finding]]:
    """Decodes samples ``[start, end)`` of a split; one finding per bad sample."""
    loader = SampleLoader(job.root, job.split, dataset_config=job.dataset_config, split_config=job.split_config, decoder=_LINT_DECODER, trust_dataset_code=job.trust)
    findings = []
    try:
        for index in range(job.start, job.end):
            try:
                loader.load(index)
            except EnergonLiteError as exc:
                if loader.reader is None:  # a .jsonl file: one split, records by line
                    where = f"record #{index}"
                else:
                    shard, local = loader.reader.locate(index)
                    where = f"split {job.split}, {loader.reader.split.shards[shard].name} sample #{local}"
                findings.append(Finding.of_error(where, exc))
    finally:
        loader.close()
    return job.end - job.start, findings


def check_samples(root: AnyPath, split: str, *, parallel: int, progress: bool, dataset_config: str | None, split_config: str | None, trust: bool) -> list[Finding]:
    loader = SampleLoader(root, split, dataset_config=dataset_config, split_config=split_config, trust_dataset_code=trust)
    total = len(loader)
    loader.close()
    step = max(1, min(1000, -(-total // max(1, parallel * 4))))
    jobs = [_Job(root, split, s, min(total, s + step), dataset_config, split_config, trust) for s in range(0, total, step)]
    findings: list[Finding] = []
    with tqdm(total=total, desc=f"Decoding {split}", unit="sample", disable=not progress) as bar:
        pool = scan_pool(parallel) if parallel > 1 else None
        try:
            for done, found in pool.map(_decode_range, jobs) if pool is not None else map(_decode_range, jobs):
                findings += found
                bar.update(done)
        finally:
            if pool is not None:
                pool.shutdown(cancel_futures=True)
    return findings


def lint_dataset(path: AnyPath, splits: list[str] | None, *, parallel: int, progress: bool, dataset_config: str | None, split_config: str | None, trust: bool) -> tuple[list[Finding], int]:
    """Index checks, then decoding of ``splits`` (default: all); returns the findings and the splits decoded."""
    jsonl = path.suffix == ".jsonl" and path.is_file()
    findings = [] if jsonl else check_indexes(path) + check_split_cache(path, split_config)
    if jsonl:
        splits = splits[:1] if splits else ["train"]  # a JSONL file is one split, whatever its name
    elif not splits:
        splits = list(read_split_config(path, split_config).split_parts)
    checked = 0
    if not findings:  # decoding against broken indexes would only repeat the index findings
        for split in splits:
            try:
                split_findings = check_samples(path, split, parallel=parallel, progress=progress, dataset_config=dataset_config, split_config=split_config, trust=trust)
            except EmptyDatasetError:
                click.echo(f"{path}: split {split} is empty; nothing to decode")
                continue
            except EnergonLiteError as exc:
                findings.append(Finding.of_error(f"split {split}", exc))
                continue
            findings += split_findings
            checked += 1
    return findings, checked


def _echo_findings(path: AnyPath | str, findings: list[Finding], *, verbose: bool) -> None:
    """Every finding on its own line with ``verbose``; else one block per kind of problem: how
    many, the first places, and the first one's details (where, expected, found, fix)."""
    if verbose:
        for finding in findings:
            click.echo(finding.line(), err=True)
    else:
        kinds: dict[str, list[Finding]] = {}
        for finding in findings:
            kinds.setdefault(finding.problem, []).append(finding)
        for problem, same in kinds.items():
            places = "; ".join(f.where for f in same[:_SHOWN_PLACES]) + ("; ..." if len(same) > _SHOWN_PLACES else "")
            click.echo(f"BAD ({len(same)}x) {problem}", err=True)
            click.echo(f"  at: {places}", err=True)
            for line in same[0].detail:
                click.echo(f"  {line}", err=True)
        if any(len(same) > _SHOWN_PLACES for same in kinds.values()):
            click.echo("(lint --verbose lists every place)", err=True)
    click.echo(f"{len(findings)} problem(s) found in {path}", err=True)


def _lint_metadataset(path: AnyPath, splits: list[str] | None, *, parallel: int, progress: bool, trust: bool, verbose: bool) -> None:
    trees = read_trees(path, splits)  # a bad YAML raises: the CLI prints it and exits with 1
    problems = echo_trees(path, trees)
    for (root, dataset_config, split_config), parts in leaf_datasets(trees).items():
        findings, checked = lint_dataset(Path(root), parts, parallel=parallel, progress=progress, dataset_config=dataset_config, split_config=split_config, trust=trust)
        if findings:
            _echo_findings(root, findings, verbose=verbose)
            problems += len(findings)
        else:
            click.echo(f"OK: {root}, {checked} split(s) decoded ({', '.join(parts)})")
    if problems:
        click.echo(f"{problems} problem(s) found in {path} and its datasets", err=True)
        raise SystemExit(1)
    click.echo(f"OK: {path}, no problems found")


@click.command(cls=Command)
@click.argument("path", type=DATASET_PATH)
@click.option("--split-parts", default=None, help="Comma-separated splits to decode (default: all in split.yaml, or all of the metadataset's).")
@click.option("--dataset-config", default=None, help="Dataset file in .nv-meta/ (default dataset.yaml).")
@click.option("--split-config", default=None, help="Split file in .nv-meta/ (default split.yaml).")
@click.option("--parallel", type=click.IntRange(min=1), default=1, show_default=True, help="Processes that decode in parallel.")
@click.option("--progress/--no-progress", default=True)
@click.option("--trust-dataset-code", is_flag=True, help="Allow dataset.yaml to run the dataset's sample_loader.py.")
@click.option("--verbose", is_flag=True, help="List every bad shard and sample on its own line (default: one block per kind of problem).")
def lint(path: AnyPath, split_parts: str | None, dataset_config: str | None, split_config: str | None, parallel: int, progress: bool, trust_dataset_code: bool, verbose: bool) -> None:
    """Check the dataset at PATH: indexes vs counts, then decode every sample.

    For a metadataset YAML: check the YAML, show its blends, then lint every dataset it reads.
    Exits with status 1 and lists each bad shard or sample when anything is wrong.
    """
    splits = split_parts.split(",") if split_parts else None
    if is_metadataset_path(path):
        if split_config or dataset_config:
            raise click.UsageError("--split-config and --dataset-config apply to a dataset folder; a metadataset sets them per entry")
        _lint_metadataset(path, splits, parallel=parallel, progress=progress, trust=trust_dataset_code, verbose=verbose)
        return
    findings, checked = lint_dataset(path, splits, parallel=parallel, progress=progress, dataset_config=dataset_config, split_config=split_config, trust=trust_dataset_code)
    if findings:
        _echo_findings(path, findings, verbose=verbose)
        raise SystemExit(1)
    click.echo(f"OK: {path}, {checked} split(s) decoded, no problems found")
