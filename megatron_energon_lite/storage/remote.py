"""Object storage through fsspec: remote paths, ranged reads with read-ahead and retries.

``s3://bucket/prefix`` goes through s3fs (the ``s3`` extra), ``msc://profile/path`` through
Multi-Storage Client when it is installed (it registers the ``msc`` protocol with fsspec), any
other fsspec URL through its own implementation.  Credentials and endpoints are whatever the
implementation reads (for S3: ``AWS_ENDPOINT_URL``, ``AWS_PROFILE`` and the usual credential
chain), overridden by an explicit ``storage_options`` dict.

A :class:`RemotePath` has the small part of :class:`pathlib.Path`'s interface the format code
uses, so the same functions read local and remote datasets.  Sample bytes are read through a
:class:`RemoteFilePool`: one ranged GET per block, blocks reach ahead up to the end of the slice
being read, and every GET is retried with backoff, resuming at the first byte not yet received.
The pool can also fetch ranges in the background (:meth:`RemoteFilePool.prefetch`), on a few
threads it starts in the process that first asks for one: a loader worker requests the slices
it reads next while it reads the current one.
"""

from __future__ import annotations

import logging
import os
import posixpath
import random
import threading
import time
import weakref
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Callable, Iterator, Mapping, TypeVar

from ..errors import (
    EnergonLiteError,
    MissingDependencyError,
    StorageError,
    format_message,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

MiB = 1 << 20

# The package that serves a protocol, for the error when it is missing.
_PROTOCOL_PACKAGES = {
    "s3": "pip install 'megatron-energon-lite[s3]'",
    "s3a": "pip install 'megatron-energon-lite[s3]'",
    "msc": "pip install 'megatron-energon-lite[msc]'",
    "gs": "pip install gcsfs",
    "gcs": "pip install gcsfs",
    "az": "pip install adlfs",
    "abfs": "pip install adlfs",
}

# Errors that no retry can fix: the object is not there, we may not read it, or the call is wrong.
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, EnergonLiteError, ValueError, TypeError, NotImplementedError)
_CREDENTIAL_ERRORS = ("NoCredentialsError", "PartialCredentialsError", "NoRegionError", "ProfileNotFound")


def _env_number(name: str, default: T, kind: Callable[[str], T]) -> T:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return kind(value)
    except ValueError:
        raise StorageError(format_message(f"invalid {name}", expected=f"a number ({kind.__name__})", found=repr(value))) from None


@dataclass(frozen=True)
class RemoteSettings:
    """How remote data is read; defaults come from ``ENERGON_LITE_*`` environment variables.

    ``block_size``: bytes one GET reads ahead within a slice (``ENERGON_LITE_BLOCK_SIZE``).
    ``readahead_bytes``: most bytes a worker keeps read ahead, over all the slices it reads at
    once (``ENERGON_LITE_READAHEAD_BYTES``).  ``max_attempts``: tries per request before :class:`StorageError`
    (``ENERGON_LITE_MAX_ATTEMPTS``).  ``backoff_s`` (``ENERGON_LITE_BACKOFF_S``)/``max_backoff_s``:
    exponential backoff with full jitter between tries.  ``cache_dir``: where index files are cached
    (``ENERGON_LITE_CACHE_DIR``, default ``~/.cache/megatron_energon_lite``).  ``prefetch_slices``:
    how many slices past the ones it is reading a worker requests in the background (index and
    data; ``ENERGON_LITE_PREFETCH_SLICES``, ``0``: none), within ``readahead_bytes``.
    ``whole_shard_bytes``: a shard read whole (with prefetch) that is at most this big is fetched
    in one GET and its samples found from its tar headers, with no ``.tar.idx`` request
    (``ENERGON_LITE_WHOLE_SHARD_BYTES``, ``0``: never); each such GET holds up to this many bytes.
    """

    block_size: int = 4 * MiB
    readahead_bytes: int = 64 * MiB
    prefetch_slices: int = 8
    whole_shard_bytes: int = 1 * MiB
    max_attempts: int = 8
    backoff_s: float = 0.05
    max_backoff_s: float = 5.0
    cache_dir: str | None = None

    @classmethod
    def from_env(cls) -> "RemoteSettings":
        return cls(
            block_size=_env_number("ENERGON_LITE_BLOCK_SIZE", cls.block_size, int),
            readahead_bytes=_env_number("ENERGON_LITE_READAHEAD_BYTES", cls.readahead_bytes, int),
            max_attempts=_env_number("ENERGON_LITE_MAX_ATTEMPTS", cls.max_attempts, int),
            backoff_s=_env_number("ENERGON_LITE_BACKOFF_S", cls.backoff_s, float),
            prefetch_slices=_env_number("ENERGON_LITE_PREFETCH_SLICES", cls.prefetch_slices, int),
            whole_shard_bytes=_env_number("ENERGON_LITE_WHOLE_SHARD_BYTES", cls.whole_shard_bytes, int),
            cache_dir=os.environ.get("ENERGON_LITE_CACHE_DIR"),
        )

    def resolved_cache_dir(self) -> str:
        if self.cache_dir:
            return self.cache_dir
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return os.path.join(base, "megatron_energon_lite")


# Per-protocol defaults set by configure_storage (e.g. from get_train_dataset(storage_options=...)).
_CONFIGURED: dict[str, tuple[dict[str, Any], "RemoteSettings | None"]] = {}


def configure_storage(protocol: str, *, storage_options: Mapping[str, Any] | None = None, settings: "RemoteSettings | None" = None) -> None:
    """Sets the options every ``protocol://`` path of this process uses unless given its own;
    ``"*"`` stands for every protocol without an entry of its own.

    The loader calls it for ``get_train_dataset(..., storage_options=...)`` in the main process
    and again in each worker, so paths named inside metadataset YAML files get the same options.
    """
    _CONFIGURED[protocol] = (dict(storage_options or {}), settings)


def configured_storage() -> dict[str, tuple[dict[str, Any], "RemoteSettings | None"]]:
    return dict(_CONFIGURED)


def is_url(value: Any) -> bool:
    return isinstance(value, str) and "://" in value and not value.startswith("file://")


def filesystem(protocol: str, storage_options: Mapping[str, Any] | None = None):
    """The fsspec filesystem for ``protocol`` (fsspec caches one per process and options)."""
    try:
        import fsspec
    except ImportError:
        raise MissingDependencyError(_missing(protocol)) from None
    try:
        return fsspec.filesystem(protocol, **dict(storage_options or {}))
    except ImportError:
        raise MissingDependencyError(_missing(protocol)) from None
    except ValueError as exc:
        if "not known" in str(exc) or "Protocol" in str(exc):
            raise MissingDependencyError(_missing(protocol)) from None
        raise


def _missing(protocol: str) -> str:
    return format_message(
        f"no storage implementation for {protocol}:// URLs is installed",
        fix=_PROTOCOL_PACKAGES.get(protocol, f"install the fsspec implementation of {protocol}://"),
    )


@dataclass(frozen=True, slots=True)
class RemoteStat:
    """What a listing says of an object: its size and a version tag (ETag when there is one)."""

    size: int
    version: str
    is_dir: bool = False

    @property
    def st_size(self) -> int:  # so callers can treat it like os.stat_result
        return self.size


def stat_from_info(info: Mapping[str, Any]) -> RemoteStat:
    tag = info.get("ETag") or info.get("etag") or info.get("LastModified") or info.get("mtime") or ""
    return RemoteStat(int(info.get("size") or 0), str(tag).strip('"'), info.get("type") == "directory")


class RemotePath:
    """An object-store URL with the parts of :class:`pathlib.Path` the format code needs.

    Picklable: it carries the URL, the storage options and the settings, never a connection, so
    it can cross into dataloader workers (each process opens its own filesystem).
    """

    __slots__ = ("protocol", "key", "storage_options", "settings")

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None, settings: RemoteSettings | None = None) -> None:
        protocol, sep, rest = url.partition("://")
        if not sep or not protocol or not rest.strip("/"):
            raise StorageError(format_message("invalid storage URL", expected="SCHEME://bucket/path, e.g. s3://bucket/dataset", found=repr(url)))
        self.protocol = protocol
        self.key = posixpath.normpath(rest).strip("/")
        default_options, default_settings = _CONFIGURED.get(protocol) or _CONFIGURED.get("*") or ({}, None)
        self.storage_options = dict(default_options if storage_options is None else storage_options)
        self.settings = settings or default_settings or RemoteSettings.from_env()

    # --- identity --------------------------------------------------------------------------
    def __reduce__(self):
        return (RemotePath, (self.url, self.storage_options, self.settings))

    @property
    def url(self) -> str:
        return f"{self.protocol}://{self.key}"

    def __str__(self) -> str:
        return self.url

    def __fspath__(self) -> str:
        # Not a local path: code that needs one (mmap, sqlite, os.open) must fetch a local copy.
        raise TypeError(f"{self.url} is remote; it has no local file system path")

    def __repr__(self) -> str:
        return f"RemotePath({self.url!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemotePath) and other.url == self.url

    def __hash__(self) -> int:
        return hash(self.url)

    def __lt__(self, other: "RemotePath") -> bool:
        return self.url < other.url

    def _derive(self, key: str) -> "RemotePath":
        return RemotePath(f"{self.protocol}://{key}", self.storage_options, self.settings)

    # --- pure path operations ----------------------------------------------------------------
    def __truediv__(self, other: str | os.PathLike) -> "RemotePath":
        part = os.fspath(other)
        if is_url(part):
            return RemotePath(part, self.storage_options, self.settings)
        return self._derive(posixpath.join(self.key, part))

    @property
    def name(self) -> str:
        return posixpath.basename(self.key)

    @property
    def suffix(self) -> str:
        return PurePosixPath(self.key).suffix

    @property
    def stem(self) -> str:
        return PurePosixPath(self.key).stem

    @property
    def parent(self) -> "RemotePath":
        parent = posixpath.dirname(self.key)
        return self._derive(parent) if parent else self

    def with_suffix(self, suffix: str) -> "RemotePath":
        return self._derive(str(PurePosixPath(self.key).with_suffix(suffix)))

    def with_name(self, name: str) -> "RemotePath":
        return self._derive(str(PurePosixPath(self.key).with_name(name)))

    def relative_to(self, other: "RemotePath") -> PurePosixPath:
        return PurePosixPath(self.key).relative_to(other.key)

    def is_absolute(self) -> bool:
        return True

    def resolve(self) -> "RemotePath":
        return self

    def as_posix(self) -> str:
        return self.url

    # --- storage operations ------------------------------------------------------------------
    @property
    def fs(self):
        return filesystem(self.protocol, self.storage_options)

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        return with_retries(fn, what=f"{what} {self.url}", settings=self.settings)

    def stat(self) -> RemoteStat:
        return stat_from_info(self._call("stat", lambda: self.fs.info(self.url)))

    def exists(self) -> bool:
        return self._call("check", lambda: self.fs.exists(self.url))

    def head(self) -> RemoteStat | None:
        """The object's size and version from one request (an S3 ``HEAD``), None when there is no
        object of this name; never a listing (s3fs's ``info`` lists the prefix after a 404 to
        find a folder: a second request that a check for a file does not need)."""
        fs = self.fs
        if self.protocol in ("s3", "s3a") and callable(getattr(fs, "call_s3", None)):
            bucket, _, key = self.key.partition("/")
            if not key:
                return None  # a bucket is not an object

            def head() -> Any:
                read_counters.requests += 1
                return fs.call_s3("head_object", Bucket=bucket, Key=key)

            try:
                found = self._call("stat", head)
            except FileNotFoundError:
                return None
            return RemoteStat(int(found.get("ContentLength") or 0), str(found.get("ETag") or found.get("LastModified") or "").strip('"'))
        fs.invalidate_cache(self.url)  # sizes and versions decide staleness: never from an old listing
        try:
            stat = self.stat()
        except FileNotFoundError:
            return None
        return None if stat.is_dir else stat

    def is_file(self) -> bool:
        return self.head() is not None

    def is_dir(self) -> bool:
        return self._call("check", lambda: self.fs.isdir(self.url))

    def read_bytes(self) -> bytes:
        """The whole object in one GET (a missing object: ``FileNotFoundError``, at once)."""
        return fetch_object(self)

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    def write_bytes(self, data: bytes) -> None:
        # One PUT: an object store replaces an object atomically.
        self._call("write", lambda: self.fs.pipe_file(self.url, bytes(data)))

    def write_text(self, text: str, encoding: str = "utf-8") -> None:
        self.write_bytes(text.encode(encoding))

    def upload(self, local: str | os.PathLike) -> None:
        self._call("upload", lambda: self.fs.put_file(os.fspath(local), self.url))

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """Object stores have no folders: a key prefix exists once an object is written under it."""

    def unlink(self, missing_ok: bool = False) -> None:
        try:
            self._call("delete", lambda: self.fs.rm_file(self.url))
        except FileNotFoundError:
            if not missing_ok:
                raise

    def iterdir(self) -> Iterator["RemotePath"]:
        for name in self._call("list", lambda: self.fs.ls(self.url, detail=False)):
            yield self._derive(name.split("://", 1)[-1].strip("/"))

    def glob(self, pattern: str) -> Iterator["RemotePath"]:
        found = self._call("list", lambda: self.fs.glob(posixpath.join(self.url, pattern)))
        for name in sorted(found):
            yield self._derive(name.split("://", 1)[-1].strip("/"))

    def list_files(self) -> dict[str, RemoteStat]:
        """Every object under this prefix: relative key -> stat, in one recursive listing."""
        found = self._call("list", lambda: self.fs.find(self.url, detail=True))
        prefix = self.key + "/"
        files = {}
        for name, info in found.items():
            key = name.split("://", 1)[-1].strip("/")
            if key.startswith(prefix) and info.get("type") != "directory":
                files[key[len(prefix):]] = stat_from_info(info)
        return files

    def read_range(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)``: ranged GETs, retried, resumed at the first byte not received."""
        return fetch_range(self, start, end)


# --- retries -------------------------------------------------------------------------------


def _is_credential_error(exc: BaseException) -> bool:
    """Missing credentials, also when a client wraps the botocore error (MSC raises a
    RuntimeError whose cause, or message, names it)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        name = type(exc).__name__
        if name in _CREDENTIAL_ERRORS or any(f"error type: {n}" in str(exc) for n in _CREDENTIAL_ERRORS):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _permanent(exc: BaseException) -> bool:
    return isinstance(exc, _PERMANENT) or _is_credential_error(exc)


def _credentials_error(exc: BaseException, what: str) -> StorageError:
    return StorageError(
        format_message(
            "object storage refused the request: no usable credentials",
            where=what,
            found=f"{type(exc).__name__}: {exc}",
            fix="set credentials the usual way (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, "
            "an instance role), pass storage_options={'key': ..., 'secret': ...}, or for msc:// give "
            "the profile a credentials_provider in MSC_CONFIG",
        )
    )


def backoff_delay(attempt: int, settings: RemoteSettings, rng: random.Random = random.Random()) -> float:
    """Full jitter: uniform in [0, min(max, base * 2**attempt)]."""
    return rng.uniform(0, min(settings.max_backoff_s, settings.backoff_s * (2 ** attempt)))


def with_retries(fn: Callable[[], T], *, what: str, settings: RemoteSettings) -> T:
    """Calls ``fn`` until it succeeds, a permanent error occurs, or ``max_attempts`` are used."""
    for attempt in range(1, settings.max_attempts + 1):
        try:
            return fn()
        except Exception as exc:
            if _is_credential_error(exc):
                raise _credentials_error(exc, what) from exc
            if _permanent(exc):
                raise
            if attempt == settings.max_attempts:
                raise StorageError(
                    format_message(
                        f"object storage failed after {attempt} attempts",
                        where=what,
                        found=f"{type(exc).__name__}: {exc}",
                        fix="check the endpoint and the network; raise ENERGON_LITE_MAX_ATTEMPTS for a flaky store",
                    )
                ) from exc
            delay = backoff_delay(attempt, settings)
            logger.debug("%s failed (%s: %s); retry %d in %.2f s", what, type(exc).__name__, exc, attempt, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


def _forget_inherited_sessions() -> None:
    """In a forked child, drops the finalizers of the parent's s3fs sessions.

    Those sessions belong to the parent's event-loop thread, which does not exist in the child;
    when fsspec discards the parent's filesystems, closing them would only log "attached to a
    different loop" errors (the child opens its own connections anyway).
    """
    registry = getattr(weakref.finalize, "_registry", {})
    for finalizer, info in list(registry.items()):
        if getattr(info.func, "__qualname__", "") == "S3FileSystem.close_session":
            finalizer.detach()


os.register_at_fork(after_in_child=_forget_inherited_sessions)


def refresh_session(path: "RemotePath") -> None:
    """Gives the s3fs filesystem of ``path`` a new session (new connections); others: nothing.

    For a process whose forked children used its connections and have ended: a kept-alive
    connection made before the fork is not reliably usable afterwards (``prepare-media`` with 2
    workers on S3: the upload of its index waited for ever for the answer to its
    ``Expect: 100-continue``; with a new session it went through). The old session is left open.
    """
    fs = path.fs
    if getattr(fs, "_s3", None) is not None and callable(getattr(fs, "connect", None)):
        fs.connect(refresh=True)


class _ReadCounters:
    """Requests and bytes fetched by this process (for benchmarks and the read report); prefetch
    threads count too, under a lock."""

    requests = 0
    retries = 0
    bytes_fetched = 0
    _lock = threading.Lock()

    def add(self, *, requests: int = 0, retries: int = 0, bytes_fetched: int = 0) -> None:
        with self._lock:
            self.requests += requests
            self.retries += retries
            self.bytes_fetched += bytes_fetched


read_counters = _ReadCounters()


def _reset_counter_lock() -> None:
    _ReadCounters._lock = threading.Lock()  # a prefetch thread may have held it at the fork


os.register_at_fork(after_in_child=_reset_counter_lock)


class PrefetchCancelled(Exception):
    """A background read given up because its pool was closed (never reaches a caller)."""


def fetch_range(path: RemotePath, start: int, end: int, stop: threading.Event | None = None) -> bytes:
    """Reads ``[start, end)`` of ``path`` exactly, retrying failed or short GETs.

    A GET that fails or returns fewer bytes than asked (a truncated body) is retried from the
    first missing byte, so bytes already received are neither dropped nor read twice.  ``stop``
    (a background read's): once it is set, the read gives up at its next retry.
    """
    settings = path.settings
    fs = path.fs
    chunks: list[bytes] = []
    position = start
    failures = 0
    last_error = "no data"
    while position < end:
        try:
            read_counters.add(requests=1)
            data = fs.cat_file(path.url, start=position, end=end)
        except Exception as exc:
            if _is_credential_error(exc):
                raise _credentials_error(exc, path.url) from exc
            if _permanent(exc):
                raise
            data, last_error = b"", f"{type(exc).__name__}: {exc}"
        else:
            if len(data) > end - position:
                data = _whole_object_range(data, path, position, end)
            if len(data) < end - position:
                last_error = f"short body: {len(data)} of {end - position} bytes"
        if data:
            chunks.append(data)
            position += len(data)
            read_counters.add(bytes_fetched=len(data))
            if position >= end:
                break
        failures += 1
        read_counters.add(retries=1)
        if failures >= settings.max_attempts:
            raise StorageError(
                format_message(
                    f"object storage read failed after {failures} attempts",
                    where=f"{path.url} bytes {start}..{end} (stopped at {position})",
                    found=last_error,
                    fix="check the endpoint and the network; raise ENERGON_LITE_MAX_ATTEMPTS for a flaky store",
                )
            )
        delay = backoff_delay(failures, settings)
        if stop is None:
            time.sleep(delay)
        elif stop.wait(delay):
            raise PrefetchCancelled(path.url)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def fetch_range_sized(path: RemotePath, start: int, end: int, stop: threading.Event | None = None) -> tuple[bytes, int]:
    """``[start, min(end, size))`` of ``path`` and the object's size, for an object whose size is
    not known yet: on S3 one ranged GET, the size taken from its ``Content-Range`` (where a HEAD
    and a GET were). The size is only ever one the store stated: a reply that states none, a
    range past the end (416), another protocol or a failed first GET: a HEAD states it, and the
    bytes not yet received are read as :func:`fetch_range` reads them. A missing object:
    ``FileNotFoundError``."""
    data, size = b"", None
    fs = path.fs
    if path.protocol in ("s3", "s3a") and callable(getattr(fs, "_call_s3", None)):
        try:
            read_counters.add(requests=1)
            data, size = _s3_get_with_size(fs, path, start, end)
        except Exception as exc:
            if _is_credential_error(exc):
                raise _credentials_error(exc, path.url) from exc
            if isinstance(exc, _PERMANENT):
                raise
            logger.debug("%s bytes %d..%d: %s: %s; asking for its size", path.url, start, end, type(exc).__name__, exc)
            data = b""
        read_counters.add(bytes_fetched=len(data))
    if size is None:
        stat = path.head()
        if stat is None:
            raise FileNotFoundError(path.url)
        size = stat.size
    stop_at = min(end, size)
    if len(data) > max(0, stop_at - start):
        raise StorageError(
            format_message(
                "object storage answered a ranged read with more bytes than its size allows",
                where=f"{path.url} bytes {start}..{end}",
                expected=f"{max(0, stop_at - start)} bytes (the object has {size})",
                found=f"{len(data)} bytes",
                fix="the endpoint does not implement HTTP Range requests correctly; use an S3-compatible server or proxy that does",
            )
        )
    if start + len(data) < stop_at:  # a failed or short first GET: the rest, retried
        data += fetch_range(path, start + len(data), stop_at, stop)
    return data, size


def _s3_get_with_size(fs: Any, path: RemotePath, start: int, end: int) -> tuple[bytes, int | None]:
    """One GET of ``bytes=start-(end-1)`` through s3fs: the body and the size its Content-Range
    states (None when it states none: a 200 without Range support, an unparsable header).

    ``_call_s3`` is s3fs's own (private) call, the only one that shows the reply's headers; the
    caller checks it exists and falls back to a HEAD for the size on any failure here."""
    from fsspec.asyn import sync  # fsspec comes with the s3 extra: imported when S3 is read

    bucket, _, key = path.key.partition("/")

    async def get() -> tuple[bytes, dict]:
        reply = await fs._call_s3("get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}")
        try:
            body = await reply["Body"].read()
        finally:
            reply["Body"].close()
        return body, reply

    body, reply = sync(fs.loop, get)
    content_range = str(reply.get("ContentRange") or "")
    if not content_range and reply.get("ResponseMetadata", {}).get("HTTPStatusCode") == 200:
        # The server ignored Range: the whole object, whose size is its stated Content-Length.
        if reply.get("ContentLength") != len(body):
            return b"", None
        return (_whole_object_range(body, path, start, min(end, len(body))) if start < len(body) else b""), len(body)
    total = content_range.rpartition("/")[2]
    return body, int(total) if content_range.startswith("bytes ") and total.isdigit() else None


def _whole_object_range(body: bytes, path: RemotePath, position: int, end: int) -> bytes:
    """``[position, end)`` of a body longer than the range asked for: a server that ignores
    ``Range`` answers 200 with the whole object (RFC 9110), so the bytes asked for are at their
    own offsets in it. A longer body that cannot be the whole object is refused: keeping its
    first bytes would hand out another part of the object silently."""
    if len(body) >= end:
        bucket = path.url.split("/", 3)[2]
        if bucket not in _ignored_range_warned:
            _ignored_range_warned.add(bucket)
            logger.warning("%s: the server ignored a Range header and sent the whole object (%d bytes); reads stay correct but cost the whole object", path.url, len(body))
        return body[position:end]
    raise StorageError(
        format_message(
            "object storage answered a ranged read with more bytes than asked, but not the whole object",
            where=f"{path.url} bytes {position}..{end}",
            expected=f"{end - position} bytes (a 206 reply), or the whole object from byte 0 (at least {end} bytes)",
            found=f"{len(body)} bytes",
            fix="the endpoint does not implement HTTP Range requests correctly; use an S3-compatible server or proxy that does",
        )
    )


#: Buckets whose server was seen ignoring Range (warned once each).
_ignored_range_warned: set[str] = set()


def fetch_object(path: RemotePath) -> bytes:
    """The whole object at ``path`` in one GET (retried; a missing object raises
    ``FileNotFoundError`` at once), counted like ranged reads. For files read whole, such as
    the files of an aux folder, where a size lookup first would cost a second round trip."""

    # s3fs sends a HEAD for the size first unless told to read in one stream (max_concurrency=1).
    options = {"max_concurrency": 1} if path.protocol in ("s3", "s3a") else {}

    def get() -> bytes:
        read_counters.add(requests=1)
        return path.fs.cat_file(path.url, **options)

    data = with_retries(get, what=f"read {path.url}", settings=path.settings)
    read_counters.add(bytes_fetched=len(data))
    return data


class Prefetched:
    """A range being read (or read) in the background: ``[start, end)`` of one object.

    It is let go once a read reaches ``release_at`` (its end, or where the samples in it end when
    it also holds a tar's trailer).  ``object_size``: the object's size as the reply stated it,
    once read, for a range read with :func:`fetch_range_sized` (its bytes then stop at the
    object's end, which may come before ``end``)."""

    __slots__ = ("start", "end", "release_at", "future", "object_size")

    def __init__(self, start: int, end: int, future: Future) -> None:
        self.start, self.end, self.release_at, self.future = start, end, end, future
        self.object_size: int | None = None

    def fetch_sized(self, path: RemotePath, stop: threading.Event) -> bytes:
        data, self.object_size = fetch_range_sized(path, self.start, self.end, stop)
        return data


class RemoteFilePool:
    """Reads byte ranges of remote objects with read-ahead; one pool per process.

    The caller passes the end of the slice it is reading as ``readahead_end``; a read that misses
    that slice's block fetches ``[offset, max(offset + size, min(readahead_end, offset +
    block_size)))``, so a block never reaches past what the worker reads next.  One block is kept
    per slice being read (a worker interleaves up to ``parallel_shard_iters`` slices), the least
    recently used going first once the blocks hold more than ``readahead_bytes``.

    Reads the caller knows it will make next can be started in the background
    (:meth:`prefetch`, :meth:`submit`), on threads started in the process that first asks: a
    pool copied into a forked worker starts its own and never touches its parent's.  Ranges read
    ahead that way hold at most ``readahead_bytes`` at once (besides the blocks); a read they
    cover waits for them and gets their bytes, or the error their GET ended with.
    """

    #: Threads per process: ranged GETs of the data, and the tasks that plan them (index reads).
    FETCH_THREADS = 8
    PLAN_THREADS = 4

    def __init__(self, settings: RemoteSettings | None = None) -> None:
        self.settings = settings or RemoteSettings.from_env()
        self._blocks: OrderedDict[tuple[str, int], tuple[int, bytes]] = OrderedDict()
        self._buffered = 0
        self._start_process()

    def _start_process(self) -> None:
        """The background state, empty: at construction and in a new process (after a fork)."""
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._threads = _Threads()
        # A pool dropped without close (a loader let go mid-epoch) stops its threads all the same;
        # the tasks they run hold no reference to it (see SplitReader.prefetch).
        weakref.finalize(self, self._threads.stop, False)
        self._prefetched: dict[str, list[Prefetched]] = {}
        self.prefetched_bytes = 0
        self.peak_prefetched_bytes = 0  # the most held at once (for tests and benchmarks)

    def _own_process(self) -> None:
        if self._pid != os.getpid():
            self._start_process()  # the parent's threads and futures do not exist here

    def __getstate__(self) -> dict[str, Any]:
        return {"settings": self.settings}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["settings"])

    # --- background reads ------------------------------------------------------------------------
    def submit(self, fn: Callable[..., Any], *args: Any) -> Future | None:
        """Runs ``fn(*args)`` on a planning thread (which may wait for :meth:`prefetch` reads,
        never the other way round); None once the pool is closed."""
        self._own_process()
        return self._threads.submit(True, fn, *args)

    def prefetch(self, path: RemotePath, start: int, end: int, *, sized: bool = False) -> Prefetched | None:
        """Starts a GET of ``[start, end)`` in the background; None when a range already read
        ahead covers it, the pool is closed, or it would take the bytes held past
        ``readahead_bytes`` (then the read fetches it when it comes).  ``sized``: the object's
        size is not known and ``end`` may be past it; the GET learns it (:meth:`read_sized`)."""
        self._own_process()
        size = end - start
        with self._lock:
            if self._threads.stopped.is_set() or self.prefetched_bytes + size > self.settings.readahead_bytes:
                return None
            entries = self._prefetched.setdefault(path.url, [])
            if any(e.start <= start and end <= e.end for e in entries):
                return None
            self.prefetched_bytes += size
            self.peak_prefetched_bytes = max(self.peak_prefetched_bytes, self.prefetched_bytes)
            entry = Prefetched(start, end, Future())
            entries.append(entry)
        if sized:
            future = self._threads.submit(False, entry.fetch_sized, path, self._threads.stopped)
        else:
            future = self._threads.submit(False, fetch_range, path, start, end, self._threads.stopped)
        if future is None:  # closed meanwhile
            self._release(path.url, entry)
            return None
        entry.future = future
        return entry

    def limit_release(self, path: RemotePath, data_end: int) -> None:
        """The samples of ``path`` end at ``data_end``: a range read ahead past it (up to the
        trailer) is let go once a read reaches ``data_end``."""
        with self._lock:
            for entry in self._prefetched.get(path.url, ()):
                if entry.start < data_end < entry.release_at:
                    entry.release_at = data_end

    def release(self, path: RemotePath, entry: Prefetched) -> None:
        """Lets go of a range read ahead that no read will use."""
        self._release(path.url, entry)

    def _release(self, url: str, entry: Prefetched) -> None:
        with self._lock:
            entries = self._prefetched.get(url)
            if entries is not None and entry in entries:
                entries.remove(entry)
                self.prefetched_bytes -= entry.end - entry.start
                if not entries:
                    del self._prefetched[url]

    def _read_prefetched(self, url: str, offset: int, end: int, *, release: bool = True) -> tuple[bytes, Prefetched] | None:
        with self._lock:
            entry = next((e for e in self._prefetched.get(url, ()) if e.start <= offset and end <= e.end), None)
        if entry is None:
            return None
        try:
            data = entry.future.result()
        except BaseException:
            self._release(url, entry)  # the sample that needed it gets the error; a later read retries
            raise
        if release and end >= entry.release_at:
            self._release(url, entry)
        return data[offset - entry.start : end - entry.start], entry

    def read_sized(self, path: RemotePath, offset: int, size: int) -> tuple[bytes, int]:
        """``[offset, offset + size)`` of ``path`` cut at its end, and its size as the store
        stated it (see :func:`fetch_range_sized`): from a range read ahead with ``sized``, which
        stays held for the reads of its samples, or one GET."""
        self._own_process()
        if self._prefetched:
            found = self._read_prefetched(path.url, offset, offset + size, release=False)
            if found is not None and found[1].object_size is not None:
                data, entry = found
                if len(data) == max(0, min(offset + size, entry.object_size) - offset):
                    return data, entry.object_size
        return fetch_range_sized(path, offset, offset + size)

    def discard_prefetched(self) -> None:
        """Forgets what was read ahead (a restore moves the reader elsewhere); GETs under way
        finish and are dropped."""
        self._own_process()
        with self._lock:
            entries = [e for es in self._prefetched.values() for e in es]
            self._prefetched.clear()
            self.prefetched_bytes = 0
        for entry in entries:
            entry.future.cancel()

    # --- reads -----------------------------------------------------------------------------------
    def read(self, path: RemotePath, offset: int, size: int, readahead_end: int | None = None) -> bytes:
        end = offset + size
        self._own_process()
        if self._prefetched:
            found = self._read_prefetched(path.url, offset, end)
            if found is not None and len(found[0]) == size:  # a sized range stops at its object's end
                return found[0]
        key = (path.url, readahead_end or 0)
        entry = self._blocks.get(key) if readahead_end is not None else None
        if entry is not None and entry[0] <= offset and end <= entry[0] + len(entry[1]):
            self._blocks.move_to_end(key)
            return entry[1][offset - entry[0] : end - entry[0]]
        fetch_end = max(end, min(readahead_end or end, offset + self.settings.block_size))
        data = fetch_range(path, offset, fetch_end)
        if fetch_end == end:
            return data
        self._drop(key)
        self._blocks[key] = (offset, data)
        self._buffered += len(data)
        while self._buffered > self.settings.readahead_bytes and len(self._blocks) > 1:
            self._drop(next(iter(self._blocks)))
        return data[:size]

    def _drop(self, key: tuple[str, int]) -> None:
        entry = self._blocks.pop(key, None)
        if entry is not None:
            self._buffered -= len(entry[1])

    def close(self) -> None:
        """Drops what is held; stops and joins this process's background threads (queued reads
        are cancelled, one under way ends at its next retry or when its GET returns).  The pool
        may be used again: new threads start when asked for."""
        self._blocks.clear()
        self._buffered = 0
        if self._pid != os.getpid():
            self._start_process()
            return
        threads = self._threads
        threads.stopped.set()
        self.discard_prefetched()
        threads.stop(True)
        self._threads = _Threads()
        weakref.finalize(self, self._threads.stop, False)


class _Threads:
    """The two thread pools of a :class:`RemoteFilePool`, started on first use: data GETs
    (``energon-lite-fetch``) and the tasks that plan them (``energon-lite-plan``), apart so that
    a planning task can wait for a GET without taking the thread the GET needs."""

    def __init__(self) -> None:
        self.stopped = threading.Event()
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._pools: dict[bool, ThreadPoolExecutor] = {}

    def submit(self, plan: bool, fn: Callable[..., Any], *args: Any) -> Future | None:
        with self._lock:
            if self.stopped.is_set():
                return None
            pool = self._pools.get(plan)
            if pool is None:
                name, count = ("energon-lite-plan", RemoteFilePool.PLAN_THREADS) if plan else ("energon-lite-fetch", RemoteFilePool.FETCH_THREADS)
                pool = self._pools[plan] = ThreadPoolExecutor(count, thread_name_prefix=name)
            return pool.submit(fn, *args)

    def stop(self, wait: bool) -> None:
        """Cancels what is queued and lets the threads end (``wait``: until they have).  Nothing
        in a forked child: the threads are the parent's (and its locks may be held there)."""
        if self._pid != os.getpid():
            return
        with self._lock:
            self.stopped.set()
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.shutdown(wait=wait, cancel_futures=True)
