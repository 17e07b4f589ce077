"""One way to name data: a local :class:`pathlib.Path` or a :class:`RemotePath`, and the few
operations whose local and remote forms differ (pooled reads, atomic writes, local copies for
code that needs a real file such as SQLite or mmap, stats for staleness checks)."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from stat import S_ISDIR
from typing import Any, Iterator, Mapping, Union

from ..errors import StorageError, format_message
from .dss import DSS_PREFIX, cache_parts, dataset_cache_dir, dss_url, missing_cache_error, split_dss_url
from .local import LocalFilePool, create_temporary_folder
from .local import atomic_write_bytes as _local_atomic_write
from .remote import (
    RemoteFilePool,
    RemotePath,
    RemoteSettings,
    RemoteStat,
    is_url,
    stat_from_info,
)

AnyPath = Union[Path, RemotePath]

# Prepare copies a remote tar to local disk in pieces of this size (retries resume per piece).
DOWNLOAD_PIECE = 64 << 20


def as_path(value: Any, storage_options: Mapping[str, Any] | None = None, settings: RemoteSettings | None = None) -> AnyPath:
    """``s3://…``, ``msc://…`` and other URLs -> :class:`RemotePath`; anything else -> ``Path``.

    A :class:`RemotePath` passes through unchanged (it keeps its own options); ``file://`` URLs
    are local paths.  ``dss://NAME@VERSION/path`` (Energon's dataset-cache URL) is the folder
    ``NAME/VERSION/path`` in ``NVDATASET_CACHE_DIR``, local or remote as that folder is; without
    the variable it is a :class:`~megatron_energon_lite.errors.ConfigError` (see :mod:`.dss`).
    """
    if isinstance(value, RemotePath):
        return value
    if isinstance(value, Path):
        return value
    storage_path = getattr(value, "storage_path", None)
    if callable(storage_path):  # an EPath: local or remote, it knows its storage-layer path
        return storage_path()
    text = os.fspath(value)
    if text.startswith(DSS_PREFIX):
        return dss_path(split_dss_url(text), dataset_cache_dir())
    if is_url(text):
        return RemotePath(text, storage_options, settings)
    if text.startswith("file://"):
        text = text[len("file://") :]
    return Path(text)


def dss_path(internal_path: PurePosixPath, cache_dir: Any) -> AnyPath:
    """What ``internal_path`` (``/NAME@VERSION/a``, a parsed ``dss://`` URL) names in the dataset
    cache folder ``cache_dir`` (anything :func:`as_path` takes): ``NAME/VERSION/a`` there.
    Without a cache folder (None) it is a ConfigError that names ``NVDATASET_CACHE_DIR``."""
    if cache_dir is None:
        raise missing_cache_error(dss_url(internal_path))
    base = as_path(cache_dir)
    for part in cache_parts(internal_path):
        base = base / part
    return base


def is_remote(path: Any) -> bool:
    return isinstance(path, RemotePath) or is_url(path)


def file_pool(root: AnyPath) -> LocalFilePool | RemoteFilePool:
    """The reader a dataset at ``root`` needs (one per process)."""
    return RemoteFilePool(root.settings) if isinstance(root, RemotePath) else LocalFilePool()


def atomic_write_bytes(path: str | os.PathLike | RemotePath, data: bytes, *, durable: bool = True) -> None:
    """Replaces ``path`` with ``data`` all at once: rename locally, one PUT remotely.  Locally,
    ``durable=False`` leaves flushing the data to the device to the caller (who syncs many
    files at once)."""
    if isinstance(path, RemotePath):
        path.write_bytes(data)
    else:
        _local_atomic_write(path, data, durable=durable)


def atomic_write_text(path: str | os.PathLike | RemotePath, text: str, *, durable: bool = True) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), durable=durable)


def replace_with(path: AnyPath, local: Path) -> None:
    """Moves the finished local file ``local`` to ``path`` (a rename, or an upload)."""
    if isinstance(path, RemotePath):
        path.upload(local)
        local.unlink()
    else:
        os.replace(local, path)


@dataclass(frozen=True, slots=True)
class FileStat:
    """Size and version of a file: mtime for local files, ETag for objects."""

    size: int
    version: str


def list_files(root: AnyPath, names: list[str]) -> dict[str, FileStat]:
    """Stats of the ``names`` (relative to ``root``) that exist: one listing per folder remotely."""
    found: dict[str, FileStat] = {}
    if isinstance(root, RemotePath):
        folders: dict[str, list[str]] = {}
        for name in names:
            folders.setdefault(os.path.dirname(name), []).append(name)
        for folder, members in folders.items():
            listing = _listing(root / folder if folder else root)
            for name in members:
                entry = listing.get(os.path.basename(name))
                if entry is not None and not entry.is_dir:
                    found[name] = FileStat(entry.size, entry.version)
        return found
    base = os.fspath(root)
    for name in names:  # one stat each, plain strings: 10,000 shards cost a few ms
        try:
            stat = os.stat(os.path.join(base, name))
        except (FileNotFoundError, NotADirectoryError):
            continue
        if not S_ISDIR(stat.st_mode):
            found[name] = FileStat(stat.st_size, str(stat.st_mtime_ns))
    return found


def _listing(folder: RemotePath) -> dict[str, RemoteStat]:
    fs = folder.fs
    fs.invalidate_cache(folder.url)  # sizes and ETags decide staleness: never from an old listing
    try:
        entries = folder._call("list", lambda: fs.ls(folder.url, detail=True))
    except FileNotFoundError:
        return {}
    return {entry["name"].rstrip("/").rsplit("/", 1)[-1]: stat_from_info(entry) for entry in entries}


def file_stat(path: AnyPath) -> FileStat | None:
    """Size and version of the file ``path``, None when there is none: one ``stat`` locally, one
    request (HEAD) for an object, never a listing of its folder."""
    if isinstance(path, RemotePath):
        stat = path.head()
        return None if stat is None else FileStat(stat.size, stat.version)
    return list_files(path.parent, [path.name]).get(path.name)


def cached_copy(path: RemotePath, stat: FileStat | None = None) -> Path:
    """A local copy of a small remote file (an index), fetched once per URL and version.

    The cache key is the URL with the object's ETag and size, so a changed object is fetched
    again and an unchanged one never is.
    """
    stat = stat or file_stat(path)
    if stat is None:
        raise FileNotFoundError(path.url)
    key = hashlib.sha256(f"{path.url}\0{stat.version}\0{stat.size}".encode()).hexdigest()[:40]
    folder = Path(path.settings.resolved_cache_dir()) / key[:2]
    local = folder / f"{key}-{path.name}"
    try:
        if local.is_file() and local.stat().st_size == stat.size:
            return local
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _cache_error(folder, exc) from None
    data = path.read_range(0, stat.size) if stat.size else b""
    try:
        _local_atomic_write(local, data)
    except OSError as exc:
        raise _cache_error(folder, exc) from None
    return local


def local_view(path: Any) -> Path | None:
    """A local file with ``path``'s content for readers that need one (SQLite), or None if it
    does not exist: the file itself locally, a cached copy of a remote object."""
    path = as_path(path)
    if isinstance(path, RemotePath):
        stat = file_stat(path)
        return None if stat is None else cached_copy(path, stat)
    return path if path.is_file() else None


def _cache_error(folder: Path, exc: OSError) -> StorageError:
    return StorageError(
        format_message(
            "the local cache for remote index files is not usable",
            where=str(folder),
            found=f"{type(exc).__name__}: {exc}",
            fix="set ENERGON_LITE_CACHE_DIR (or RemoteSettings(cache_dir=...)) to a writable folder",
        )
    )


@contextmanager
def local_file(path: AnyPath, stat: FileStat | None = None) -> Iterator[Path]:
    """``path`` itself when local; a temporary local copy of a remote file, streamed in pieces."""
    if not isinstance(path, RemotePath):
        yield path
        return
    size = (stat or file_stat(path) or _missing(path)).size
    with tempfile.TemporaryDirectory(prefix="energon-lite-") as tmp:
        local = Path(tmp) / path.name
        with open(local, "wb") as f:
            for start in range(0, size, DOWNLOAD_PIECE):
                f.write(path.read_range(start, min(size, start + DOWNLOAD_PIECE)))
        yield local


def _missing(path: RemotePath):
    raise FileNotFoundError(path.url)


def local_scratch(path: AnyPath) -> Path:
    """A new private local folder to build ``path`` (and what SQLite writes beside it) in before
    it is moved into place: beside ``path`` locally (the same filesystem, so the move is a
    rename; see :func:`~.local.create_temporary_folder`), else under the system's temp folder.
    Remove it with :func:`remove_scratch` when done."""
    if isinstance(path, RemotePath):
        return Path(tempfile.mkdtemp(prefix="energon-lite-"))
    return create_temporary_folder(path)


def remove_scratch(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
