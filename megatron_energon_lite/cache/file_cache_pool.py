"""FileStoreCachePool: auxiliary files fetched in the background into a local folder.

A cooker asks ``pool.get_lazy(store, name)`` for the files a sample will need and puts the lazy
references into the sample; background threads read them from their stores (in the order asked,
first in first out) and write them into ``cache_dir``; ``encode_sample`` later calls
``lazy.get(sample)`` and reads the local copy. Every lazy naming the same file of the same store
shares one cache entry (and one file), counted by ``refcount``: a reference is given back by the
lazy's first ``get()`` or when the lazy is garbage collected, and the file is deleted when the last
one goes.

The folder holds at most ``max_cache_size`` bytes and ``max_cache_count`` files. A fetch that
does not fit keeps the bytes it read and waits for room (holding its thread, so later fetches wait
behind it); a consumer that asks for a file whose fetch is queued or waiting never waits for room:
it reads the file itself or takes the bytes the fetch already read, and the fetch of the remaining
references goes to the end of the queue. A file larger than the whole budget is never cached (one
warning per pool). Writes go to a temporary name and are renamed, so no half-written file is ever
read. A folder that cannot be made when the pool is created is a ``ConfigError``; when writing
fails later (a full disk, a folder removed under the pool), lazies still return their data, read
directly, and the pool logs one warning: a cache is an optimisation, so it does not stop training.

Energon's behaviour is kept where its tests pin it down (attribute names, the order of fetches, when
space is freed); these Energon bugs are fixed:

* a second ``FileCacheLazy.get()`` returned the ``(data, SourceInfo)`` tuple; here it returns the
  data and, like every lazy, adds the source to the sample on each call;
* a fetch whose references were all dropped while it waited for room kept its reservation forever;
  here the reservation is released on every path;
* a raw store and a decoding store of the same folder shared entries, so one got the other's
  decoding; here entries are per store object (see :meth:`FileStoreCachePool.get_lazy`);
* a file larger than the budget held a fetch thread until someone asked for it; here it is skipped;
* every fork left a new ``cache_*`` folder behind in the parent and in each child; here the parent
  keeps its folder, a child makes its own when it first writes, and each is removed by ``close()``,
  when the pool is garbage collected, or when its process exits.

A lazy belongs to the process that made it (the pool's threads and files are that process's):
resolve it in the worker, e.g. in ``encode_sample``; pickling one raises an error that says so.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import pickle
import shutil
import tempfile
import threading
import uuid
import weakref
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.util import Finalize
from pathlib import Path
from typing import Any, Literal, TypeVar

from ..errors import (
    CachePoolClosedError,
    ConfigError,
    LazyNotPicklableError,
    StorageError,
    format_message,
)
from ..fork_hook import ForkMixin
from ..source_info import SourceInfo, add_source_info
from ..storage.local import is_no_room, replace_atomically
from .base import CachePool, FileStore, Lazy

__all__ = ["CacheFileLazy", "FileCacheLazy", "FileStoreCachePool"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_METHODS = ("raw", "pickle")
_BYTES_LIKE = (bytes, bytearray, memoryview)
#: How long a fetch waiting for room sleeps before it looks again whether the program is ending
#: (a wake-up is normally signalled; this only bounds how long the interpreter's exit can wait).
_WAIT_SLICE_SECONDS = 1.0
_serials = itertools.count()
#: Set when the interpreter (or a multiprocessing child) starts to exit: fetches stop at once.
#: Process-wide, not per run: the exit stops every pool.
_exiting = False
_live_pools: weakref.WeakSet[FileStoreCachePool] = weakref.WeakSet()


def _on_exit() -> None:
    """Stops every pool's fetches before the interpreter joins their threads.

    Python joins the threads of every ThreadPoolExecutor at exit, before ``atexit`` handlers run;
    a fetch waiting for room would hold that join forever. ``threading._register_atexit`` is the
    hook concurrent.futures itself uses, called before that join (where it is missing, a fetch
    waiting for room gives up once the main thread has ended).
    """
    global _exiting
    _exiting = True
    for pool in list(_live_pools):
        pool._wake_all()


_register_threading_atexit = getattr(threading, "_register_atexit", None)
if _register_threading_atexit is not None:
    _register_threading_atexit(_on_exit)


def _not_picklable(kind: str, where: str) -> LazyNotPicklableError:
    return LazyNotPicklableError(
        format_message(
            f"a {kind} cannot be pickled: it refers to a cache pool's threads and files, which "
            "belong to the process that made it",
            where=where,
            fix="resolve lazies with lazy.get(sample) inside the worker process (in the cooker, "
            "encode_sample, batch or pack) so that only their data leaves it",
        )
    )


class _Attempt:
    """One background try to put an entry's file into the cache.

    Consumers that wait for it count themselves in ``waiting``; when the file is not cached, the
    fetch leaves the bytes it read in ``payload`` for them, and the last of them clears it.
    """

    __slots__ = ("future", "payload", "waiting")

    def __init__(self) -> None:
        self.future: Future = Future()
        self.waiting = 0
        self.payload: Any = None


@dataclass(eq=False)
class CacheEntry:
    """What the pool knows about one file of one store; shared by the lazies that name it.

    ``state`` says where the fetch is (for messages and tests): ``queued``, ``reading``,
    ``waiting`` (for room), ``writing``, ``cached`` or ``not cached`` (handed over, too large,
    not writable, dropped).
    """

    ds: FileStore
    fname: str
    key: tuple
    serial: int
    refcount: int = 1
    attempt: _Attempt = field(default_factory=_Attempt)
    data_size: int = 0
    state: str = "queued"
    cache_path: Path | None = None
    source_info: SourceInfo | None = None
    #: The cached bytes are a pickle (method "pickle", or a raw store whose items are not bytes).
    pickled: bool = False
    #: Whether (and how many bytes) this entry holds of the budget.
    reserved: bool = False
    reserved_size: int = 0
    #: Never try to cache this entry again (larger than the budget, or the write failed).
    uncacheable: bool = False

    @property
    def send_to_cache_future(self) -> Future:
        """The current fetch: its result is True when the file is in the cache."""
        return self.attempt.future

    def __repr__(self) -> str:
        return (
            f"CacheEntry(fname={self.fname!r}, path={self.key[0]!r}, state={self.state!r}, "
            f"refcount={self.refcount}, data_size={self.data_size})"
        )


@dataclass(kw_only=True, eq=False)
class FileCacheLazy(Lazy[T]):
    """A file that :class:`FileStoreCachePool` fetches in the background.

    The first :meth:`get` gives the lazy's reference back to the pool; every call returns the data
    and appends its source to ``sample``'s ``__sources__`` (like Energon's ``DirectLazy``).
    Copies (``copy``/``deepcopy``) are the lazy itself; pickling raises
    :class:`LazyNotPicklableError`.
    """

    entry: CacheEntry = field(repr=False)
    #: ``(data, SourceInfo)`` once read.
    _data: tuple[Any, SourceInfo] | None = field(default=None, init=False, repr=False)
    #: Whether this lazy still holds one reference on ``entry``.
    _holds_ref: bool = field(default=True, init=False, repr=False)

    def get(self, sample: Any = None) -> T:
        if self._data is None:
            self._data = self.pool._resolve(self)
        data, source_info = self._data
        add_source_info(sample, source_info)
        return data

    __hash__ = Lazy.__hash__
    __eq__ = Lazy.__eq__

    def __del__(self) -> None:
        try:
            if self._holds_ref:
                self._holds_ref = False
                self.pool._drop(self.entry)
        except Exception:  # a half-built lazy, or the interpreter is shutting down
            pass

    def __reduce__(self) -> Any:
        raise _not_picklable("FileCacheLazy", f"{self.entry.key[0]}: {self.fname!r}")

    def __copy__(self) -> FileCacheLazy[T]:
        return self

    def __deepcopy__(self, memo: dict) -> FileCacheLazy[T]:
        return self


_NOT_LOADED: Any = object()


@dataclass(kw_only=True, eq=False)
class CacheFileLazy(Lazy[T]):
    """Data that :meth:`FileStoreCachePool.to_cache` moved into a file until it is needed.

    The first :meth:`get` loads it and deletes the file (``cache_path`` becomes None); later calls
    return the same object. A lazy that is collected unread deletes its file. Equal only to itself.
    """

    ds: Any = None
    cache_path: Path | None = None
    _data: Any = field(default=_NOT_LOADED, init=False, repr=False)

    def get(self, sample: Any = None) -> T:
        if self._data is _NOT_LOADED:
            path = self.cache_path
            try:
                payload = path.read_bytes()  # type: ignore[union-attr]
            except FileNotFoundError:
                raise StorageError(
                    format_message(
                        f"the file that to_cache wrote for {self.fname!r} is gone",
                        where=str(path),
                        fix="keep the cache pool open until every lazy of to_cache is read "
                        "(close() removes its folder)",
                    )
                ) from None
            self._data = pickle.loads(payload)
            self.cache_path = None
            path.unlink(missing_ok=True)  # type: ignore[union-attr]
        return self._data

    __hash__ = object.__hash__
    __eq__ = object.__eq__

    def __del__(self) -> None:
        try:
            if self.cache_path is not None:
                self.cache_path.unlink(missing_ok=True)
        except Exception:  # interpreter shutdown, or the folder is gone already
            pass

    def __reduce__(self) -> Any:
        raise _not_picklable("CacheFileLazy", f"{self.cache_path}: {self.fname!r}")

    def __copy__(self) -> CacheFileLazy[T]:
        return self

    def __deepcopy__(self, memo: dict) -> CacheFileLazy[T]:
        return self

    def __repr__(self) -> str:
        return f"CacheFileLazy(fname={self.fname!r}, cache_path={self.cache_path!r})"


def _remove_cache_dir(path: str, pid: int, pool_ref: weakref.ref) -> None:
    """Removes a pool's folder, in the process that made it only (a forked child inherits the
    parent's finalizers but not its folder). At a process's exit the pool is closed first, so
    that its fetches stop instead of failing to write into the removed folder."""
    if os.getpid() != pid:
        return
    pool = pool_ref()
    if pool is not None:
        pool._closed = True
        pool._wake_all()
    shutil.rmtree(path, ignore_errors=True)


def _restore_pool(config: dict[str, Any]) -> FileStoreCachePool:
    """Unpickles a pool as a fresh, empty one with the same settings (in a spawned process)."""
    max_cache_size = config.pop("max_cache_size")
    pool = FileStoreCachePool(**config)
    pool.max_cache_size = max_cache_size
    return pool


class FileStoreCachePool(CachePool, ForkMixin):
    """Fetches the files of lazies in background threads into a local folder (Energon's class).

    Args:
        parent_cache_dir: where the pool makes its folder ``cache_<random>`` (the system's temp
            folder by default).
        num_workers: background threads fetching files.
        max_cache_size_gbytes: the most the folder holds, in GiB (``max_cache_size`` is the same
            in bytes and can be changed later).
        max_cache_count: the most files the folder holds.
        method: ``"raw"`` caches the store's undecoded bytes and decodes them on ``get``;
            ``"pickle"`` caches the decoded value, pickled.

    Errors: a bad argument is a :class:`ConfigError`; a folder that cannot be made or written is
    not an error (lazies read their file directly; one warning is logged); an error reading a
    store (``FileNotFoundError``, ``KeyError``, ...) is raised unchanged by the lazy's ``get()``;
    ``get_lazy``/``to_cache`` after :meth:`close` raise :class:`CachePoolClosedError`.

    The pool may be used from several threads. After a fork, the child's pool starts empty, with
    its own threads and folder; lazies the child inherited read their file directly. Pickled (for a
    spawned process), the pool arrives as a fresh, empty pool with the same settings.
    """

    def __init__(
        self,
        *,
        parent_cache_dir: str | os.PathLike | None = None,
        num_workers: int = 8,
        max_cache_size_gbytes: float = 1024,
        max_cache_count: int = 10_000_000,
        method: Literal["raw", "pickle"] = "raw",
    ) -> None:
        if method not in _METHODS:
            raise ConfigError(
                format_message(
                    "unknown FileStoreCachePool method",
                    where="FileStoreCachePool(method=...)",
                    expected=" or ".join(repr(m) for m in _METHODS),
                    found=repr(method),
                    fix='use "raw" (cache the bytes, decode when used) or "pickle" (cache the decoded value)',
                )
            )
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ConfigError(
                format_message(
                    "FileStoreCachePool needs at least one worker thread",
                    where="FileStoreCachePool(num_workers=...)",
                    expected="an int >= 1",
                    found=repr(num_workers),
                )
            )
        if not isinstance(max_cache_size_gbytes, (int, float)) or not max_cache_size_gbytes >= 0:
            raise ConfigError(
                format_message(
                    "invalid cache size",
                    where="FileStoreCachePool(max_cache_size_gbytes=...)",
                    expected="a number of GiB >= 0",
                    found=repr(max_cache_size_gbytes),
                )
            )
        if isinstance(max_cache_count, bool) or not isinstance(max_cache_count, int) or max_cache_count < 0:
            raise ConfigError(
                format_message(
                    "invalid cache file count",
                    where="FileStoreCachePool(max_cache_count=...)",
                    expected="an int >= 0",
                    found=repr(max_cache_count),
                )
            )
        try:
            self.parent_cache_dir = Path(tempfile.gettempdir() if parent_cache_dir is None else parent_cache_dir)
        except TypeError:
            raise ConfigError(
                format_message(
                    "FileStoreCachePool's cache folder must be a local path",
                    where="FileStoreCachePool(parent_cache_dir=...)",
                    found=repr(parent_cache_dir),
                )
            ) from None
        self.num_workers = num_workers
        self.method = method
        self._max_cache_size = int(max_cache_size_gbytes * 1024**3)
        self._max_cache_count = max_cache_count
        self._closed = False
        self._warned: set[str] = set()
        self._setup_process()
        try:
            self._ensure_dir()
        except OSError as exc:
            # A wrong folder is a setting to fix before training starts; later failures (a full
            # disk, a folder removed under the pool) only cost speed and are warned about.
            raise ConfigError(
                format_message(
                    "FileStoreCachePool cannot make or write its cache folder",
                    where=str(self.cache_dir),
                    found=f"{type(exc).__name__}: {exc}",
                    fix="pass a writable local folder as parent_cache_dir",
                )
            ) from exc
        _live_pools.add(self)
        super().__init__()  # ForkMixin: registers __after_in_child_fork__

    def _setup_process(self) -> None:
        """The state of this process's pool: empty, with new threads, lock and folder name."""
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        #: The thread holding ``_lock`` (a lazy collected inside the pool defers its release).
        self._owner: int | None = None
        #: Entries whose lazies were collected while this thread held the lock.
        self._dropped: deque[CacheEntry] = deque()
        # Key: (store path, file name, id(store)); see get_lazy.
        self._entries: dict[tuple, CacheEntry] = {}
        self.current_cache_size = 0
        self.current_cache_count = 0
        self._executor = ThreadPoolExecutor(max_workers=self.num_workers, thread_name_prefix="CacheWorker")
        self.cache_dir = (self.parent_cache_dir / f"cache_{uuid.uuid4().hex[:16]}").absolute()
        #: The process that made ``cache_dir`` (None: not made yet) and its remover.
        self._dir_pid: int | None = None
        self._finalizer: Finalize | None = None

    def __after_in_child_fork__(self) -> None:
        # The parent's threads do not exist here and its lock may have been held by one of them:
        # start over with nothing; the parent keeps its folder and entries. Lazies inherited from
        # the parent are no longer in the pool, so they read their files directly.
        self._setup_process()

    # -- budget -------------------------------------------------------------------------------

    @property
    def max_cache_size(self) -> int:
        """The most bytes the folder holds (settable; fetches waiting for room look again)."""
        return self._max_cache_size

    @max_cache_size.setter
    def max_cache_size(self, value: int) -> None:
        with self._locked():
            self._max_cache_size = int(value)
            self._cond.notify_all()

    @property
    def max_cache_count(self) -> int:
        """The most files the folder holds (settable)."""
        return self._max_cache_count

    @max_cache_count.setter
    def max_cache_count(self, value: int) -> None:
        with self._locked():
            self._max_cache_count = int(value)
            self._cond.notify_all()

    def _fits(self, size: int) -> bool:
        return (
            self.current_cache_count + 1 <= self._max_cache_count
            and self.current_cache_size + size <= self._max_cache_size
        )

    def _reserve(self, entry: CacheEntry, size: int) -> None:
        self.current_cache_size += size
        self.current_cache_count += 1
        entry.reserved, entry.reserved_size = True, size

    def _unreserve(self, entry: CacheEntry) -> None:
        if entry.reserved:
            self.current_cache_size -= entry.reserved_size
            self.current_cache_count -= 1
            entry.reserved, entry.reserved_size = False, 0
            self._cond.notify_all()

    # -- locking ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Holds the pool's lock; releases deferred by collected lazies are done on the way."""
        self._lock.acquire()
        self._owner = threading.get_ident()
        try:
            self._drain()
            yield
            self._drain()
        finally:
            self._owner = None
            self._lock.release()

    def _drain(self) -> bool:
        done = False
        while self._dropped:
            self._release(self._dropped.popleft())
            done = True
        return done

    def _wait(self) -> None:
        """Waits (lock held) for a change: room freed, a consumer asking, a reference dropped."""
        if self._drain():
            return  # the state changed: let the caller look again first
        self._owner = None
        try:
            self._cond.wait(_WAIT_SLICE_SECONDS)
        finally:
            self._owner = threading.get_ident()
        self._drain()

    def _drop(self, entry: CacheEntry) -> None:
        """A lazy holding a reference on ``entry`` was collected."""
        if os.getpid() != self._pid:
            return  # inherited from the parent: not ours
        self._dropped.append(entry)
        if self._owner == threading.get_ident():
            return  # collected while this thread is inside the pool: released when it leaves
        with self._locked():
            pass

    # -- references ---------------------------------------------------------------------------

    def _release(self, entry: CacheEntry) -> None:
        """Gives back one reference (lock held); the last one deletes the file and frees room."""
        if self._entries.get(entry.key) is not entry:
            return  # forgotten already (closed, or inherited across a fork)
        entry.refcount -= 1
        if entry.refcount > 0:
            future = entry.attempt.future
            if (
                entry.cache_path is None
                and not entry.uncacheable
                and not self._closed
                and (future.done() or future.cancelled())
            ):
                # The file was read without caching it (by a consumer that could not wait): fetch
                # it again for the remaining references, at the end of the queue.
                self._submit(entry)
            return
        self._forget(entry)

    def _forget(self, entry: CacheEntry) -> None:
        """Removes ``entry`` (lock held): a queued fetch is cancelled, a running one gives up."""
        if self._entries.get(entry.key) is entry:
            del self._entries[entry.key]
        entry.refcount = 0
        entry.attempt.future.cancel()
        if entry.cache_path is not None:
            with contextlib.suppress(OSError):
                entry.cache_path.unlink()
            entry.cache_path = None
        self._unreserve(entry)
        self._cond.notify_all()  # a fetch waiting for room for this entry gives up

    def _submit(self, entry: CacheEntry) -> None:
        """Queues a fetch of ``entry`` (lock held)."""
        attempt = _Attempt()
        entry.attempt = attempt
        entry.state = "queued"
        attempt.future = self._executor.submit(self._fetch, entry, attempt)

    # -- the background fetch -----------------------------------------------------------------

    def _gone(self, entry: CacheEntry) -> bool:
        return _exiting or self._closed or entry.refcount <= 0 or self._entries.get(entry.key) is not entry

    def _wake_all(self) -> None:
        with self._locked():
            self._cond.notify_all()

    def _hand_over(self, entry: CacheEntry, attempt: _Attempt, payload: Any, state: str = "not cached") -> bool:
        """Leaves the bytes read for the consumers waiting now; the file is not cached."""
        if attempt.waiting:
            attempt.payload = payload
        entry.state = state
        return False

    def _fetch(self, entry: CacheEntry, attempt: _Attempt) -> bool:
        """Runs on a CacheWorker thread: read, wait for room, reserve, write. True: cached."""
        with self._locked():
            if self._gone(entry):
                entry.state = "not cached"
                return False
            entry.state = "reading"
        if self.method == "raw":
            payload, source_info = entry.ds._get_raw(entry.fname)
            pickled = not isinstance(payload, _BYTES_LIKE)
        else:
            payload, source_info = entry.ds[entry.fname]
            pickled = True
        if pickled:  # a decoded value (or a raw store whose items are not bytes) is cached pickled
            payload = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
        size = memoryview(payload).nbytes
        with self._locked():
            entry.data_size, entry.source_info, entry.pickled = size, source_info, pickled
            while True:
                if self._gone(entry):
                    entry.state = "not cached"
                    return False
                if attempt.waiting >= entry.refcount:
                    return self._hand_over(entry, attempt, payload)  # nobody else would read the file
                if size > self._max_cache_size or self._max_cache_count < 1:
                    entry.uncacheable = True
                    self._warn_too_large(entry, size)
                    return self._hand_over(entry, attempt, payload)
                if self._fits(size):
                    self._reserve(entry, size)
                    break
                if attempt.waiting:
                    return self._hand_over(entry, attempt, payload)  # a consumer does not wait for room
                if not threading.main_thread().is_alive():
                    entry.state = "not cached"
                    return False  # the program is ending
                entry.state = "waiting"
                self._wait()
            entry.state = "writing"
            path = self.cache_dir / f"{entry.serial:08d}_{_safe_name(entry.fname)}"
        try:
            self._ensure_dir()
            replace_atomically(path, payload, durable=False)
        except OSError as exc:
            with self._locked():
                self._unreserve(entry)
                entry.uncacheable = True
                if not self._closed:  # closing removes the folder: not a failure to report
                    self._warn_write_failed(path, exc)
                return self._hand_over(entry, attempt, payload)
        except BaseException:
            with self._locked():
                self._unreserve(entry)
            raise
        with self._locked():
            if self._gone(entry):  # all references dropped (or closed) while writing
                with contextlib.suppress(OSError):
                    path.unlink()
                self._unreserve(entry)
                entry.state = "not cached"
                return False
            entry.cache_path = path
            entry.state = "cached"
            return True

    # -- consuming ----------------------------------------------------------------------------

    def _decode(self, entry: CacheEntry, payload: Any) -> Any:
        if self.method == "pickle":
            return pickle.loads(payload)
        if entry.pickled:
            payload = pickle.loads(payload)
        return entry.ds._decode_raw(payload, fname=entry.fname)

    def _resolve(self, lazy: FileCacheLazy) -> tuple[Any, SourceInfo]:
        """The data of ``lazy`` (called once per lazy by its ``get``): from the cached file, from
        the bytes a fetch read, or read now. Gives the lazy's reference back."""
        entry = lazy.entry
        cached_path: Path | None = None
        attempt: _Attempt | None = None
        with self._locked():
            owns, lazy._holds_ref = lazy._holds_ref, False
            if owns and self._entries.get(entry.key) is entry:
                if entry.cache_path is not None:
                    cached_path = entry.cache_path
                elif not (entry.attempt.future.cancel() or entry.attempt.future.done()):
                    attempt = entry.attempt  # being fetched: wait for it, it will not wait for room
                    attempt.waiting += 1
                    self._cond.notify_all()
                # else: still queued (now cancelled) or finished without caching: read directly
            else:
                owns = False
        try:
            if attempt is not None:
                payload = None
                try:
                    cached = attempt.future.result()
                finally:
                    with self._locked():
                        payload = attempt.payload
                        attempt.waiting -= 1
                        if attempt.waiting == 0:
                            attempt.payload = None
                if cached:
                    cached_path = entry.cache_path
                elif payload is not None:
                    return self._decode(entry, payload), entry.source_info  # type: ignore[return-value]
            if cached_path is not None:
                try:
                    payload = cached_path.read_bytes()
                except OSError:  # the pool was closed meanwhile: read from the store
                    pass
                else:
                    return self._decode(entry, payload), entry.source_info  # type: ignore[return-value]
            return lazy.ds[lazy.fname]
        finally:
            if owns:
                with self._locked():
                    self._release(entry)

    # -- the CachePool interface --------------------------------------------------------------

    def get(self, ds: FileStore, fname: str, sample: Any = None) -> Any:
        """Reads ``fname`` of ``ds`` now, without the cache; appends its source to ``sample``."""
        return ds.get(fname, sample)

    def get_lazy(self, ds: FileStore, fname: str) -> FileCacheLazy:
        """A lazy reference to ``fname`` of ``ds``, fetched in the background from now on.

        Lazies share one entry (one fetch, one file) when they name the same file of the *same
        store object*, i.e. exactly when they compare equal. The store's path alone is not enough:
        a raw store and a decoding store of one folder hold different things (and with method
        "pickle" the cached value is the decoded one), and a ``PrimaryFileStore`` turns ``".txt"``
        into a different file for every sample. Stores are made once per dataset in a worker, so
        the files that several samples share are still fetched once. The entry keeps its store
        alive, so its ``id`` cannot be reused while the entry exists.
        """
        path = ds.get_path()
        with self._locked():
            self._check_open("get_lazy")
            key = (path, fname, id(ds))
            entry = self._entries.get(key)
            if entry is None:
                entry = CacheEntry(ds=ds, fname=fname, key=key, serial=next(_serials))
                self._entries[key] = entry
                self._submit(entry)
            else:
                entry.refcount += 1
            return FileCacheLazy(ds=ds, fname=fname, pool=self, entry=entry)

    def to_cache(self, data: T, name: str) -> CacheFileLazy[T]:
        """Pickles ``data`` into a file of the cache folder until its lazy is read (``name`` is
        for messages). Not counted in the budget. If the folder cannot be written, the data stays
        in memory (one warning)."""
        with self._locked():
            self._check_open("to_cache")
        payload = pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL)
        path = self.cache_dir / f"tocache_{uuid.uuid4().hex}"
        try:
            self._ensure_dir()
            replace_atomically(path, payload, durable=False)
        except OSError as exc:
            with self._locked():
                self._warn_write_failed(path, exc)
            in_memory: CacheFileLazy[T] = CacheFileLazy(fname=name, pool=self, cache_path=None)
            in_memory._data = data  # the write failed: keep the data itself
            return in_memory
        return CacheFileLazy(fname=name, pool=self, cache_path=path)

    def close(self) -> None:
        """Stops the fetches, deletes the cached files and the folder. Lazies made before still
        return their data (read directly); ``get_lazy``/``to_cache`` raise afterwards."""
        with self._locked():
            if self._closed:
                return
            self._closed = True
            for entry in self._entries.values():
                entry.attempt.future.cancel()
            self._cond.notify_all()
        self._executor.shutdown(wait=True, cancel_futures=True)
        with self._locked():
            for entry in list(self._entries.values()):
                self._forget(entry)
            self.current_cache_size = 0
            self.current_cache_count = 0
            finalizer, self._finalizer = self._finalizer, None
        if finalizer is not None:
            finalizer()  # removes the folder (what to_cache wrote too)

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise CachePoolClosedError(
                format_message(
                    f"{what} on a FileStoreCachePool that was closed",
                    where=str(self.cache_dir),
                    fix="make a new FileStoreCachePool, or close the pool only after the last use",
                )
            )

    # -- the folder and messages --------------------------------------------------------------

    def _ensure_dir(self) -> None:
        """Makes this process's folder (once) and registers its removal at exit / collection."""
        pid = os.getpid()
        if self._dir_pid == pid:
            return
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        with self._locked():
            if self._dir_pid != pid:
                self._dir_pid = pid
                self._finalizer = Finalize(
                    self, _remove_cache_dir, args=(str(self.cache_dir), pid, weakref.ref(self)), exitpriority=0
                )

    def _warn_once(self, kind: str, message: str) -> None:
        if kind in self._warned:
            logger.debug("%s", message)
        else:
            self._warned.add(kind)
            logger.warning("%s", message)

    def _warn_too_large(self, entry: CacheEntry, size: int) -> None:
        self._warn_once(
            "too-large",
            format_message(
                "a file is larger than FileStoreCachePool's whole budget: it is never cached, "
                "but read when used (logged once; later ones are logged at debug level)",
                where=f"{entry.key[0]}: {entry.fname!r}",
                found=f"{size} bytes; budget {self._max_cache_size} bytes and {self._max_cache_count} files",
                fix="raise FileStoreCachePool(max_cache_size_gbytes=..., max_cache_count=...) "
                "(or set pool.max_cache_size in bytes)",
            ),
        )

    def _warn_write_failed(self, path: Path, exc: OSError) -> None:
        if is_no_room(exc):
            what, fix = (
                "no room left on the device for FileStoreCachePool's folder",
                "free space there, lower max_cache_size_gbytes, or pass another parent_cache_dir",
            )
        else:
            what, fix = (
                "FileStoreCachePool cannot write into its folder",
                "pass a writable local folder as parent_cache_dir",
            )
        self._warn_once(
            "write",
            format_message(
                f"{what}: files are read when used instead (logged once)",
                where=str(path),
                found=f"{type(exc).__name__}: {exc}",
                fix=fix,
            ),
        )

    def __reduce__(self) -> Any:
        config = {
            "parent_cache_dir": self.parent_cache_dir,
            "num_workers": self.num_workers,
            "max_cache_size_gbytes": 0,
            "max_cache_count": self._max_cache_count,
            "method": self.method,
            "max_cache_size": self._max_cache_size,
        }
        return (_restore_pool, (config,))

    def __str__(self) -> str:
        return (
            f"FileStoreCachePool(cache_dir={self.cache_dir}, max_cache_size={self._max_cache_size}, "
            f"max_cache_count={self._max_cache_count}, method={self.method}, "
            f"current_cache_size={self.current_cache_size}, current_cache_count={self.current_cache_count})"
        )

    __repr__ = __str__


def _safe_name(fname: str, limit: int = 80) -> str:
    """A readable, flat file name for ``fname`` (the entry's serial keeps names unique)."""
    name = "".join(c if c.isalnum() or c in "._-" else "_" for c in fname.rsplit("/", 1)[-1])
    return name.lstrip(".")[-limit:] or "file"
