"""What prepare and prepare-media write, and where: temporaries made fresh (a name planted in the
dataset folder is never written through), leftovers of a killed run removed by the next run while
a concurrent run keeps its own, and shard names the loader would refuse stopped at prepare."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from PIL import Image
from energon_lite_dev.synthetic import write_tar

from megatron_energon_lite.energon.media.filesystem_prepare import prepare_media_folder
from megatron_energon_lite.cli.main import cli
from megatron_energon_lite.errors import ConfigError, DatasetError
from megatron_energon_lite.format.media_metadata import MediaFilter
from megatron_energon_lite.format.metadata import read_info
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.storage import atomic_write_bytes, create_temporary


def shards(root: Path, count: int = 2, samples: int = 3) -> Path:
    for shard in range(count):
        write_tar(root / f"shards/part_{shard}.tar", [(f"{shard}_{i:05d}", {"txt": f"t {shard} {i}".encode()}) for i in range(samples)])
    return root


def plant_links(folder: Path, names: list[str], victims: Path) -> list[Path]:
    """Symlinks at the temporary names ``.NAME.tmp-PID`` of this process (the names that earlier
    versions wrote through), each to a file of its own outside the dataset."""
    victims.mkdir(exist_ok=True)
    targets = []
    for name in names:
        target = victims / name.replace("/", "_")
        target.write_bytes(b"precious")
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / f".{path.name}.tmp-{os.getpid()}").symlink_to(target)
        targets.append(target)
    return targets


def test_prepare_never_writes_through_a_name_planted_at_a_temporary(tmp_path: Path) -> None:
    root = shards(tmp_path / "ds")
    planted = [".nv-meta/.info.json", ".nv-meta/split.yaml", ".nv-meta/index.sqlite", ".nv-meta/index.uuid",
               ".nv-meta/dataset.yaml", ".nv-meta/.lite-prepare.json", ".nv-meta/.lite-split-cache.json",
               "shards/part_0.tar.idx", "shards/part_1.tar.idx"]  # fmt: skip
    targets = plant_links(root, planted, tmp_path / "outside")
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1,
                    dataset_yaml="sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n")  # fmt: skip
    assert [t.name for t in targets if t.read_bytes() != b"precious"] == []
    assert (root / ".nv-meta/.info.json").is_file() and not (root / ".nv-meta/.info.json").is_symlink()


def test_prepare_media_never_writes_through_a_name_planted_at_a_temporary(tmp_path: Path) -> None:
    root = tmp_path / "media"
    root.mkdir()
    Image.new("RGB", (4, 4)).save(root / "a.png")
    targets = plant_links(root, [".nv-meta/index.sqlite", ".nv-meta/.lite-prepare-media.json"], tmp_path / "outside")
    prepare_media_folder(root, MediaFilter.by_extension(), progress=False, num_workers=1)
    assert [t.name for t in targets if t.read_bytes() != b"precious"] == []


def test_atomic_writes_make_a_fresh_file_with_the_usual_permissions(tmp_path: Path) -> None:
    target = tmp_path / "x.json"
    (tmp_path / f".x.json.tmp-{os.getpid()}").symlink_to(tmp_path / "victim")
    atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"new" and not (tmp_path / "victim").exists()
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask


_KILLED_WRITER = """
import os, sys
from megatron_energon_lite.storage import create_temporary, create_temporary_folder
for path in sys.argv[1:]:
    fd, _ = create_temporary(path)
    os.write(fd, b"half written")
create_temporary_folder(sys.argv[1])
os._exit(9)  # killed before its renames
"""


def test_temporaries_of_a_killed_prepare_go_at_once_and_a_running_ones_stay(tmp_path: Path) -> None:
    root = shards(tmp_path / "ds")
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1)
    # A killed run's temporaries (this machine, its process gone), written a moment ago.
    killed = [root / ".nv-meta/index.sqlite", root / "shards/part_0.tar.idx"]
    subprocess.run([sys.executable, "-c", _KILLED_WRITER, *map(str, killed)], check=False)
    left = [p for p in root.rglob("*") if ".tmp-" in p.name]
    assert len(left) == 3
    # A concurrent run's temporary (its process runs): kept.
    with subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE) as other:
        fd, running = create_temporary(root / "shards/part_1.tar.idx", owner=other.pid)
        os.close(fd)
        prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, force_overwrite=True)
        assert [p for p in left if p.exists()] == []
        assert running.exists()
        other.stdin.close()
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, force_overwrite=True)
    assert not running.exists()


def test_a_temporary_from_another_machine_stays_until_it_is_old(tmp_path: Path) -> None:
    root = shards(tmp_path / "ds")
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1)
    fresh = root / f"shards/.part_0.tar.idx.tmp-{os.getpid() + 1_000_000}-other.host-0123abcd"
    fresh.write_bytes(b"being written elsewhere")
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, force_overwrite=True)
    assert fresh.exists()


@pytest.mark.parametrize("name", ["x{y.tar", "s{0..1}.tar", "a}b.tar", os.fsdecode(b"bad\xff.tar")])
def test_prepare_refuses_a_shard_name_the_loader_refuses(tmp_path: Path, name: str) -> None:
    root = shards(tmp_path / "ds", count=1)
    write_tar(root / "shards" / name, [("k", {"txt": b"t"})])
    with pytest.raises(DatasetError) as info:
        prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1)
    assert repr(f"shards/{name}") in str(info.value)
    assert not (root / ".nv-meta/.info.json").exists()
    # The loader applies the same rule to a name in .info.json (here written by hand).
    (root / "shards" / name).unlink()
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1)
    info_file = root / ".nv-meta/.info.json"
    data = json.loads(info_file.read_text())
    data["shard_counts"][f"shards/{name}"] = 1
    info_file.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="shard name cannot be read from split.yaml") as info:
        read_info(root)
    assert repr(f"shards/{name}") in str(info.value)


_MEDIA_CHAIN = """
import sys
from megatron_energon_lite.energon.media.filesystem_prepare import prepare_media_folder
from megatron_energon_lite.format.media_metadata import MediaFilter
result = prepare_media_folder(sys.argv[1], MediaFilter.by_extension(), progress=False, num_workers=1)
print("files", result.files)
"""


def test_prepare_media_walks_a_chain_of_symlinked_folders_once(tmp_path: Path) -> None:
    """Folders d0..d22, each with two symlinks to the next: walked path by path, one image in d22
    was 2^23 entries; by real path it is one."""
    root = tmp_path / "media"
    depth = 22
    for level in range(depth + 1):
        (root / f"d{level:02d}").mkdir(parents=True)
    for level in range(depth):
        for link in ("a", "b"):
            (root / f"d{level:02d}" / link).symlink_to(f"../d{level + 1:02d}", target_is_directory=True)
    Image.new("RGB", (4, 4)).save(root / f"d{depth:02d}" / "x.png")
    result = subprocess.run([sys.executable, "-c", _MEDIA_CHAIN, str(root)], capture_output=True, text=True, timeout=60)
    assert result.stdout.split() == ["files", "1"], result.stderr[-2000:]


def test_prepare_media_on_a_full_disk_names_the_index_and_the_fix(small_disk: Path) -> None:
    root = small_disk / "media"
    root.mkdir()
    for i in range(400):
        Image.new("RGB", (2, 2)).save(root / f"{i:04d}.png")
    (small_disk / "filler").write_bytes(b"\0" * max(0, shutil.disk_usage(small_disk).free - 8 * 1024))
    result = CliRunner().invoke(cli, ["prepare-media", str(root), "--media-metadata-by-extension", "--no-progress", "--num-workers", "1"])
    assert result.exit_code == 1, result.output
    assert "no room left on the device" in result.output and str(root / ".nv-meta" / "index.sqlite") in result.output
    assert "free space" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)  # a message, not a traceback
    assert [p.name for p in root.rglob("*") if ".tmp-" in p.name] == []
