import gzip
import io
import tarfile
from pathlib import Path

import pytest
from energon_lite_dev.synthetic import write_tar
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megatron_energon_lite.errors import DecodeError
from megatron_energon_lite.format.tar_reader import (
    TarFormatError,
    group_samples,
    iter_members,
    parse_sample,
    split_name,
)

from conftest import add_raw_member, tar_members


def _parse_all(data: bytes):
    members = iter_members(data, verify_checksums=True)
    found = []
    while True:
        try:
            found.append(next(members))
        except StopIteration as stop:
            return found, stop.value


@pytest.mark.parametrize("fmt", ["ustar", "gnu", "pax"])
def test_members_and_offsets_match_tarfile(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / "a.tar"
    long_key = "dir/" * 40 + "k"
    write_tar(path, [("k1", {"txt": b"x" * 700, "json": b"{}"}), (long_key, {"txt": b"yy"}), ("ü_key", {"txt": b""})], tar_format=fmt)
    data = path.read_bytes()
    ours, end = _parse_all(data)
    with tarfile.open(path, "r:") as tar:
        theirs = tar.getmembers()
        theirs_end = tar.offset
    assert [(m.name, m.header_offset, m.data_offset, m.size) for m in ours] == [
        (t.name, t.offset, t.offset_data, t.size) for t in theirs
    ]
    assert end == theirs_end


def test_non_sample_members_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "mixed.tar"
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        add_raw_member(tar, "__meta__", b"{}")
        add_raw_member(tar, "__index__/x.txt", b"{}")
        add_raw_member(tar, "somedir", kind=tarfile.DIRTYPE)
        add_raw_member(tar, "README", b"no dot")
        add_raw_member(tar, "a.b/noext", b"dot only in the folder")
        add_raw_member(tar, "a/b.c/d.e.f", b"1")
        add_raw_member(tar, "a/b.c/d.g", b"2")
        add_raw_member(tar, "x.txt", b"3")
        add_raw_member(tar, "link.txt", kind=tarfile.SYMTYPE)
    members, _ = _parse_all(path.read_bytes())
    assert "somedir" not in [m.name for m in members] and "link.txt" not in [m.name for m in members]
    samples = list(group_samples(members))
    assert [(s.key, [p for p, _, _ in s.parts]) for s in samples] == [("a/b.c/d", ["e.f", "g"]), ("x", ["txt"])]
    by_name = {t.name: t for t in tar_members(path)}
    assert samples[0].offset == by_name["a/b.c/d.e.f"].offset


def test_split_name_rules() -> None:
    assert split_name("sample_0000.detail.json") == ("sample_0000", "detail.json")
    assert split_name("a/b.c/d.e.f") == ("a/b.c/d", "e.f")
    assert split_name("noext") is None
    assert split_name("a.b/noext") is None
    assert split_name("__index__/x.txt") is None


def test_non_adjacent_key_starts_a_new_sample(tmp_path: Path) -> None:
    path = tmp_path / "a.tar"
    with tarfile.open(path, "w") as tar:
        for name in ("k.txt", "j.txt", "k.json"):
            add_raw_member(tar, name, b"v")
    members, _ = _parse_all(path.read_bytes())
    assert [s.key for s in group_samples(members)] == ["k", "j", "k"]


def test_parse_sample_returns_bytes_and_filters_parts(tmp_path: Path) -> None:
    path = tmp_path / "a.tar"
    write_tar(path, [("k1", {"txt": b"hello", "jpg": b"\xff\xd8binary", "json": b"[1]"})], tar_format="pax")
    data = path.read_bytes()
    key, parts = parse_sample(data, where="test")
    assert key == "k1" and parts == {"txt": b"hello", "jpg": b"\xff\xd8binary", "json": b"[1]"}
    _, only = parse_sample(data, where="test", wanted=frozenset({"txt"}))
    assert only == {"txt": b"hello"}


def test_range_with_two_samples_is_an_index_error(tmp_path: Path) -> None:
    path = tmp_path / "a.tar"
    write_tar(path, [("k1", {"txt": b"a"}), ("k2", {"txt": b"b"})])
    with pytest.raises(TarFormatError, match="two samples"):
        parse_sample(path.read_bytes(), where="test")


def test_truncated_tar_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "a.tar"
    write_tar(path, [("k1", {"txt": b"a" * 2000})])
    with pytest.raises(TarFormatError, match="truncated"):
        _parse_all(path.read_bytes()[:1200])


def test_gzip_tar_is_rejected_with_a_fix(tmp_path: Path) -> None:
    path = tmp_path / "a.tar"
    write_tar(path, [("k1", {"txt": b"a"})])
    with pytest.raises(TarFormatError, match="decompress"):
        _parse_all(gzip.compress(path.read_bytes()))


def test_corrupt_header_fails_checksum(tmp_path: Path) -> None:
    path = tmp_path / "a.tar"
    write_tar(path, [("k1", {"txt": b"a"})])
    data = bytearray(path.read_bytes())
    data[5] ^= 0xFF
    with pytest.raises(TarFormatError, match="checksum"):
        _parse_all(bytes(data))


_names = st.text(alphabet="abcXYZ019_-/ü", min_size=1, max_size=120).filter(lambda s: not s.startswith("/") and "//" not in s and not s.endswith("/"))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    entries=st.lists(st.tuples(_names, st.sampled_from(["txt", "json", "a.b"]), st.binary(max_size=1500)), min_size=1, max_size=8),
    fmt=st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]),
)
def test_any_tar_parses_like_tarfile(entries, fmt) -> None:
    buffer = io.BytesIO()
    try:
        with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tar:
            for key, part, data in entries:
                add_raw_member(tar, f"{key}.{part}", data)
    except ValueError:
        return  # name not representable in this format (ustar limits)
    data = buffer.getvalue()
    ours, end = _parse_all(data)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        theirs = tar.getmembers()
        assert end == tar.offset
    assert [(m.name, m.header_offset, m.data_offset, m.size) for m in ours] == [
        (t.name, t.offset, t.offset_data, t.size) for t in theirs
    ]


def test_global_pax_header_is_not_part_of_the_next_member(tmp_path: Path) -> None:
    path = tmp_path / "g.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "git archive"}) as tar:
        add_raw_member(tar, "k1.txt", b"a")
        add_raw_member(tar, "k2.txt", b"b")
    ours, end = _parse_all(path.read_bytes())
    theirs = tar_members(path)
    assert [m.header_offset for m in ours] == [t.offset for t in theirs]
    assert ours[0].header_offset > 0


def _outcome(buf) -> tuple:
    try:
        key, parts = parse_sample(buf, where="sample")
    except (TarFormatError, DecodeError) as exc:  # DecodeError: a sample holding a member twice
        return ("error", str(exc))
    return (key, {part: bytes(value) for part, value in parts.items()})


_sample_names = st.text(alphabet="abcX019_-/ü.", min_size=1, max_size=130).filter(lambda s: not s.startswith("/") and "//" not in s and not s.endswith("/"))


@settings(max_examples=150, deadline=None)
@given(
    members=st.lists(st.tuples(_sample_names, st.binary(max_size=1200)), min_size=1, max_size=5),
    fmt=st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]),
    damage=st.lists(st.tuples(st.integers(0, 4000), st.integers(0, 255)), max_size=3),
    cut=st.integers(0, 600),
)
def test_the_fast_path_gives_what_the_general_parser_gives(members, fmt, damage, cut) -> None:
    """parse_sample on bytes takes a fast path for plain ustar members; on a memoryview it runs
    the general parser.  Any tar (long names, PAX and GNU headers, two keys), damaged or cut
    short, gives both the same key and parts, or the same error."""
    buffer = io.BytesIO()
    try:
        with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tar:
            for name, data in members:
                add_raw_member(tar, name, data)
            end = tar.offset  # where the end-of-archive blocks start
    except ValueError:
        return  # name not representable in this format (ustar limits)
    data = bytearray(buffer.getvalue()[:end])
    data = data[: max(0, len(data) - cut)] if cut % 3 == 0 else data
    for position, value in damage:
        if position < len(data):
            data[position] = value
    data = bytes(data)
    assert _outcome(data) == _outcome(memoryview(data))
