"""Tar bytes -> members -> samples, in memory, starting from any header offset.

Three small steps, each a plain function:

1. :func:`iter_members` parses tar headers in a byte buffer (ustar, GNU long names, PAX
   extended headers) and yields regular-file members with their offsets.
2. :func:`split_name` applies the WebDataset naming rule: the key is everything up to the first
   dot of the last path component, the part name is the rest.
3. :func:`group_samples` joins consecutive members with the same key into one sample.

The loader reads one sample as one byte range ``[idx[i], idx[i+1])`` taken from the shard's
``.tar.idx`` and calls :func:`parse_sample` on it; ``prepare`` runs the same functions over a
whole (memory-mapped) tar.  Offsets follow Python's ``tarfile``: a member's offset is its first
header block, including any GNU long-name or PAX header in front of it.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import Iterable, Iterator

from ..errors import DatasetError, DecodeError, format_message

BLOCK = 512

# Energon/WebDataset naming rules (research/energon.md 1.2).
_META_NAME = re.compile(r"__[^/]*__($|/)")
_SAMPLE_NAME = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")

_REGULAR_TYPES = (b"0", b"\0", b"7")
_GNU_LONGNAME, _GNU_LONGLINK, _PAX_HEADER, _PAX_GLOBAL = b"L", b"K", b"x", b"g"
_GNU_TYPES = (_GNU_LONGNAME, _GNU_LONGLINK, b"S")
_GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True, slots=True)
class TarMember:
    """A regular file in a tar: its name and where its header and data are."""

    name: str
    header_offset: int
    data_offset: int
    size: int


@dataclass(slots=True)
class SampleEntry:
    """One sample as found in a tar: its key, its first header offset and its parts."""

    key: str
    offset: int
    parts: list[tuple[str, int, int]]  # (part name, data offset, size)


class TarFormatError(DatasetError):
    """The bytes are not a valid uncompressed tar at the expected place."""


def _parse_number(field: bytes) -> int:
    """A numeric header field: octal digits padded with spaces/NULs, or GNU base-256.

    Raises ValueError for anything else (a sign, letters, ...); a GNU base-256 field with the
    negative marker (first byte 0xFF) gives a negative number, which callers must refuse.
    """
    if field[:1] in (b"\x80", b"\xff"):  # GNU base-256 for large values, two's complement
        value = int.from_bytes(field[1:], "big")
        return value - (1 << (8 * (len(field) - 1))) if field[:1] == b"\xff" else value
    digits = field.split(b"\0", 1)[0].strip()
    if not digits:
        return 0
    sign = -1 if digits[:1] == b"-" else 1  # not valid tar, but say "negative" in the error
    digits = digits[1:] if sign < 0 else digits
    if not digits or digits.strip(b"01234567"):
        raise ValueError(f"not an octal number: {field!r}")
    return sign * int(digits, 8)


def _checksum_ok(header: bytes) -> bool:
    try:
        stored = _parse_number(header[148:156])
    except ValueError:
        return False
    unsigned = sum(header[:148]) + 256 + sum(header[156:])  # checksum field counts as spaces
    if stored == unsigned:
        return True
    high_bytes = sum(1 for b in header[:148] + header[156:] if b > 127)
    return stored == unsigned - 256 * high_bytes  # some writers sum signed chars


_PAX_RECORD_START = re.compile(rb"\n[0-9]+ [^=\n]+=")
_PAX_FORMAT = "records 'LENGTH KEY=VALUE\\n' where LENGTH (decimal) counts the whole record"


def _pax_records(data: bytes, where: str) -> dict[str, str]:
    """Parses PAX records strictly: every record must end where its length says, with a newline.

    A length that is zero, too short, too long or not a number would make a lenient parser loop,
    read the next record's bytes into a value or rename the member, so it is an error.  NUL
    padding after the last record is tolerated.
    """
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        if data.count(0, pos) == len(data) - pos:
            break  # NUL padding after the last record
        space = data.find(b" ", pos, pos + 21)
        digits = data[pos:space] if space > pos else b""
        length = int(digits) if digits.isdigit() else -1  # ASCII digits only: no sign, no spaces
        record_end = pos + length
        equals = data.find(b"=", space + 2, record_end - 1) if length > 0 else -1
        value = data[equals + 1 : record_end - 1]
        if (
            length <= 0
            or record_end > len(data)
            or data[record_end - 1 : record_end] != b"\n"
            or equals == -1
            or (b"\n" in value and _PAX_RECORD_START.search(value))
        ):
            if length <= 0:
                problem = "a record length that is missing or zero"
            elif record_end > len(data):
                problem = f"a record of {length} bytes in {len(data) - pos} remaining bytes"
            elif data[record_end - 1 : record_end] != b"\n":
                problem = f"a record length of {length} that does not end at a newline"
            elif equals == -1:
                problem = "a record without KEY="
            else:  # the length runs over the next record, which then ends up in this value
                problem = f"a record length of {length} that swallows the next record"
            raise TarFormatError(
                format_message(
                    "invalid PAX extended header (corrupt or hostile tar)",
                    where=f"{where}, record at byte {pos} of the PAX data",
                    expected=_PAX_FORMAT,
                    found=f"{problem}: {data[pos : pos + 48]!r}",
                    fix="re-create the shard with a standard tar writer (GNU tar, Python's "
                    "tarfile), then run `energon-lite prepare` again",
                )
            )
        key = data[space + 1 : equals]
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos = record_end
    return records


def _header_error(what: str, where: str, found: str) -> TarFormatError:
    return TarFormatError(
        format_message(
            what,
            where=where,
            expected="a tar header block with a valid, non-negative size",
            found=found,
            fix="check that the file is an uncompressed tar and that the .tar.idx belongs to it; "
            "re-create the shard or run `energon-lite prepare` again",
        )
    )


def iter_members(
    buf: bytes | memoryview,
    *,
    base_offset: int = 0,
    where: str = "<tar>",
    verify_checksums: bool = False,
) -> Iterator[TarMember]:
    """Yields the regular-file members found in ``buf``.

    ``base_offset`` is the file offset of ``buf[0]`` so that offsets are file offsets.  Parsing
    stops at the end-of-archive zero block or at the end of the buffer; a member whose data runs
    past the end raises :class:`TarFormatError`.  After the generator is exhausted, its return
    value (``StopIteration.value``) is the file offset where parsing stopped: the start of the
    end-of-archive blocks for a whole tar, as Energon's ``.tar.idx`` records it.
    """
    view = memoryview(buf)
    try:
        return (yield from _iter_view(view, base_offset, where, verify_checksums))
    finally:
        view.release()  # an mmap can only be closed once no view of it is left


def _iter_view(view: memoryview, base_offset: int, where: str, verify_checksums: bool) -> Iterator[TarMember]:
    end = len(view)
    pos = 0
    if end >= 2 and bytes(view[:2]) == _GZIP_MAGIC and base_offset == 0:
        raise TarFormatError(
            format_message(
                "compressed tar files cannot be read by random access",
                where=where,
                expected="an uncompressed tar (ustar, GNU or PAX)",
                found="gzip magic bytes",
                fix="decompress the shard (gunzip, then rename to .tar) and prepare again",
            )
        )
    long_name: str | None = None
    pax: dict[str, str] = {}
    first_header: int | None = None  # start of extended headers belonging to the next member
    while pos + BLOCK <= end:
        header = bytes(view[pos : pos + BLOCK])
        if header.count(0) == BLOCK:
            return base_offset + pos
        if verify_checksums and not _checksum_ok(header):
            raise TarFormatError(
                format_message(
                    "tar header checksum mismatch (corrupt or not a tar file)",
                    where=f"{where} at byte {base_offset + pos}",
                    expected="a tar header block whose checksum field matches its bytes",
                    found=f"checksum field {header[148:156]!r}, header starting {header[:24]!r}",
                    fix="re-create the shard; if it was copied, check the copy is complete",
                )
            )
        try:
            size = _parse_number(header[124:136])
        except ValueError:
            raise _header_error(
                "invalid tar header (size field is not a number)",
                f"{where} at byte {base_offset + pos}",
                f"size field {header[124:136]!r}",
            ) from None
        if size < 0:  # would move the parser backwards: an endless loop
            raise _header_error(
                "invalid tar header (negative member size)",
                f"{where} at byte {base_offset + pos}",
                f"size field {header[124:136]!r} = {size}",
            )
        typeflag = header[156:157]
        data_start = pos + BLOCK
        data_end = data_start + size
        if first_header is None:
            first_header = pos
        if typeflag in (_GNU_LONGNAME, _GNU_LONGLINK, _PAX_HEADER, _PAX_GLOBAL):
            if data_end > end:
                raise TarFormatError(
                    format_message(
                        "extended tar header runs past the end of the data (truncated or corrupt tar, "
                        "or stale index)",
                        where=f"{where} at byte {base_offset + pos}",
                        expected=f"{size} bytes of header data",
                        found=f"{end - data_start} bytes",
                        fix="re-create or re-download the shard, then run `energon-lite prepare` again",
                    )
                )
            data = bytes(view[data_start:data_end])
            if typeflag == _GNU_LONGNAME:
                long_name = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            elif typeflag == _PAX_HEADER:
                pax = _pax_records(data, f"{where}, PAX header at byte {base_offset + pos}")
            elif first_header == pos:
                first_header = None  # like tarfile: a global header is not part of the next member
            pos = data_start + -(-size // BLOCK) * BLOCK
            continue
        if "size" in pax:
            text = pax["size"]
            if not (text.isascii() and text.isdigit()):
                raise _header_error(
                    "invalid PAX size record",
                    f"{where}, member at byte {base_offset + first_header}",
                    f"size={text[:40]!r}",
                )
            size = int(text)
            data_end = data_start + size
        if long_name is not None:
            name = long_name
        elif "path" in pax:
            name = pax["path"]
        else:
            name = header[:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            prefix = header[345:500].split(b"\0", 1)[0]
            if prefix and typeflag not in _GNU_TYPES and header[257:262] == b"ustar":
                name = prefix.decode("utf-8", "surrogateescape") + "/" + name
        if data_end > end:
            raise TarFormatError(
                format_message(
                    "tar member runs past the end of the data (truncated tar or stale index)",
                    where=f"{where}, member {name!r} at byte {base_offset + first_header}",
                    expected=f"{size} data bytes",
                    found=f"{max(0, end - data_start)} bytes",
                    fix="re-create or re-download the shard, then run `energon-lite prepare` again",
                )
            )
        if typeflag in _REGULAR_TYPES and not (typeflag == b"\0" and name.endswith("/")):
            yield TarMember(name, base_offset + first_header, base_offset + data_start, size)
        long_name = None
        pax = {}
        first_header = None
        pos = data_start + -(-size // BLOCK) * BLOCK
    if pos < end or first_header is not None:
        raise TarFormatError(
            format_message(
                "tar data ends in the middle of a header or member (truncated tar or stale index)",
                where=f"{where} at byte {base_offset + pos}",
                expected="whole 512-byte header blocks, each followed by its member's data",
                found=f"{end - pos} byte(s) left" if pos < end else "extended headers with no member after them",
                fix="re-create or re-download the shard, then run `energon-lite prepare` again",
            )
        )
    return base_offset + pos


def header_name(block: bytes) -> str | None:
    """The member name a single ustar header block holds (name, with its prefix), or None for a
    block that is not a regular file's header. A GNU long name or a PAX path sits in blocks
    before it: then this is not the whole name, and a caller that must know parses from there."""
    if len(block) < BLOCK or block[156:157] not in _REGULAR_TYPES or not _checksum_ok(block[:BLOCK]):
        return None
    name = block[:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
    prefix = block[345:500].split(b"\0", 1)[0]
    if prefix and block[257:265] == b"ustar\x0000":  # POSIX ustar; GNU keeps other fields there
        name = prefix.decode("utf-8", "surrogateescape") + "/" + name
    return name


def split_name(name: str) -> tuple[str, str] | None:
    """``"a/b.c/d.e.f"`` -> ``("a/b.c/d", "e.f")``; None for members that are not sample parts."""
    if _META_NAME.match(name):
        return None
    match = _SAMPLE_NAME.match(name)
    if match is None:
        return None
    return match.group(1), match.group(2)


def group_samples(members: Iterable[TarMember]) -> Iterator[SampleEntry]:
    """Joins runs of consecutive members with the same key into samples."""
    current: SampleEntry | None = None
    part_names: dict[str, str] = {}  # one string per distinct part name, not one per member
    for member in members:
        split = split_name(member.name)
        if split is None:
            continue
        key, part = split
        part = part_names.setdefault(part, part)
        if current is None or current.key != key:
            if current is not None:
                yield current
            current = SampleEntry(key, member.header_offset, [])
        current.parts.append((part, member.data_offset, member.size))
    if current is not None:
        yield current


def sample_offsets(buf: bytes | memoryview, *, where: str) -> tuple[list[str], list[int]]:
    """The keys of the samples of the whole tar in ``buf`` and their offsets as ``prepare``
    indexes them: each sample's first header, then where the archive ends (a ``.tar.idx``)."""
    end: list[int] = []

    def members() -> Iterator[TarMember]:
        end.append((yield from iter_members(buf, where=where, verify_checksums=True)))

    samples = list(group_samples(members()))
    return [s.key for s in samples], [s.offset for s in samples] + end


def parse_sample(
    buf: bytes,
    *,
    where: str,
    wanted: frozenset[str] | None = None,
    base_offset: int = 0,
) -> tuple[str, dict[str, bytes]]:
    """Parses the bytes of exactly one sample into ``(key, {part: bytes})``.

    ``wanted`` limits which parts are copied out (parts no field needs are never decoded).
    ``base_offset`` is the file offset of ``buf[0]``, so that errors name file offsets.
    A range holding members of more than one key means the ``.tar.idx`` does not fit the tar.
    """
    if isinstance(buf, bytes):
        plain = _parse_plain_sample(buf, wanted)
        if plain is not None:
            return plain
    key: str | None = None
    parts: dict[str, bytes] = {}
    seen: set[str] = set()
    view = memoryview(buf)
    for member in iter_members(view, base_offset=base_offset, where=where):
        split = split_name(member.name)
        if split is None:
            continue
        member_key, part = split
        if part in seen and member_key == key:
            # One sample's problem, not the shard's: a DecodeError, which the error policy handles.
            raise DecodeError(
                format_message(
                    "a sample holds the same member twice: one copy would be lost",
                    where=f"{where}, member {member.name!r} at byte {member.header_offset}",
                    expected=f"each part of sample {key!r} once",
                    found=f"a second {member.name!r}",
                    fix="re-create the shard with each KEY.PART once (which copy is right cannot be told from the tar), "
                    "then run `energon-lite prepare` again",
                )
            )
        seen.add(part)
        if key is None:
            key = member_key
        elif member_key != key:
            raise TarFormatError(
                format_message(
                    "the index range of one sample holds members of two samples",
                    where=where,
                    expected=f"only members of sample {key!r}",
                    found=f"member {member.name!r}",
                    fix="the .tar.idx is stale or the keys are not contiguous; "
                    "run `energon-lite prepare --tar-index-only` on the dataset",
                )
            )
        if wanted is None or part in wanted:
            start = member.data_offset - base_offset
            parts[part] = bytes(view[start : start + member.size])
    if key is None:
        raise TarFormatError(
            format_message(
                "no sample found at this index position",
                where=where,
                expected="at least one member named KEY.PART",
                fix="run `energon-lite prepare --tar-index-only` on the dataset",
            )
        )
    return key, parts


#: The ustar header fields the plain case needs: name, size, typeflag, prefix.
_PLAIN_HEADER = struct.Struct("100s24x12s20xc188x155s12x")


def _parse_plain_sample(buf: bytes, wanted: frozenset[str] | None) -> tuple[str, dict[str, bytes]] | None:
    """:func:`parse_sample` for the common case, at a third of the cost per member: every member
    a regular file with an octal size and a name of its own (no extended header, no prefix), all
    of one key.  None for anything else, valid or not: the general parser then decides (and
    names what is wrong)."""
    end = len(buf)
    pos = 0
    key: str | None = None
    parts: dict[str, bytes] = {}
    seen: set[str] = set()  # every part, wanted or not: a repeated one is the general parser's error
    unpack = _PLAIN_HEADER.unpack_from
    while pos < end:
        if pos + BLOCK > end:
            return None
        name_field, size_field, typeflag, prefix = unpack(buf, pos)
        if typeflag not in (b"0", b"7") or prefix[0] or size_field[11:] not in (b"\0", b" "):
            return None
        digits = size_field[:11]
        if not digits.isdigit() or digits.strip(b"01234567"):
            return None
        size = int(digits, 8)
        nul = name_field.find(b"\0")
        name = (name_field if nul < 0 else name_field[:nul]).decode("utf-8", "surrogateescape")
        data_start = pos + BLOCK
        data_end = data_start + size
        if data_end > end:
            return None
        split = split_name(name)
        if split is not None:
            member_key, part = split
            if key is None:
                key = member_key
            elif member_key != key or part in seen:
                return None
            seen.add(part)
            if wanted is None or part in wanted:
                parts[part] = buf[data_start:data_end]
        pos = data_start + -(-size // BLOCK) * BLOCK
    return None if key is None else (key, parts)
