"""Local files: positional reads on pooled open descriptors, atomic writes."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import secrets
import shutil
import socket
import sqlite3
import time
from collections import OrderedDict
from pathlib import Path
from typing import Callable, Iterable, Iterator

from ..errors import DatasetError, StorageError, format_message

logger = logging.getLogger(__name__)

#: Errors that mean the device (or the user's quota) has no room for what is being written.
_NO_ROOM = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
#: This machine, as it appears in temporary names (letters, digits, dots; at most 32 characters).
_HOST = re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname())[:32] or "host"
#: A temporary file or folder: ``.NAME.tmp-PID-HOST-RANDOM`` (the writer's process id and machine,
#: and a random part so that each is made fresh), or an older version's ``.NAME.tmp-PID``.
_TEMPORARY_NAME = re.compile(r"^\..+\.tmp-(\d+)(?:-([A-Za-z0-9._]+)-[0-9a-f]{8})?$")
#: A temporary written on another machine (a shared filesystem), where we cannot tell whether
#: its writer still runs, is only removed once it has not been written to for this long.
STALE_TEMPORARY_SECONDS = 600.0
#: Flags of a new temporary file: created here or not at all (a name planted at it, such as a
#: symlink into another folder, is never followed or written through).
_EXCLUSIVE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class LocalFilePool:
    """Keeps up to ``max_open`` files open and reads byte ranges with ``os.pread``.

    One pool per process (a forked worker must not share a parent's descriptors' offsets; pread
    has no offset, so sharing is safe, but each worker opens lazily on first use anyway).
    """

    def __init__(self, max_open: int = 64) -> None:
        self._max_open = max_open
        self._fds: OrderedDict[str, int] = OrderedDict()

    def _fd(self, path: str) -> int:
        fd = self._fds.get(path)
        if fd is not None:
            self._fds.move_to_end(path)
            return fd
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise DatasetError(
                format_message(
                    "shard file not found",
                    where=path,
                    fix="restore the file, or re-run `energon-lite prepare` if it was removed "
                    "on purpose",
                )
            ) from None
        self._fds[path] = fd
        while len(self._fds) > self._max_open:
            _, old = self._fds.popitem(last=False)
            os.close(old)
        return fd

    def read(self, path: str | os.PathLike, offset: int, size: int, readahead_end: int | None = None) -> bytes:
        """Reads exactly ``size`` bytes at ``offset``; a short read is a :class:`DatasetError`.

        ``readahead_end`` is ignored: the kernel's page cache reads ahead for local files.
        """
        path = os.fspath(path)
        data = os.pread(self._fd(path), size, offset)
        if len(data) != size:
            raise DatasetError(
                format_message(
                    "file is shorter than its index says",
                    where=f"{path} bytes {offset}..{offset + size}",
                    expected=f"{size} bytes",
                    found=f"{len(data)} bytes",
                    fix="the shard was truncated or replaced; run `energon-lite prepare` again",
                )
            )
        return data

    def close(self) -> None:
        while self._fds:
            _, fd = self._fds.popitem()
            os.close(fd)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: nothing useful to do
            pass


def atomic_write_bytes(path: str | os.PathLike, data: bytes, *, durable: bool = True) -> None:
    """Writes ``data`` to ``path`` through a fresh temporary file and a rename.

    An interrupted write leaves the old file (or none) in place, never half a file; ``durable``
    flushes the data to the device before the rename.  A full device is a :class:`StorageError`
    naming ``path``.
    """
    with reporting_no_room(path):
        replace_atomically(path, data, durable=durable)


def replace_atomically(path: str | os.PathLike, data: bytes | memoryview, *, durable: bool) -> None:
    """:func:`atomic_write_bytes` with the ``OSError`` as raised (for callers that handle a full
    device themselves: a cache that then reads without caching)."""
    fd, tmp = create_temporary(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def create_temporary(path: str | os.PathLike, *, owner: int | None = None) -> tuple[int, Path]:
    """Creates a new, empty file beside ``path`` to write it under before the rename into place:
    returns an open descriptor (for writing) and its path.

    The file is made exclusively under a new random name: whatever sits at a name we might use
    (a symlink planted by someone who can write the folder, a killed run's file) is never opened.
    ``owner`` is the process id the name records (default: this process), the one whose end
    makes the file a leftover (:func:`remove_stale_temporaries`): prepare's workers write for
    the main process.
    """
    path = Path(path)
    while True:
        candidate = path.with_name(temporary_basename(path.name, owner))
        try:
            return os.open(candidate, _EXCLUSIVE, 0o666), candidate
        except FileExistsError:
            continue  # a 1-in-4-billion clash, or a planted name: draw another


def create_temporary_folder(path: str | os.PathLike, *, owner: int | None = None) -> Path:
    """A new private folder beside ``path`` (named like its temporary file), for a file that
    another library creates by name (SQLite and its journal): build it as ``folder / NAME``,
    rename that into place, then remove the folder.  Made exclusively, like
    :func:`create_temporary`, and only its owner can write into it."""
    path = Path(path)
    while True:
        candidate = path.with_name(temporary_basename(path.name, owner))
        try:
            candidate.mkdir(mode=0o700)
            return candidate
        except FileExistsError:
            continue


def temporary_basename(name: str, owner: int | None = None) -> str:
    """A new temporary name for a file called ``name`` written for process ``owner`` (default:
    this one): ``.NAME.tmp-PID-HOST-RANDOM``."""
    return f".{name}.tmp-{os.getpid() if owner is None else owner}-{_HOST}-{secrets.token_hex(4)}"


def is_no_room(exc: BaseException) -> bool:
    """The device or quota is full (an OSError, or SQLite's "database or disk is full")."""
    if isinstance(exc, OSError):
        return exc.errno in _NO_ROOM
    return "disk is full" in str(exc)


@contextlib.contextmanager
def reporting_no_room(path: str | os.PathLike) -> Iterator[None]:
    """A full device inside the block (an ``OSError``, or SQLite's "database or disk is full")
    becomes the :class:`StorageError` naming ``path`` and the fix; other errors pass."""
    try:
        yield
    except (OSError, sqlite3.Error) as exc:
        if is_no_room(exc):
            raise no_room_error(path, exc) from None
        raise


def no_room_error(path: str | os.PathLike, exc: BaseException) -> StorageError:
    return StorageError(
        format_message(
            "no room left on the device to write a file",
            where=str(path),
            found=f"{type(exc).__name__}: {exc}",
            fix="free space on that filesystem (or raise the quota) and run the command again; "
            "files are replaced atomically, so the previous version of each is still in place",
        )
    )


def remove_stale_temporaries(folders: Iterable[str | os.PathLike]) -> list[Path]:
    """Removes the temporary files and folders a killed writer left in ``folders``.

    A temporary is left over when it was written on this machine for a process that no longer
    runs.  One written on another machine (the name records it; a shared filesystem), or named
    by an older version without the machine, is left over once it has not been written to for
    :data:`STALE_TEMPORARY_SECONDS`: its writer may still be running there.  Returns what was
    removed (logged once).
    """
    now = time.time()

    def stale(entry: os.DirEntry, owner: int, host: str | None) -> bool:
        if _process_runs(owner):
            return False
        return host == _HOST or now - entry.stat(follow_symlinks=False).st_mtime >= STALE_TEMPORARY_SECONDS

    removed = _remove_temporaries(folders, stale)
    if removed:
        logger.info(
            "removed %d temporary file(s) left by an interrupted run: %s",
            len(removed),
            ", ".join(str(p) for p in removed[:5]) + (" ..." if len(removed) > 5 else ""),
        )
    return removed


def remove_own_temporaries(folders: Iterable[str | os.PathLike], owner: int) -> list[Path]:
    """Removes the temporaries written on this machine for process ``owner`` in ``folders`` (what
    a failed run of ``owner`` cleans up after itself)."""
    return _remove_temporaries(folders, lambda _entry, pid, host: pid == owner and host == _HOST)


def _remove_temporaries(folders: Iterable[str | os.PathLike], chosen: Callable[[os.DirEntry, int, str | None], bool]) -> list[Path]:
    """Removes the temporaries in ``folders`` for which ``chosen(entry, owner pid, host)``."""
    removed: list[Path] = []
    for folder in folders:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            found = _TEMPORARY_NAME.match(entry.name)
            try:
                if found is None or not chosen(entry, int(found.group(1)), found.group(2)):
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
            except OSError:
                continue
            removed.append(Path(entry.path))
    return removed


def _process_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. not ours to signal: it runs
        return True
    return True


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))
