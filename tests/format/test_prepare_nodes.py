"""``prepare`` across ranks with explicit ranks (``--rank``/``--world-size``): the ranks meet
through the dataset folder.  The torchrun runs are in tests/distributed/test_prepare_ranks.py."""

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from energon_lite_dev.prepared import prepared_content
from energon_lite_dev.synthetic import write_tar
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from megatron_energon_lite.cli.main import cli
from megatron_energon_lite.errors import DatasetError
from megatron_energon_lite.format.media_metadata import MediaFilter
from megatron_energon_lite.format.prepare import FileRanks, PrepareResult, prepare_across_ranks, prepare_dataset, shares_by_size
from megatron_energon_lite.format.prepare.nodes import PARTS_DIR

from conftest import text_samples

#: Samples per shard: uneven, so that the shares by bytes differ from shares by count.
SIZES = [9, 2, 2, 6, 1, 4, 3, 8, 2]
OPTIONS = dict(split_ratio=(6, 2, 1), num_workers=1, progress=False)


def _png(width: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, 3), (9, 99, 199)).save(out, format="PNG")
    return out.getvalue()


def _dataset(root: Path) -> Path:
    """Text samples with a small PNG each (media metadata to extract)."""
    for shard, count in enumerate(SIZES):
        folder = "a" if shard < 5 else "b"
        samples = [(key, {**parts, "png": _png(1 + shard)}) for key, parts in text_samples(f"{folder}{shard}_", count)]
        write_tar(root / f"{folder}/s{shard:02d}.tar", samples)
    return root


def _copies(tmp_path: Path) -> tuple[Path, Path]:
    single = _dataset(tmp_path / "single")
    ranked = tmp_path / "ranked"
    shutil.copytree(single, ranked)
    return single, ranked


def _parts(root: Path) -> dict[str, int]:
    folder = root / ".nv-meta" / PARTS_DIR
    return {p.name: p.stat().st_mtime_ns for p in folder.glob("*.json") if not p.name.startswith("failed-")}


def _shares(root: Path, world_size: int) -> list[list[str]]:
    """Each rank's shards in a first prepare of ``root`` (by the shards' sizes now)."""
    sizes = {p.relative_to(root).as_posix(): p.stat().st_size for p in root.rglob("*.tar")}
    return shares_by_size(sorted(sizes), sizes, world_size)


def _run_ranks(root: Path, world_size: int, *, timeout: float = 30, **options) -> PrepareResult:
    """Ranks 1.. first (each writes its parts and returns), then rank 0 (its share, the merge)."""
    for rank in range(1, world_size):
        assert prepare_across_ranks(root, FileRanks(rank, world_size, timeout), **{**OPTIONS, **options}) is None
    return prepare_across_ranks(root, FileRanks(0, world_size, timeout), **{**OPTIONS, **options})


@given(sizes=st.lists(st.integers(0, 1000), max_size=40), world_size=st.integers(1, 6))
def test_shares_by_size_cover_every_shard_once_and_balance_bytes(sizes, world_size) -> None:
    names = [f"s{i:03d}.tar" for i in range(len(sizes))]
    by_name = dict(zip(names, sizes))
    shares = shares_by_size(names, by_name, world_size)
    assert len(shares) == world_size
    assert sorted(n for share in shares for n in share) == names
    for share in shares:
        assert share == sorted(share)  # each share in the dataset's order
    loads = [sum(by_name[n] for n in share) for share in shares]
    assert max(loads) <= sum(sizes) / world_size + max(sizes, default=0)


def test_shares_follow_bytes_not_counts() -> None:
    assert shares_by_size(["big", "a", "b", "c"], {"big": 30, "a": 10, "b": 10, "c": 10}, 2) == [["big"], ["a", "b", "c"]]


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_write_what_one_process_writes(tmp_path: Path, world_size: int) -> None:
    single, ranked = _copies(tmp_path)
    expected = prepare_dataset(single, **OPTIONS)
    result = _run_ranks(ranked, world_size)
    assert result.shard_counts == expected.shard_counts and result.splits == expected.splits
    assert sorted(result.scanned) == sorted(expected.scanned) and not result.reused
    assert prepared_content(ranked) == prepared_content(single)
    assert not (ranked / ".nv-meta" / PARTS_DIR).exists()  # removed once merged


def test_media_metadata_and_incremental_rerun_match_one_process(tmp_path: Path) -> None:
    single, ranked = _copies(tmp_path)
    media = MediaFilter.from_options(glob="*.png", header=False, extension=False)
    prepare_dataset(single, media_filter=media, **OPTIONS)
    _run_ranks(ranked, 2, media_filter=media)
    content = prepared_content(ranked)
    assert len(content["tables"]["media_metadata"]) == sum(SIZES)
    assert content == prepared_content(single)
    for root in (single, ranked):  # one shard changes: only it is scanned again, on its rank
        write_tar(root / "b/s07.tar", text_samples("b7_", 5))
    expected = prepare_dataset(single, force_overwrite=True, **OPTIONS)
    result = _run_ranks(ranked, 2, force_overwrite=True)
    assert result.scanned == expected.scanned == ["b/s07.tar"]
    assert prepared_content(ranked) == prepared_content(single)


def test_the_merge_reads_the_parts_instead_of_scanning(tmp_path: Path) -> None:
    root = _dataset(tmp_path / "d")
    prepare_across_ranks(root, FileRanks(1, 2, 30), **OPTIONS)
    shares = _shares(root, 2)
    # Garbage of the same size and mtime: the part of rank 1 still stands for it, a scan would fail.
    shard = root / shares[1][0]
    stat = shard.stat()
    shard.write_bytes(b"\x07" * stat.st_size)
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    result = prepare_across_ranks(root, FileRanks(0, 2, 30), **OPTIONS)
    assert result.shard_counts[shares[1][0]] == SIZES[int(shard.stem[1:])]


def test_rank0_merges_the_parts_there_are_while_a_rank_is_still_out(tmp_path: Path) -> None:
    """Rank 0 does not wait for every rank before it merges: with rank 1 not started, it has
    indexed its share and begun the merge (its scratch index exists), yet installed nothing;
    once rank 1 has run, the merge ends with what one process writes."""
    single, ranked = _copies(tmp_path)
    prepare_dataset(single, **OPTIONS)
    outcome: list = []
    rank0 = threading.Thread(target=lambda: outcome.append(prepare_across_ranks(ranked, FileRanks(0, 2, 120), **OPTIONS)))
    rank0.start()
    try:
        meta = ranked / ".nv-meta"

        def merging() -> list[str]:
            return [p.name for p in meta.glob("*") if p.name != PARTS_DIR]

        deadline = time.monotonic() + 60
        while not merging() and rank0.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        started = merging()
        assert started and all(name.startswith(".") and "index.sqlite" in name for name in started), started
        assert not (meta / "index.sqlite").exists() and not (meta / ".info.json").exists()
    finally:
        assert prepare_across_ranks(ranked, FileRanks(1, 2, 30), **OPTIONS) is None
        rank0.join()
    assert outcome and prepared_content(ranked) == prepared_content(single)


def test_rank0_gives_up_after_the_timeout_naming_the_missing_ranks(tmp_path: Path) -> None:
    root = _dataset(tmp_path / "d")
    with pytest.raises(DatasetError) as info:
        prepare_across_ranks(root, FileRanks(0, 3, 0.0), **OPTIONS)
    message = str(info.value)
    assert "rank 1:" in message and "rank 2:" in message and "nothing was merged" in message
    assert not (root / ".nv-meta/index.sqlite").exists() and not (root / ".nv-meta/.info.json").exists()
    # Rank 0's own share is kept: it is not scanned again when the others have run.
    kept = _parts(root)
    assert kept
    _run_ranks(root, 3)
    assert (root / ".nv-meta/.info.json").exists()


def test_a_corrupt_shard_fails_its_rank_and_rank0_merges_nothing_then_resumes(tmp_path: Path) -> None:
    single, ranked = _copies(tmp_path)
    shares = _shares(ranked, 2)
    bad = shares[1][-1]
    good = (ranked / bad).read_bytes()
    half = len(good) // 1024 * 512
    (ranked / bad).write_bytes(good[:half] + b"\x07" * (len(good) - half))  # garbage headers, same size
    with pytest.raises(DatasetError) as failed:
        prepare_across_ranks(ranked, FileRanks(1, 2, 30), **OPTIONS)
    assert bad in str(failed.value) and "rank(s) 1" in str(failed.value)
    written = _parts(ranked)
    assert len(written) == len(shares[1]) - 1  # every other shard of its share
    with pytest.raises(DatasetError) as merged:  # at once, not after the timeout
        prepare_across_ranks(ranked, FileRanks(0, 2, 600), **OPTIONS)
    assert bad in str(merged.value) and "rank(s) 1" in str(merged.value)
    assert not (ranked / ".nv-meta/index.sqlite").exists()
    # The shard is fixed; rank 1 scans only it again, and the merge is a single process's result.
    (ranked / bad).write_bytes(good)
    os.utime(ranked / bad, ns=(0, 10**18))
    os.utime(single / bad, ns=(0, 10**18))
    assert prepare_across_ranks(ranked, FileRanks(1, 2, 30), **OPTIONS) is None
    again = _parts(ranked)
    assert {name: again[name] for name in written} == written and len(again) == len(written) + len(shares[0]) + 1
    prepare_across_ranks(ranked, FileRanks(0, 2, 30), **OPTIONS)
    prepare_dataset(single, **OPTIONS)
    assert prepared_content(ranked) == prepared_content(single)


def test_a_part_of_a_changed_tar_is_not_used(tmp_path: Path) -> None:
    single, ranked = _copies(tmp_path)
    prepare_across_ranks(ranked, FileRanks(1, 2, 30), **OPTIONS)
    for root in (single, ranked):  # changed after rank 1 ran (whichever rank had it)
        write_tar(root / "a/s00.tar", text_samples("a0_", 4))
    _run_ranks(ranked, 2)
    prepare_dataset(single, **OPTIONS)
    assert prepared_content(ranked) == prepared_content(single)


def _cli(*args: str):
    return CliRunner().invoke(cli, ["prepare", *args], catch_exceptions=False)


def test_cli_with_rank_and_world_size(tmp_path: Path) -> None:
    single, ranked = _copies(tmp_path)
    flags = ["--split-ratio", "6,2,1", "--sample-type", "TextSample", "--field-map", '{"text": "txt"}', "--no-progress", "--num-workers", "1"]
    assert _cli(str(single), "--non-interactive", *flags).exit_code == 0
    first = _cli(str(ranked), "--rank", "1", "--world-size", "2", *flags)
    assert first.exit_code == 0 and "Rank 1 of 2" in first.output
    assert not (ranked / ".nv-meta/dataset.yaml").exists()
    last = _cli(str(ranked), "--rank", "0", "--world-size", "2", *flags)
    assert last.exit_code == 0, last.output
    assert prepared_content(ranked) == prepared_content(single)


def test_cli_across_ranks_asks_nothing_and_names_the_flags(tmp_path: Path) -> None:
    root = _dataset(tmp_path / "d")
    run = _cli(str(root), "--rank", "0", "--world-size", "2")
    assert run.exit_code == 1
    assert "asks no questions" in run.output and "--split-ratio" in run.output and "--field-map" in run.output
    beyond = _cli(str(root), "--rank", "2", "--world-size", "2", "--split-ratio", "1,0,0")
    assert beyond.exit_code == 1 and "not below --world-size 2" in beyond.output
    alone = _cli(str(root), "--rank", "1", "--split-ratio", "1,0,0")
    assert alone.exit_code == 2 and "--rank and --world-size go together" in alone.output
    assert not (root / ".nv-meta").exists()


def test_cli_world_size_one_prepares_alone_under_a_torchrun_environment(tmp_path: Path, monkeypatch) -> None:
    single, alone = _copies(tmp_path)
    flags = ["--non-interactive", "--split-ratio", "6,2,1", "--skip-dataset-yaml", "--no-progress", "--num-workers", "1"]
    assert _cli(str(single), *flags).exit_code == 0
    # A rank of a training job: without --world-size 1 this would join (and wait for) its group.
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    run = _cli(str(alone), *flags, "--rank", "0", "--world-size", "1")
    assert run.exit_code == 0, run.output
    assert prepared_content(alone) == prepared_content(single)


def test_a_rank_killed_midway_resumes_its_share(tmp_path: Path) -> None:
    single, ranked = _copies(tmp_path)
    assert prepare_across_ranks(ranked, FileRanks(1, 2, 30), **OPTIONS) is None
    # What a kill leaves: some parts written (each whole, written atomically), the rest not.
    written = _parts(ranked)
    lost = sorted(written)[: len(written) // 2]
    for name in lost:
        (ranked / ".nv-meta" / PARTS_DIR / name).unlink()
    with pytest.raises(DatasetError) as waited:
        prepare_across_ranks(ranked, FileRanks(0, 2, 0.0), **OPTIONS)
    assert f"rank 1: {len(lost)} shard(s) not indexed" in str(waited.value)
    assert "rank 0:" not in str(waited.value)
    assert prepare_across_ranks(ranked, FileRanks(1, 2, 30), **OPTIONS) is None
    again = _parts(ranked)
    assert all(again[name] == stamp for name, stamp in written.items() if name not in lost)  # not scanned again
    assert set(written) <= set(again)  # the lost ones written again
    prepare_across_ranks(ranked, FileRanks(0, 2, 30), **OPTIONS)
    prepare_dataset(single, **OPTIONS)
    assert prepared_content(ranked) == prepared_content(single)


#: A rank that stalls after its first part file, to be killed by a signal there (a real
#: process and a real SIGKILL; the stall only makes "mid-prepare" a fixed point).
_STALLING_RANK = """
import sys, time
from megatron_energon_lite.cli.main import cli
from megatron_energon_lite.format.prepare import nodes
scan = nodes._part_task
def scan_then_stall(job):
    scan(job)
    time.sleep(600)
nodes._part_task = scan_then_stall
cli(sys.argv[1:])
"""


def test_a_rank_killed_by_a_signal_leaves_nothing_merged_and_a_rerun_reuses_its_parts(tmp_path: Path) -> None:
    single, ranked = _copies(tmp_path)
    flags = ["--split-ratio", "6,2,1", "--sample-type", "TextSample", "--field-map", '{"text": "txt"}', "--no-progress", "--num-workers", "1"]
    assert _cli(str(single), "--non-interactive", *flags).exit_code == 0
    share = _shares(ranked, 2)[1]
    assert len(share) >= 2
    script = tmp_path / "stalling_rank.py"
    script.write_text(_STALLING_RANK)
    rank1 = subprocess.Popen([sys.executable, str(script), "prepare", str(ranked), "--rank", "1", "--world-size", "2", *flags])
    try:
        deadline = time.monotonic() + 120
        while not _parts(ranked) and rank1.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        written = _parts(ranked)
        assert len(written) == 1, (written, rank1.poll())
    finally:
        rank1.send_signal(signal.SIGKILL)
        rank1.wait()
    assert rank1.returncode == -signal.SIGKILL
    # rank 0 gives up on the dead rank: nothing merged, no metadata half-written
    with pytest.raises(DatasetError) as waited:
        prepare_across_ranks(ranked, FileRanks(0, 2, 0.0), **OPTIONS)
    assert f"rank 1: {len(share) - 1} shard(s) not indexed" in str(waited.value) and "nothing was merged" in str(waited.value)
    assert sorted(p.name for p in (ranked / ".nv-meta").iterdir()) == [PARTS_DIR]
    for part in (ranked / ".nv-meta" / PARTS_DIR).iterdir():  # only whole part files (rank 0's too)
        json.loads(part.read_text())
    # the re-run reuses the part the killed rank finished and merges what one process writes
    assert _cli(str(ranked), "--rank", "1", "--world-size", "2", *flags).exit_code == 0
    again = _parts(ranked)
    assert all(again[name] == stamp for name, stamp in written.items())
    assert _cli(str(ranked), "--rank", "0", "--world-size", "2", *flags).exit_code == 0
    assert prepared_content(ranked) == prepared_content(single)
    assert not (ranked / ".nv-meta" / PARTS_DIR).exists()


@pytest.mark.parametrize("garbage", [b"", b"{not json", b'{"version": 1}', b"[1, 2]"])
def test_an_unreadable_part_is_scanned_again_by_rank0(tmp_path: Path, caplog, garbage: bytes) -> None:
    single, ranked = _copies(tmp_path)
    prepare_across_ranks(ranked, FileRanks(1, 2, 30), **OPTIONS)
    spoiled = sorted(_parts(ranked))[0]
    (ranked / ".nv-meta" / PARTS_DIR / spoiled).write_bytes(garbage)
    prepare_across_ranks(ranked, FileRanks(0, 2, 30), **OPTIONS)
    assert "ignoring this part file" in caplog.text and spoiled in caplog.text
    prepare_dataset(single, **OPTIONS)
    assert prepared_content(ranked) == prepared_content(single)


def test_tar_index_only_across_ranks_matches_one_process(tmp_path: Path) -> None:
    single, ranked = _copies(tmp_path)
    prepare_dataset(single, **OPTIONS)
    _run_ranks(ranked, 2)
    for root in (single, ranked):  # lost indexes: those shards are indexed again, splits kept
        for name in ("a/s01.tar.idx", "b/s08.tar.idx"):
            (root / name).unlink()
    expected = prepare_dataset(single, tar_index_only=True, num_workers=1, progress=False)
    result = _run_ranks(ranked, 2, tar_index_only=True, split_ratio=None)
    assert sorted(result.scanned) == sorted(expected.scanned) == ["a/s01.tar", "b/s08.tar"]
    assert prepared_content(ranked) == prepared_content(single)
