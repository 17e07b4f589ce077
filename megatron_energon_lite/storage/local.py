"""Local files: positional reads on pooled open descriptors, atomic writes."""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

from ..errors import DatasetError, format_message


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
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))
