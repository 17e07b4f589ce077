"""``energon-lite prepare`` under torchrun (gloo): the ranks share the indexing, rank 0 merges,
and the dataset is what a single process writes."""

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from energon_lite_dev.prepared import prepared_content
from energon_lite_dev.synthetic import write_tar
from torchrun_helpers import torchrun

from megatron_energon_lite.cli.main import cli
from megatron_energon_lite.format.prepare import shares_by_size
from megatron_energon_lite.format.prepare.nodes import PARTS_DIR

#: Samples per shard, uneven so that shares by bytes are not shares by count.
SIZES = [12, 3, 1, 7, 2, 9, 4, 4, 1, 6, 2, 5]
FLAGS = [
    "--split-ratio", "8,3,1", "--sample-type", "TextSample", "--field-map", '{"text": "txt"}',
    "--no-progress", "--num-workers", "1", "--media-metadata-by-glob", "*.json",
]


def _dataset(root: Path) -> Path:
    for shard, count in enumerate(SIZES):
        samples = [(f"s{shard}_{i:04d}", {"txt": f"text {shard} {i}".encode(), "json": b"{}"}) for i in range(count)]
        write_tar(root / f"part{shard % 3}/shard_{shard:02d}.tar", samples)
    return root


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> Path:
    """The dataset as one process prepares it."""
    root = _dataset(tmp_path_factory.mktemp("single") / "d")
    run = CliRunner().invoke(cli, ["prepare", str(root), "--non-interactive", *FLAGS], catch_exceptions=False)
    assert run.exit_code == 0, run.output
    return root


def _torchrun_prepare(root: Path, ranks: int, *extra: str):
    # "-m": torchrun runs the CLI module on every rank.
    return torchrun("-m", ["megatron_energon_lite.cli.main", "prepare", str(root), *FLAGS, *extra], ranks=ranks)


@pytest.mark.parametrize("ranks", [2, 4])
def test_ranks_write_what_one_process_writes(tmp_path: Path, single: Path, ranks: int) -> None:
    root = tmp_path / "d"
    shutil.copytree(single, root, ignore=shutil.ignore_patterns(".nv-meta", "*.idx"))
    run = _torchrun_prepare(root, ranks)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"Rank {ranks - 1} of {ranks}: indexed its share" in run.stdout
    assert prepared_content(root) == prepared_content(single)
    assert not (root / ".nv-meta" / PARTS_DIR).exists()


def test_a_failing_rank_stops_the_merge_and_a_rerun_resumes(tmp_path: Path, single: Path) -> None:
    root = tmp_path / "d"
    shutil.copytree(single, root, ignore=shutil.ignore_patterns(".nv-meta", "*.idx"))
    sizes = {p.relative_to(root).as_posix(): p.stat().st_size for p in root.rglob("*.tar")}
    names = sorted(sizes, key=lambda name: Path(name).parts)
    bad = shares_by_size(names, sizes, 2)[1][-1]  # rank 1 indexes its other shards first
    good = (root / bad).read_bytes()
    half = len(good) // 1024 * 512
    (root / bad).write_bytes(good[:half] + b"\x07" * (len(good) - half))  # garbage headers, same size
    failed = _torchrun_prepare(root, 2)
    assert failed.returncode != 0
    assert bad in failed.stderr and "prepare failed on rank(s) 1; nothing was merged" in failed.stderr
    assert not (root / ".nv-meta/index.sqlite").exists() and not (root / ".nv-meta/.info.json").exists()
    parts = list((root / ".nv-meta" / PARTS_DIR).glob("*.json"))
    assert len(parts) == len(SIZES) - 1  # kept for the re-run: every shard but the bad one
    (root / bad).write_bytes(good)
    again = _torchrun_prepare(root, 2)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert prepared_content(root) == prepared_content(single)
