"""Malformed tar headers: negative sizes, broken PAX records, random bytes (issue 13, items 1, 7, 14).

Each used to hang (a size or record length that does not move the parser forward), raise a bare
``ValueError`` naming no file, or silently rename a member.  Every case must now raise our own
:class:`TarFormatError` naming the shard and the byte offset, in ``prepare``, in the loader (with
and without worker processes) and in ``energon-lite lint``.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from energon_lite_dev.synthetic import write_tar

from megatron_energon_lite import WorkerConfig, get_loader, get_train_dataset
from megatron_energon_lite.cli.main import cli
from megatron_energon_lite.errors import DatasetError
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.format.split_reader import SplitReader
from megatron_energon_lite.format.tar_reader import TarFormatError, iter_members

pytestmark = pytest.mark.timeout(60)  # a regression hangs: fail instead of waiting 300 s

NEGATIVE_SIZES = {
    "octal": b"-0000001000\0",
    "base256": b"\xff" * 12,
}


def _fix_checksum(data: bytearray, offset: int) -> None:
    header = data[offset : offset + 512]
    header[148:156] = b" " * 8
    data[offset + 148 : offset + 156] = b"%06o\0 " % sum(header)


def _ustar(members: list[tuple[str, bytes]]) -> bytearray:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return bytearray(buffer.getvalue())


def _with_pax(records: bytes, name: str = "k1.txt", data: bytes = b"x") -> bytes:
    """A PAX extended header holding ``records`` verbatim, then one ustar member."""
    pax = tarfile.TarInfo("././@PaxHeader")
    pax.type = tarfile.XHDTYPE
    pax.size = len(records)
    out = bytearray(pax.tobuf(tarfile.USTAR_FORMAT))
    out += records + b"\0" * (-len(records) % 512)
    out += _ustar([(name, data)])
    return bytes(out)


def _members(data: bytes, where: str = "shard.tar") -> list:
    return list(iter_members(data, where=where, verify_checksums=True))


# --- iter_members -------------------------------------------------------------------------------


@pytest.mark.timeout(10)
@pytest.mark.parametrize("kind", sorted(NEGATIVE_SIZES))
def test_negative_size_is_an_error_not_a_hang(kind: str) -> None:
    data = _ustar([("k0.txt", b"a"), ("k1.txt", b"b")])
    data[512 * 2 + 124 : 512 * 2 + 136] = NEGATIVE_SIZES[kind]  # the second header
    _fix_checksum(data, 1024)
    with pytest.raises(TarFormatError, match=r"negative member size(.|\n)*shard.tar at byte 1024(.|\n)*found: size field"):
        _members(bytes(data))


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "records, found",
    [
        (b"0 path=x\n", "missing or zero"),  # length 0: used to loop forever
        (b"00 path=x\n", "missing or zero"),
        (b"3 path=x\n", "does not end at a newline"),  # shorter than its own header
        (b"ab path=x\n", "missing or zero"),  # not a number: used to be a bare ValueError
        (b"-9 path=k.txt\n", "missing or zero"),
        (b"nospace", "missing or zero"),  # used to be a bare ValueError ("subsection not found")
        (b"99 path=k1.txt\n", "a record of 99 bytes in 15 remaining bytes"),
        (b"10 pathxx\n", "without KEY="),
    ],
)
def test_bad_pax_records_are_errors(records: bytes, found: str) -> None:
    with pytest.raises(TarFormatError, match=rf"PAX(.|\n)*shard.tar, PAX header at byte 0(.|\n)*found: .*{found}"):
        _members(_with_pax(records))


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "records",
    [
        b"20 path=k9.txt\n",  # 15 bytes: the old parser named the member "k9.txt\n" (part "txt\n")
        b"25 path=k9.txt\n10 size=1\n",  # runs over the next record into the name
    ],
)
def test_oversized_pax_path_length_does_not_rename_the_member(records: bytes) -> None:
    with pytest.raises(TarFormatError, match=r"PAX(.|\n)*shard.tar, PAX header at byte 0(.|\n)*record"):
        _members(_with_pax(records))


def test_valid_pax_records_still_parse() -> None:
    records = b"15 path=k9.txt\n" + b"10 size=1\n" + b"\0" * 7  # NUL padding after the records
    (member,) = _members(_with_pax(records))
    assert (member.name, member.size) == ("k9.txt", 1)


@pytest.mark.parametrize("size", [b"abc", b"-5", b"1e3", b" 12"])
def test_bad_pax_size_is_an_error(size: bytes) -> None:
    record = b"size=" + size + b"\n"
    record = str(len(record) + 3).encode() + b" " + record
    with pytest.raises(TarFormatError, match=r"invalid PAX size(.|\n)*shard.tar"):
        _members(_with_pax(record))


def test_random_bytes_name_the_file_and_offset() -> None:
    data = np.random.default_rng(13).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    with pytest.raises(TarFormatError, match=r"checksum mismatch(.|\n)*shard.tar at byte 0(.|\n)*found: checksum field"):
        _members(data)
    with pytest.raises(TarFormatError, match=r"shard.tar at byte 0"):
        list(iter_members(data, where="shard.tar"))  # the loader does not check checksums


def test_non_octal_checksum_field_is_a_checksum_error() -> None:
    data = _ustar([("k0.txt", b"a")])
    data[148:156] = b"zzzzzzz\0"
    with pytest.raises(TarFormatError, match="checksum mismatch"):
        _members(bytes(data))


# --- prepare, loader, lint ----------------------------------------------------------------------

DATASET_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"


def _dataset(root: Path) -> Path:
    for shard in range(2):
        write_tar(root / f"shards/{shard}.tar", [(f"s{shard}_{i:03d}", {"txt": f"text {shard} {i}".encode()}) for i in range(6)])
    return root


def _corrupt_header(tar: Path, offset: int, size_field: bytes) -> None:
    data = bytearray(tar.read_bytes())
    data[offset + 124 : offset + 136] = size_field
    _fix_checksum(data, offset)
    tar.write_bytes(bytes(data))


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", sorted(NEGATIVE_SIZES))
def test_prepare_refuses_negative_size(tmp_path: Path, kind: str) -> None:
    root = _dataset(tmp_path / "ds")
    _corrupt_header(root / "shards/1.tar", 3 * 1024, NEGATIVE_SIZES[kind])
    with pytest.raises(TarFormatError, match=r"negative member size(.|\n)*shards/1.tar at byte 3072"):
        prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1)
    assert not (root / ".nv-meta/.info.json").exists()


@pytest.mark.timeout(30)
def test_prepare_refuses_random_bytes_tar(tmp_path: Path) -> None:
    root = _dataset(tmp_path / "ds")
    (root / "shards/2.tar").write_bytes(np.random.default_rng(7).integers(0, 256, 10240, dtype=np.uint8).tobytes())
    with pytest.raises(TarFormatError, match=r"checksum mismatch(.|\n)*shards/2.tar at byte 0"):
        prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=2)


def _prepared_then_corrupted(tmp_path: Path) -> tuple[Path, int]:
    """A prepared dataset whose sample 2 of shard 0 got a negative size after prepare."""
    root = _dataset(tmp_path / "ds")
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1)
    (root / ".nv-meta/dataset.yaml").write_text(DATASET_YAML)
    offsets = np.fromfile(root / "shards/0.tar.idx", dtype="<u8")
    _corrupt_header(root / "shards/0.tar", int(offsets[2]), NEGATIVE_SIZES["octal"])
    return root, int(offsets[2])


@pytest.mark.timeout(30)
def test_split_reader_names_shard_and_file_offset(tmp_path: Path) -> None:
    root, offset = _prepared_then_corrupted(tmp_path)
    reader = SplitReader(root, "train")
    assert reader.read(1).key == "s0_001"
    with pytest.raises(TarFormatError, match=rf"negative member size(.|\n)*shards/0.tar sample 2 .* at byte {offset}"):
        reader.read(2)
    reader.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 2])
def test_loader_stops_with_the_error_instead_of_hanging(tmp_path: Path, workers: int) -> None:
    # A damaged shard is a DatasetError, which stops the run (pipeline/guard.py): the point here
    # is that it arrives, naming the shard, instead of the worker spinning forever.
    root, offset = _prepared_then_corrupted(tmp_path)
    dataset = get_train_dataset(
        root,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers),
        batch_size=None,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        repeat=False,
    )
    with pytest.raises(DatasetError, match=rf"negative member size(.|\n)*shards/0.tar sample 2(.|\n)*at byte {offset}"):
        for _ in get_loader(dataset):
            pass


@pytest.mark.timeout(60)
def test_lint_reports_the_broken_sample(tmp_path: Path) -> None:
    root, _ = _prepared_then_corrupted(tmp_path)
    result = CliRunner().invoke(cli, ["lint", str(root), "--no-progress", "--split-parts", "train"])
    assert result.exit_code == 1, result.output
    assert "shards/0.tar sample #2" in result.output and "negative member size" in result.output


def test_error_is_a_dataset_error() -> None:
    assert issubclass(TarFormatError, DatasetError)
