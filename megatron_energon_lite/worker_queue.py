"""The queues between the loader's processes: a message is written by the thread that puts it.

torch's DataLoader talks to its workers through ``multiprocessing`` queues, whose ``put`` hands the
object to a feeder thread that pickles it and writes it to a pipe.  In a worker that makes small
batches (text), every batch then wakes the feeder, and the two threads hand the GIL back and forth
(a thread waiting for it waits up to the switch interval): on two cores that cost a text worker
about a sixth of its rate.  :class:`DirectQueue` pickles and writes in the caller's thread when the
write cannot block: the message is small, and the pipe (widened to :data:`PIPE_BYTES`) has room
for it (a bundle of text batches is 100-200 KB), so the worker stays single-threaded.

A write that might block, because the message is large or the pipe is filling up, goes to a
sender thread of this queue instead, as before, so that a worker never blocks in ``put``: torch
stops reading when it shuts the workers down, and a worker stuck writing would hold up the
shutdown until torch kills it.  Once a message waits for the sender, later ones queue behind it,
so the order of one process's messages does not change.

A worker's messages do not even go through the pipe when they fit its ring (:class:`Rings`): a
buffer of anonymous shared memory per worker, made before the workers are forked.  The worker
pickles the message straight into it and sends only where it lies; the main process unpickles it in
place and frees the space.  That saves the main process reading the bytes out of the pipe (for
a 600 KB message, 1.1 ms of system time against 0.4 ms for the unpickling) and the worker
writing them into it.  The ring is freed in the order the messages were written, which is the
order they arrive in.
"""

from __future__ import annotations

import collections
import fcntl
import itertools
import logging
import mmap
import multiprocessing.context
import multiprocessing.queues
import os
import pickle
import queue
import struct
import termios
import threading
import weakref
from multiprocessing.reduction import ForkingPickler
from multiprocessing.util import Finalize, register_after_fork
from typing import Any

import numpy as np

from .errors import DatasetError, format_message

__all__ = ["DIRECT_QUEUES_ENV", "DirectForkContext", "DirectQueue", "PIPE_BYTES", "RING_BYTES", "Rings", "direct_queues_from_env"]

logger = logging.getLogger(__name__)

#: Environment variable: ``0`` gives the loader multiprocessing's own queues (a feeder thread each).
DIRECT_QUEUES_ENV = "ENERGON_LITE_DIRECT_QUEUES"
#: Pipe size asked for (Linux lets any process widen a pipe to /proc/sys/fs/pipe-max-size, 1 MiB by
#: default); with less, the direct path takes correspondingly smaller messages.
PIPE_BYTES = 1 << 20
_F_SETPIPE_SZ = 1031
_F_GETPIPE_SZ = 1032
#: How long ``put`` waits for another process's write before handing its message to the sender.
_LOCK_WAIT_S = 0.01
#: Bytes of shared memory per worker for its messages (address space: only the pages messages
#: touch are used); a message over a quarter of it goes through the pipe.
RING_BYTES = 4 << 20


def direct_queues_from_env() -> bool:
    return os.environ.get(DIRECT_QUEUES_ENV, "1").strip() != "0"


def _widen(fd: int) -> int:
    """The pipe's capacity in bytes after asking for :data:`PIPE_BYTES` (0: unknown)."""
    try:
        return fcntl.fcntl(fd, _F_SETPIPE_SZ, PIPE_BYTES)
    except OSError:
        try:
            return fcntl.fcntl(fd, _F_GETPIPE_SZ)
        except OSError:
            return 0


def _unread(fd: int) -> int:
    """Bytes written to the pipe and not read yet."""
    return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]


_ring_ids = itertools.count()
#: The main process's rings by id, for unpickling a message's place (:func:`_from_ring`).
_rings: weakref.WeakValueDictionary[int, Rings] = weakref.WeakValueDictionary()


class Rings:
    """One ring buffer of shared memory per worker: a worker places its pickled messages in its
    own ring, the main process unpickles them there and frees their space, oldest first.

    Positions count bytes written since the workers started; a message never wraps around the
    end (the rest of the ring is skipped).  The main process's read position per worker lives in
    shared memory, where the worker reads it to see how much room is left; the worker's write
    position is its own."""

    def __init__(self, writers: int, ring_bytes: int = RING_BYTES) -> None:
        self.id = next(_ring_ids)
        self.ring_bytes = ring_bytes
        self._data = mmap.mmap(-1, max(1, writers) * ring_bytes)
        self._view = memoryview(self._data)
        self._control = mmap.mmap(-1, max(8 * writers, mmap.PAGESIZE))
        self._read = np.frombuffer(self._control, dtype=np.int64, count=writers)
        self._written = [0] * writers
        _rings[self.id] = self

    def reset(self) -> None:
        """Before new workers start: every ring empty (the old workers are gone)."""
        self._read[:] = 0
        self._written = [0] * len(self._written)

    def dump(self, writer: int, obj: Any) -> _InRing | None:
        """Pickles ``obj`` straight into ``writer``'s ring: where it lies, or None when it does
        not fit in a quarter of the ring or in the room left (nothing is then taken).

        Straight into the ring, because a new bytes object above malloc's mmap threshold
        costs page faults: pickling 600 KB of text into one took 0.8 ms of system time against
        0.15 ms for pickling into the ring."""
        if not 0 <= writer < len(self._written):
            return None
        ring_bytes = self.ring_bytes
        start = self._written[writer]
        read = int(self._read[writer])
        offset = start % ring_bytes
        if start == read:  # empty: start over at 0, so that the pages in use stay few
            start += (ring_bytes - offset) % ring_bytes
            offset = 0
            room = ring_bytes // 4
        else:
            if ring_bytes - offset < ring_bytes // 4:  # little room before the end: start over at 0
                start += ring_bytes - offset
                offset = 0
            room = min(ring_bytes - offset, ring_bytes - (start - read), ring_bytes // 4)
        if room < _MIN_ROOM:
            return None
        base = writer * ring_bytes + offset
        window = _Window(self._view[base : base + room])
        try:
            ForkingPickler(window, pickle.HIGHEST_PROTOCOL).dump(obj)
        except _WindowFull:
            return None
        finally:
            window.view.release()
        self._written[writer] = start + window.used
        return _InRing(self.id, writer, start, window.used)

    def take(self, writer: int, start: int, size: int) -> Any:
        """The message at ``start`` unpickled; its space (and any skipped before it) is free again."""
        base = writer * self.ring_bytes + start % self.ring_bytes
        try:
            return ForkingPickler.loads(self._view[base : base + size])
        finally:
            self._read[writer] = start + size


#: Room in a ring below which a message is not even tried there.
_MIN_ROOM = 4096


class _WindowFull(Exception):
    pass


class _Window:
    """A file for the pickler over a stretch of a ring; writing past its end raises."""

    __slots__ = ("view", "used")

    def __init__(self, view: memoryview) -> None:
        self.view = view
        self.used = 0

    def write(self, data: Any) -> int:
        used = self.used
        size = len(data) if isinstance(data, bytes) else memoryview(data).nbytes
        if used + size > len(self.view):
            raise _WindowFull
        self.view[used : used + size] = data
        self.used = used + size
        return size


class _InRing:
    """The message a worker sends for one placed in its ring: where it lies."""

    __slots__ = ("ring", "writer", "start", "size")

    def __init__(self, ring: int, writer: int, start: int, size: int) -> None:
        self.ring, self.writer, self.start, self.size = ring, writer, start, size

    def __reduce__(self):
        return _from_ring, (self.ring, self.writer, self.start, self.size)


def _from_ring(ring_id: int, writer: int, start: int, size: int) -> Any:
    rings = _rings.get(ring_id)
    if rings is None:
        raise DatasetError(format_message("a message arrived from a dataloader worker whose loader is gone", found=f"ring {ring_id}"))
    return rings.take(writer, start, size)


def _worker_id() -> int | None:
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    return None if info is None else info.id


class DirectQueue(multiprocessing.queues.Queue):
    """A ``multiprocessing.Queue`` whose ``put`` writes to the pipe itself when that cannot block.

    Why a write then cannot block: the pipe holds its bytes in pages of 4 KiB, and a write wastes
    at most the rest of one page (a message is one write, or two above 16 KiB), so ``n`` unread
    messages of ``b`` bytes take at most ``b / 4096 + 2n + 1`` pages.  A direct write needs the
    unread bytes and its own to fill at most half the pipe; torch keeps at most ``prefetch_factor
    x workers`` messages in flight, and up to 60 of them leave room (256 pages in 1 MiB).
    """

    def __init__(self, maxsize: int = 0, *, ctx: Any) -> None:
        super().__init__(maxsize, ctx=ctx)
        #: The workers' rings (from :class:`DirectForkContext`), or None: every message in the pipe.
        self._rings: Rings | None = getattr(ctx, "rings", None)
        self._capacity = _widen(self._writer.fileno())
        self._reset_backlog()
        register_after_fork(self, DirectQueue._reset_backlog)

    def __setstate__(self, state: Any) -> None:
        super().__setstate__(state)
        self._capacity = _widen(self._writer.fileno())
        self._reset_backlog()

    def _reset_backlog(self) -> None:
        #: Guards the backlog and the choice between writing directly and queueing behind it.
        self._order = threading.Lock()
        self._backlog: collections.deque[bytes] = collections.deque()
        #: The sender thread while it runs (a list, so that the exit hook can see it without
        #: holding the queue).
        self._sender: list[threading.Thread | None] = [None]

    def put(self, obj: Any, block: bool = True, timeout: float | None = None) -> None:
        if self._closed:
            raise ValueError(f"Queue {self!r} is closed")
        if not self._sem.acquire(block, timeout):
            raise queue.Full
        try:
            # Under the lock: a ring frees its messages in the order they arrive, so they must be
            # placed in the order they are sent.
            with self._order:
                writer = None if self._rings is None else _worker_id()
                placed = None if writer is None else self._rings.dump(writer, obj)  # type: ignore[union-attr]
                data = ForkingPickler.dumps(obj if placed is None else placed)
                if not self._backlog and self._write_now(data):
                    return
                self._backlog.append(data)
                if self._sender[0] is None:
                    self._start_sender()
        except BaseException:
            self._sem.release()
            raise

    def _start_sender(self) -> None:
        thread = threading.Thread(target=self._send_backlog, name="DirectQueueSender", daemon=True)
        self._sender[0] = thread
        thread.start()
        # As multiprocessing's queue does: the process waits at exit until its messages are
        # written, unless ``cancel_join_thread`` (torch's workers call it on shutdown).
        if self._jointhread is None and not self._joincancelled:
            self._jointhread = Finalize(self, DirectQueue._join_sender, [self._sender], exitpriority=-5)

    @staticmethod
    def _join_sender(sender: list[threading.Thread | None]) -> None:
        thread = sender[0]
        if thread is not None:
            thread.join()

    def _write_now(self, data: bytes) -> bool:
        """Write ``data`` if that cannot block; False if it must wait for the sender."""
        if len(data) > self._capacity // 2 or not self._wlock.acquire(True, _LOCK_WAIT_S):
            return False
        try:
            writer = self._writer
            if _unread(writer.fileno()) + len(data) > self._capacity // 2:
                return False
            writer.send_bytes(data)
            return True
        finally:
            self._wlock.release()

    def _send_backlog(self) -> None:
        """The sender thread: writes the backlog in order (blocking if it must), then ends."""
        while True:
            with self._order:
                if not self._backlog:
                    self._sender[0] = None
                    return
                data = self._backlog[0]
            try:
                with self._wlock:
                    self._writer.send_bytes(data)
            except OSError as exc:  # the reading process is gone: nobody will read the rest
                logger.debug("a queue's reader is gone (%s); %d messages dropped", exc, len(self._backlog))
                with self._order:
                    self._backlog.clear()
                    self._sender[0] = None
                return
            with self._order:
                self._backlog.popleft()


class DirectForkContext(multiprocessing.context.ForkContext):
    """The fork start method, with :class:`DirectQueue` for ``Queue()`` (what the DataLoader's
    ``multiprocessing_context`` takes); with ``workers``, their rings (call ``rings.reset()``
    before new workers start)."""

    def __init__(self, workers: int = 0) -> None:
        super().__init__()
        self.rings = Rings(workers) if workers > 0 else None

    def Queue(self, maxsize: int = 0) -> DirectQueue:  # noqa: N802 (multiprocessing's name)
        return DirectQueue(maxsize, ctx=self)
