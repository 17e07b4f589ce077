"""prepare interrupted (kill -9) or out of room: no leftovers, no orphaned workers, a clear message."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from energon_lite_dev.synthetic import write_tar

from megatron_energon_lite.cli.main import cli
from megatron_energon_lite.errors import StorageError
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.storage import atomic_write_bytes
from megatron_energon_lite.storage.local import STALE_TEMPORARY_SECONDS

CLI = ("--non-interactive", "--no-progress", "--num-workers", "1", "--split-ratio", "1,0,0", "--sample-type", "TextSample", "--field-map", '{"text": "txt"}')


def shards(root: Path, count: int = 2, samples: int = 3, start: int = 0) -> Path:
    for shard in range(start, start + count):
        write_tar(root / f"shards/part_{shard}.tar", [(f"{shard}_{i:05d}", {"txt": f"t {shard} {i}".encode()}) for i in range(samples)])
    return root


def dead_pid() -> int:
    """The id of a process that has ended (and been reaped)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def gone(pid: int) -> bool:
    """Not running: absent, or a zombie nobody has reaped yet."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def test_temporaries_of_a_killed_prepare_are_removed_by_the_next(tmp_path: Path) -> None:
    root = shards(tmp_path / "ds")
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1)
    dead, old = dead_pid(), time.time() - STALE_TEMPORARY_SECONDS - 60
    left = {
        "index": root / f".nv-meta/.index.sqlite.tmp-{dead}",
        "tar_idx": root / f"shards/.part_0.tar.idx.tmp-{dead}",
        "info": root / f".nv-meta/..info.json.tmp-{dead}",
    }
    kept = {
        "recent": root / f"shards/.part_1.tar.idx.tmp-{dead + 1_000_000}",  # maybe still being written elsewhere
        "running": root / f"shards/.part_1.tar.idx.tmp-{os.getpid()}",  # its writer runs
        "not_ours": root / "shards/.notes.tmp-x",
    }
    for path in [*left.values(), *kept.values()]:
        path.write_bytes(b"half written")
    for path in [*left.values(), kept["running"], kept["not_ours"]]:
        os.utime(path, (old, old))

    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, force_overwrite=True)
    assert [name for name, path in left.items() if path.exists()] == []
    assert [name for name, path in kept.items() if not path.exists()] == []


_POOL_SCRIPT = """
import os, sys, time
from megatron_energon_lite.format.process_pool import scan_pool
pool = scan_pool(2)
pids = {pool.submit(os.getpid).result() for _ in range(20)}
print(" ".join(map(str, sorted(pids))), flush=True)
time.sleep(120)
"""


def test_pool_workers_exit_when_the_scanning_process_is_killed() -> None:
    with subprocess.Popen([sys.executable, "-c", _POOL_SCRIPT], stdout=subprocess.PIPE, text=True) as process:
        workers = [int(pid) for pid in process.stdout.readline().split()]
        assert workers and all(not gone(pid) for pid in workers)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
        deadline = time.monotonic() + 10
        while not all(gone(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [pid for pid in workers if not gone(pid)] == []


def test_a_full_disk_during_an_atomic_write_names_the_file_and_keeps_the_old_one(small_disk: Path) -> None:
    target = small_disk / "shard.tar.idx"
    target.write_bytes(b"old")
    (small_disk / "filler").write_bytes(b"\0" * max(0, shutil.disk_usage(small_disk).free - 16 * 1024))
    with pytest.raises(StorageError, match="no room left") as info:
        atomic_write_bytes(target, b"new" * 100_000)
    assert str(target) in str(info.value) and "free space" in str(info.value)
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "shard.tar.idx"]


def test_prepare_on_a_full_disk_says_so_and_leaves_the_previous_index(small_disk: Path) -> None:
    root = shards(small_disk / "ds", count=1, samples=10)
    runner = CliRunner()
    assert runner.invoke(cli, ["prepare", str(root), *CLI]).exit_code == 0
    index = (root / ".nv-meta/index.sqlite").read_bytes()

    shards(root, count=1, samples=2000, start=1)  # its index rows no longer fit
    free = shutil.disk_usage(small_disk).free
    (small_disk / "filler").write_bytes(b"\0" * max(0, free - 16 * 1024))
    result = runner.invoke(cli, ["prepare", str(root), *CLI, "--force-overwrite"])
    assert result.exit_code == 1
    assert "Error: no room left on the device" in result.output and str(root) in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)  # a message, not a traceback
    assert (root / ".nv-meta/index.sqlite").read_bytes() == index
    leftovers = [p.name for p in root.rglob("*") if ".tmp-" in p.name]
    assert leftovers == []
