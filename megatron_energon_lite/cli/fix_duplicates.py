"""``prepare --fix-duplicates``: make sample keys unique by renaming tar members in place.

Energon's ``--fix-duplicates`` (its tar patcher) does this: when a sample key occurs in more than
one shard, every member ``name`` of every shard ``rel/path.tar`` is renamed to
``rel/path.tar/name``, so keys become ``rel/path.tar/<key>``.  Only the 512-byte headers are
rewritten (the new name and the header checksum), so the file sizes and every byte offset stay
the same and nothing is copied.

A shard can be renamed in place only if every header can hold its new name: a POSIX ``ustar``
header has 100 bytes of name and 155 bytes of prefix (split at a ``/``), a GNU or old-style
header 100 bytes of name.  Names held elsewhere (a GNU long-name entry, a pax ``path`` record)
and hard links (whose target would keep the old name) cannot be renamed in place; neither can a
shard that repeats a key in two separate places.  When any shard cannot be renamed, nothing is
changed and the command fails, naming the shard and the reason.

The scan reads only the headers (one seek per member), so it is cheap even for large shards.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError, DatasetError, format_message

__all__ = ["DuplicateScan", "apply_prefixes", "fix_duplicates", "scan_for_duplicates"]

BLOCK = 512
_NAME, _PREFIX = slice(0, 100), slice(345, 500)
#: pax records that carry a member's name: renaming the header would not rename the member.
_PAX_NAME_KEYS = (b"path", b"linkpath", b"gnu.path", b"gnu.linkpath", b"SCHILY.path", b"SCHILY.linkpath")


def _size(field_bytes: bytes) -> int:
    if field_bytes[0] & 0x80:  # base-256 (GNU/POSIX for sizes of 8 GiB and more)
        return int.from_bytes(bytes([field_bytes[0] & 0x7F]) + field_bytes[1:], "big")
    text = field_bytes.replace(b"\0", b" ").strip()
    return int(text, 8) if text else 0


def _cstring(field_bytes: bytes) -> bytes:
    end = field_bytes.find(b"\0")
    return field_bytes if end < 0 else field_bytes[:end]


def _is_posix_ustar(header: bytes) -> bool:
    return header[257:263] == b"ustar\0"


def _full_name(header: bytes) -> bytes:
    name = _cstring(header[_NAME])
    if _is_posix_ustar(header):
        prefix = _cstring(header[_PREFIX])
        if prefix:
            return prefix + b"/" + name
    return name


def _split_ustar(path: bytes) -> tuple[bytes, bytes] | None:
    """(prefix, name) fields for ``path`` in a POSIX header, or None if it does not fit."""
    if len(path) <= 100:
        return b"", path
    cut = path.rfind(b"/", 0, 156)  # the longest prefix (<= 155 bytes), the shortest name
    if cut <= 0 or len(path) - cut - 1 > 100:
        return None
    return path[:cut], path[cut + 1 :]


def _sample_key(name: bytes) -> bytes:
    """The sample key of a member name: up to the first dot of its last path component."""
    slash = name.rfind(b"/")
    dot = name.find(b".", slash + 1)
    return name[:dot] if dot >= 0 else b""


def _pax_has_name(data: bytes) -> bool:
    position = 0
    while position < len(data):
        space = data.find(b" ", position)
        if space < 0:
            break
        try:
            length = int(data[position:space])
        except ValueError:
            break
        record = data[space + 1 : position + length - 1]
        if record.split(b"=", 1)[0] in _PAX_NAME_KEYS:
            return True
        position += max(length, 1)
    return False


def _headers(path: Path):
    """Yields ``(offset, header)`` of every header block of a tar, and pax data when there is."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        offset = 0
        while offset + BLOCK <= size:
            f.seek(offset)
            header = f.read(BLOCK)
            if header == bytes(BLOCK):
                return
            length = _size(header[124:136])
            pax = f.read(length) if header[156:157] in (b"x", b"g") else None
            yield offset, header, pax
            offset += BLOCK + -(-length // BLOCK) * BLOCK
    if offset > size:
        raise DatasetError(format_message("the tar ends inside a member (truncated)", where=str(path), fix="restore the shard"))


@dataclass
class ShardScan:
    keys: list[str] = field(default_factory=list)  # sample keys, in tar order
    problem: str | None = None  # why the shard cannot be renamed in place


def _scan_shard(path: Path, prefix: bytes) -> ShardScan:
    scan = ShardScan()
    last = None
    for _, header, pax in _headers(path):
        kind = header[156:157]
        if kind in (b"L", b"K"):
            scan.problem = scan.problem or "it has GNU long-name entries (names over 100 bytes)"
            continue
        if kind in (b"x", b"g"):
            if _pax_has_name(pax or b""):
                scan.problem = scan.problem or "pax headers hold member names"
            continue
        if kind == b"1":
            scan.problem = scan.problem or "it has hard links, whose targets would keep the old names"
        name = _full_name(header)
        new = prefix + name
        fits = _split_ustar(new) is not None if _is_posix_ustar(header) else len(new) <= 100
        if not fits:
            scan.problem = scan.problem or f"the new name {new.decode(errors='replace')!r} does not fit in its tar header"
        key = _sample_key(name)
        if key and key != last:
            scan.keys.append(key.decode("utf-8", errors="surrogateescape"))
            last = key
    if len(set(scan.keys)) != len(scan.keys):
        scan.problem = scan.problem or "it repeats a sample key in two separate places"
    return scan


@dataclass
class DuplicateScan:
    """Which keys occur in more than one shard, and which shards cannot be renamed in place."""

    duplicates: dict[str, list[str]]  # key -> shards holding it
    problems: dict[str, str]  # shard -> why it cannot be renamed in place


def _prefix(name: str) -> bytes:
    return (name.rstrip("/") + "/").encode()


def scan_for_duplicates(root: Path, shards: list[str]) -> DuplicateScan:
    """Reads the headers of ``shards`` (paths relative to ``root``)."""
    owner: dict[str, str] = {}
    duplicates: dict[str, list[str]] = {}
    problems: dict[str, str] = {}
    for name in shards:
        scan = _scan_shard(root / name, _prefix(name))
        if scan.problem:
            problems[name] = scan.problem
        for key in scan.keys:
            first = owner.setdefault(key, name)
            if first != name:
                duplicates.setdefault(key, [first]).append(name)
    return DuplicateScan(duplicates, problems)


def _checksum(header: bytearray) -> bytes:
    total = sum(header[:148]) + 8 * 32 + sum(header[156:])
    return b"%06o\0 " % total


def _rename_shard(path: Path, prefix: bytes) -> None:
    patched: list[tuple[int, bytes]] = []
    for offset, header, _ in _headers(path):
        if header[156:157] in (b"x", b"g"):
            continue
        new = bytearray(header)
        full = prefix + _full_name(header)
        if _is_posix_ustar(header):
            fields = _split_ustar(full)
            if fields is None:  # checked by the scan; a changed file fails here before any write
                raise DatasetError(format_message("a member name does not fit after the rename", where=str(path), found=full.decode(errors="replace")))
            new[_PREFIX] = fields[0].ljust(155, b"\0")
            new[_NAME] = fields[1].ljust(100, b"\0")
        else:
            new[_NAME] = full.ljust(100, b"\0")
        new[148:156] = _checksum(new)
        patched.append((offset, bytes(new)))
    with open(path, "r+b") as f:
        for offset, header in patched:
            f.seek(offset)
            f.write(header)


def apply_prefixes(root: Path, shards: list[str]) -> None:
    """Renames every member of every shard to ``<shard path>/<name>``, in place."""
    for name in shards:
        _rename_shard(root / name, _prefix(name))


def fix_duplicates(root: Path, shards: list[str]) -> str:
    """Energon's ``--fix-duplicates``: renames in place if keys repeat across shards.

    Returns what was done, for the CLI to print.  Raises :class:`DatasetError` (nothing changed)
    when keys repeat but a shard cannot be renamed in place.
    """
    if not isinstance(root, Path):
        raise ConfigError(
            format_message(
                "--fix-duplicates renames tar members in place and needs a local dataset",
                found=str(root),
                fix="run it where the shards are on a local disk, then upload them again",
            )
        )
    scan = scan_for_duplicates(root, shards)
    if not scan.duplicates:
        return "No duplicate keys found, continuing."
    examples = ", ".join(f"{key!r} in {' and '.join(where[:2])}" for key, where in list(scan.duplicates.items())[:3])
    if scan.problems:
        shown = "; ".join(f"{name}: {problem}" for name, problem in list(scan.problems.items())[:5])
        raise DatasetError(
            format_message(
                f"{len(scan.duplicates)} sample key(s) occur in more than one shard, and the shards cannot be renamed in place; nothing was changed",
                found=f"duplicates such as {examples}; {shown}",
                fix="rename the samples when writing the shards (e.g. prefix keys with the shard name)",
            )
        )
    apply_prefixes(root, shards)
    return f"Renamed the members of {len(shards)} shards to <shard>/<name>: {len(scan.duplicates)} duplicate key(s) such as {examples} are now unique."
