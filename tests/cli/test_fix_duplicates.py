"""prepare --fix-duplicates: keys made unique by renaming tar members in place (Energon's meaning)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from energon_lite_dev.synthetic import write_tar

from megatron_energon_lite import WorkerConfig, get_loader, get_val_dataset
from megatron_energon_lite.cli.fix_duplicates import scan_for_duplicates
from megatron_energon_lite.cli.main import cli

P = ("--non-interactive", "--no-progress", "--num-workers", "1", "--split-ratio", "1,0,0", "--sample-type", "TextSample", "--field-map", '{"text": "txt"}')


def duplicated(root: Path, folder: str = "shards", tar_format: str = "ustar") -> Path:
    for shard in range(2):
        write_tar(root / f"{folder}/part_{shard}.tar", [(f"k_{i:04d}", {"txt": f"text {shard} {i}".encode(), "json": b"{}"}) for i in range(3)], tar_format=tar_format)
    return root


def run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_duplicates_fail_without_the_flag_and_are_renamed_with_it(tmp_path: Path) -> None:
    root = duplicated(tmp_path / "ds")
    before = {name: (root / name).read_bytes() for name in ("shards/part_0.tar", "shards/part_1.tar")}
    failed = run("prepare", str(root), *P)
    assert failed.exit_code == 1 and "duplicate" in failed.output
    result = run("prepare", str(root), *P, "--fix-duplicates", "--force-overwrite")
    assert result.exit_code == 0, result.output
    assert "Renamed the members of 2 shards" in result.output
    for name, old in before.items():
        new = (root / name).read_bytes()
        assert len(new) == len(old)  # headers rewritten in place, nothing moved
        with tarfile.open(root / name) as tar:  # Python's tarfile is the oracle for the headers
            members = tar.getmembers()
            assert [m.name for m in members] == [f"{name}/k_{i:04d}.{ext}" for i in range(3) for ext in ("txt", "json")]
            assert tar.extractfile(members[0]).read() == f"text {name[-5]} 0".encode()
    samples = list(get_loader(get_val_dataset(root, split_part="train", batch_size=None, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0))))
    assert sorted(s.__key__ for s in samples) == sorted(f"shards/part_{s}.tar/k_{i:04d}" for s in range(2) for i in range(3))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_energon_reads_the_renamed_dataset(tmp_path: Path) -> None:
    energon = pytest.importorskip("megatron.energon")
    root = duplicated(tmp_path / "ds")
    assert run("prepare", str(root), *P, "--fix-duplicates").exit_code == 0
    ds = energon.get_val_dataset(str(root), split_part="train", batch_size=None, worker_config=energon.WorkerConfig(rank=0, world_size=1, num_workers=0))
    keys = sorted(s.__key__ for s in energon.get_loader(ds))
    assert keys == sorted(f"shards/part_{s}.tar/k_{i:04d}" for s in range(2) for i in range(3))


def test_no_duplicates_change_nothing(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    for shard in range(2):
        write_tar(root / f"shards/part_{shard}.tar", [(f"{shard}_{i}", {"txt": b"x"}) for i in range(2)])
    before = (root / "shards/part_0.tar").read_bytes()
    result = run("prepare", str(root), *P, "--fix-duplicates")
    assert result.exit_code == 0 and "No duplicate keys found" in result.output
    assert (root / "shards/part_0.tar").read_bytes() == before


def test_long_paths_use_the_ustar_prefix_field(tmp_path: Path) -> None:
    folder = "/".join(["deep_folder_name"] * 5)  # 84 bytes: the new names need the prefix field
    root = duplicated(tmp_path / "ds", folder=folder)
    assert run("prepare", str(root), *P, "--fix-duplicates").exit_code == 0
    with tarfile.open(root / f"{folder}/part_1.tar") as tar:
        assert tar.getnames()[0] == f"{folder}/part_1.tar/k_0000.txt"


def test_shards_that_cannot_be_renamed_in_place_change_nothing(tmp_path: Path) -> None:
    root = duplicated(tmp_path / "ds")
    # A pax header that holds the name: renaming the ustar header would not rename the member.
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("k_0000.txt")
        info.size, info.pax_headers = 1, {"path": "k_0000.txt"}
        tar.addfile(info, io.BytesIO(b"y"))
    (root / "shards/part_2.tar").write_bytes(buffer.getvalue())
    before = {p.name: p.read_bytes() for p in (root / "shards").iterdir()}
    result = CliRunner().invoke(cli, ["prepare", str(root), *P, "--fix-duplicates"])
    assert result.exit_code == 1 and "cannot be renamed in place" in result.output and "part_2.tar: pax headers" in result.output
    assert {p.name: p.read_bytes() for p in (root / "shards").iterdir()} == before
    assert not (root / ".nv-meta").exists()


def test_scan_reports_repeats_inside_one_shard(tmp_path: Path) -> None:
    write_tar(tmp_path / "a.tar", [("x", {"txt": b"1"}), ("y", {"txt": b"2"}), ("x", {"json": b"{}"})])
    write_tar(tmp_path / "b.tar", [("x", {"txt": b"3"})])
    scan = scan_for_duplicates(tmp_path, ["a.tar", "b.tar"])
    assert scan.duplicates == {"x": ["a.tar", "b.tar"]}
    assert "repeats a sample key" in scan.problems["a.tar"]
