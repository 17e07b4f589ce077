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
"""

from __future__ import annotations

import collections
import fcntl
import logging
import multiprocessing.context
import multiprocessing.queues
import os
import queue
import struct
import termios
import threading
from multiprocessing.reduction import ForkingPickler
from multiprocessing.util import Finalize, register_after_fork
from typing import Any

__all__ = ["DIRECT_QUEUES_ENV", "DirectForkContext", "DirectQueue", "PIPE_BYTES", "direct_queues_from_env"]

logger = logging.getLogger("megatron_energon_lite.worker_queue")  # unchanged by the move into loader/: the name users configure

#: Environment variable: ``0`` gives the loader multiprocessing's own queues (a feeder thread each).
DIRECT_QUEUES_ENV = "ENERGON_LITE_DIRECT_QUEUES"
#: Pipe size asked for (Linux lets any process widen a pipe to /proc/sys/fs/pipe-max-size, 1 MiB by
#: default); with less, the direct path takes correspondingly smaller messages.
PIPE_BYTES = 1 << 20
_F_SETPIPE_SZ = 1031
_F_GETPIPE_SZ = 1032
#: How long ``put`` waits for another process's write before handing its message to the sender.
_LOCK_WAIT_S = 0.01


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
        data = ForkingPickler.dumps(obj)
        if not self._sem.acquire(block, timeout):
            raise queue.Full
        with self._order:
            if not self._backlog and self._write_now(data):
                return
            self._backlog.append(data)
            if self._sender[0] is None:
                self._start_sender()

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
    ``multiprocessing_context`` takes)."""

    def Queue(self, maxsize: int = 0) -> DirectQueue:  # noqa: N802 (multiprocessing's name)
        return DirectQueue(maxsize, ctx=self.get_context())
