"""Local files: positional reads on pooled open descriptors, atomic writes."""

from __future__ import annotations

import errno
import logging
import os
import re
import time
from collections import OrderedDict
from pathlib import Path
from typing import Iterable

from ..errors import DatasetError, StorageError, format_message

logger = logging.getLogger(__name__)

#: Errors that mean the device (or the user's quota) has no room for what is being written.
_NO_ROOM = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
#: The name :func:`atomic_write_bytes` (and prepare's index build) gives a file being written.
_TEMPORARY_NAME = re.compile(r"^\..+\.tmp-(\d+)$")
#: A temporary file whose writer is not running on this machine is only removed once it is this
#: old: on a shared filesystem the writer may be a process of another machine.
STALE_TEMPORARY_SECONDS = 600.0


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


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Writes ``data`` to ``path`` through a temporary file and a rename.

    An interrupted write leaves the old file (or none) in place, never half a file.
    """
    path = Path(path)
    tmp = temporary_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        if is_no_room(exc):
            raise no_room_error(path, exc) from None
        raise
    finally:
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()


def temporary_name(path: Path) -> Path:
    """Where ``path`` is written before its atomic rename (found again by
    :func:`remove_stale_temporaries` if the writer dies)."""
    return path.with_name(temporary_basename(path.name, os.getpid()))


def temporary_basename(name: str, owner: int) -> str:
    """The temporary name of a file called ``name`` written for process ``owner`` (which may
    be a parent whose workers write for it): ``.NAME.tmp-PID``."""
    return f".{name}.tmp-{owner}"


def is_no_room(exc: BaseException) -> bool:
    """The device or quota is full (an OSError, or SQLite's "database or disk is full")."""
    if isinstance(exc, OSError):
        return exc.errno in _NO_ROOM
    return "disk is full" in str(exc)


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
    """Removes the temporary files a killed writer left in ``folders`` (``.NAME.tmp-PID``).

    A file is stale when its process is not running here and it has not been written to for
    :data:`STALE_TEMPORARY_SECONDS`. Returns what was removed (logged once).
    """
    removed: list[Path] = []
    now = time.time()
    for folder in folders:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            found = _TEMPORARY_NAME.match(entry.name)
            if found is None or _process_runs(int(found.group(1))):
                continue
            try:
                if now - entry.stat(follow_symlinks=False).st_mtime < STALE_TEMPORARY_SECONDS:
                    continue
                os.unlink(entry.path)
            except OSError:
                continue
            removed.append(Path(entry.path))
    if removed:
        logger.info(
            "removed %d temporary file(s) left by an interrupted run: %s",
            len(removed),
            ", ".join(str(p) for p in removed[:5]) + (" ..." if len(removed) > 5 else ""),
        )
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
