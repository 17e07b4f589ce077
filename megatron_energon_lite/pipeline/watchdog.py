"""WatchdogNode: passes a pipeline through and reports a ``next()`` that takes longer than a timeout.

The stage behind :class:`~megatron_energon_lite.pipeline.recipe.Watchdog` (and
every loader's default watchdog): a daemon thread per worker checks how long the running call has
taken and, when it is overdue, reports the stuck thread's stack and calls the trigger.

In a dataloader worker the report goes to the main process through the loader's
:class:`StuckReports` channel (the worker pipeline's runtime holds its sink): the main process logs it (the worker's own log may go nowhere a
person reads) and, when the worker then exits (``fail_on_timeout``), raises
:class:`~megatron_energon_lite.errors.WatchdogTimeoutError` carrying that stack instead of
torch's bare "worker exited unexpectedly".
"""

from __future__ import annotations

import linecache
import logging
import multiprocessing
import os
import sys
import threading
import time
import weakref
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from ..fork_hook import ForkMixin
from .node import ForwardsElastic, Node, PassThroughNode, State
from .runtime import Runtime

if TYPE_CHECKING:
    from .recipe import Watchdog

__all__ = ["StuckReports", "WatchdogNode", "describe_stack", "short_repr"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: The monitor thread wakes this many times per (shortest) timeout, at most once a second.
_CHECKS_PER_TIMEOUT = 4
_MAX_POLL_SECONDS = 1.0
_MIN_POLL_SECONDS = 0.01
#: A monitor thread whose stage has not been called for this long ends (the next call restarts it).
_IDLE_SECONDS = 10.0
#: Longest repr of one argument or local in a stack dump, and how many of them per frame.
_REPR_LIMIT = 200
_LOCALS_PER_FRAME = 20
#: Frames whose locals a stack dump shows when the watched stage is not on the stack.
_LOCALS_FRAMES = 10


class WatchdogNode(ForkMixin, PassThroughNode[T], ForwardsElastic):
    """Passes items, states and restores through; watches how long each ``next()`` takes.

    Fields the monitor thread reads (single writes, safe under the GIL): ``_calls`` counts
    started calls, ``_deadline`` is when the running call is overdue (None between calls),
    ``_caller`` is the thread running it. There is no state of its own: ``get_state`` is the
    source's state, unchanged.

    The monitor thread is started by the first ``next()`` and ends when the stage is garbage
    collected or has not been called for :data:`_IDLE_SECONDS` (the next call starts a new one),
    so an abandoned loader leaves no thread behind. ``_lock`` guards only that start and stop.
    """

    tag = "Watchdog"

    def __init__(
        self,
        source: Node[T],
        *,
        owner: Watchdog,
        timeout: float,
        initial_timeout: float | None,
        where: str,
        runtime: Runtime | None = None,
    ) -> None:
        self.owner = owner
        #: Its report_sink: where a report goes (a worker's channel to the main process).
        self.runtime = Runtime() if runtime is None else runtime
        self.timeout = timeout
        self.initial_timeout = timeout if initial_timeout is None else initial_timeout
        self.where = where
        self._first = True
        self._calls = 0
        self._fired_call = 0
        self._deadline: float | None = None
        self._limit = timeout
        self._caller = 0
        self._lock = threading.Lock()
        self._monitoring = False
        super().__init__(source)  # ForkMixin: a forked copy starts its own monitor thread

    def next(self) -> T:
        self._caller = threading.get_ident()
        self._calls += 1
        if self._first:
            self._first = False
            self._limit = self.initial_timeout
        else:
            self._limit = self.timeout
        self._deadline = time.monotonic() + self._limit
        # After the deadline is set: a monitor that saw no running call has stopped by now.
        if not self._monitoring:
            self._start_monitor()
        try:
            return self.source.next()
        finally:
            self._deadline = None

    # Transparent: the source's state, passes (passes.ending_pass) and restore keys.
    def get_state(self) -> State:
        return self.source.get_state()

    def reset(self, state: State | None = None) -> None:
        self._first = True
        self.source.reset(state)

    def __after_in_child_fork__(self) -> None:
        # Threads do not survive a fork (and a lock held by one would stay held): the copy
        # starts its own monitor when it is used.
        self._lock = threading.Lock()
        self._monitoring = False
        self._deadline = None

    # --- the monitor thread ----------------------------------------------------------------
    def _start_monitor(self) -> None:
        with self._lock:
            if self._monitoring:
                return
            self._monitoring = True
        shortest = min(self.timeout, self.initial_timeout)
        poll = min(_MAX_POLL_SECONDS, max(_MIN_POLL_SECONDS, shortest / _CHECKS_PER_TIMEOUT))
        threading.Thread(
            target=_monitor_loop,
            args=(weakref.ref(self), poll),
            name=f"energon-lite-watchdog ({self.where})",
            daemon=True,
        ).start()

    def _stop_if_idle(self, calls_before: int) -> bool:
        """Stops monitoring if no call ran since ``calls_before`` was read; True if stopped."""
        with self._lock:
            if self._deadline is not None or self._calls != calls_before:
                return False
            self._monitoring = False
            # A call that started just now saw _monitoring still True: keep watching it.
            if self._deadline is not None or self._calls != calls_before:
                self._monitoring = True
                return False
            return True

    def _check(self) -> None:
        """Fires once for a call that is past its deadline (read ``_calls`` before ``_deadline``)."""
        calls = self._calls
        limit = self._limit
        deadline = self._deadline
        if deadline is None or calls == self._fired_call or time.monotonic() < deadline:
            return
        self._fired_call = calls
        self._fire(calls, limit)

    def _fire(self, calls: int, limit: float) -> None:
        frame = sys._current_frames().get(self._caller)
        if frame is None:
            stack = "    (the thread has ended)"
        else:
            stack = describe_stack(frame, locals_below=WatchdogNode.next.__code__)
        del frame
        report = (
            f"watchdog: item {calls} of {self.where} is not done after {limit} s; stack of the "
            f"stuck thread (pid {os.getpid()}, most recent call last):\n{stack}"
        )
        if not _send_report(report, self.runtime.report_sink):
            logger.warning("%s", report)
        try:
            self.owner._watchdog_trigger()
        except Exception:
            logger.critical(
                "watchdog: stopping process %d (%s) after a stuck item", os.getpid(), self.where, exc_info=True
            )
            _flush_logs()
            os._exit(1)


def _send_report(report: str, sink: Callable[[str], None] | None) -> bool:
    """Hands ``report`` to the main process's channel ``sink``; False if there is none (or it failed)."""
    if sink is None:
        return False
    try:
        sink(report)
    except Exception:  # noqa: BLE001 - the report is logged here instead
        return False
    return True


class StuckReports:
    """The channel a loader's worker processes send their stuck-item reports through.

    Created in the main process before the workers start (they inherit it through fork);
    :meth:`sink` in a worker is where that worker pipeline's runtime sends its reports. A daemon thread in the main
    process logs each report as it comes and keeps the latest one per worker process, so that
    when a worker exits after its report, :meth:`report_of` gives the loader the stack to raise
    with. :meth:`close` (or garbage collection of the loader) ends the thread.
    """

    #: How long the loader waits for the report of a worker that just exited.
    WAIT_SECONDS = 2.0

    def __init__(self) -> None:
        self._queue = multiprocessing.get_context("fork").SimpleQueue()
        self._latest: dict[int, str] = {}
        self._arrived = threading.Condition()
        self._reader: threading.Thread | None = None

    def sink(self) -> Callable[[str], None]:
        """In a worker process: what sends a report of this process to the main process."""
        queue = self._queue
        return lambda report: queue.put((os.getpid(), report))

    def start(self) -> None:
        """In the main process, once: log reports as they arrive."""
        if self._reader is None:
            self._reader = threading.Thread(
                target=_read_reports, args=(self._queue, weakref.ref(self)), name="energon-lite-watchdog-reports", daemon=True
            )
            self._reader.start()

    def close(self) -> None:
        if self._reader is not None:
            self._queue.put(None)
            self._reader = None

    def _received(self, pid: int, report: str) -> None:
        logger.warning("%s", report)
        with self._arrived:
            self._latest[pid] = report
            self._arrived.notify_all()

    def report_of(self, pids: list[int]) -> str | None:
        """The latest report of one of ``pids`` (any worker's if ``pids`` is empty), waiting
        briefly for one that is still on its way; None if none came."""
        def pick() -> str | None:
            for pid in pids or list(self._latest):
                if pid in self._latest:
                    return self._latest[pid]
            return None

        with self._arrived:
            self._arrived.wait_for(lambda: pick() is not None, timeout=self.WAIT_SECONDS if self._reader is not None else 0)
            return pick()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown
            pass


def _read_reports(queue: Any, ref: weakref.ref[StuckReports]) -> None:
    while True:
        sent = queue.get()
        channel = ref()
        if sent is None or channel is None:
            return
        channel._received(*sent)
        del channel


def _monitor_loop(ref: weakref.ref[WatchdogNode], poll: float) -> None:
    """Checks the stage every ``poll`` seconds; ends once the stage is garbage collected or idle."""
    idle_since = time.monotonic()
    seen_calls = -1
    while True:
        time.sleep(poll)
        node = ref()
        if node is None:
            return
        try:
            node._check()
        except Exception:
            logger.exception("watchdog: the timeout report failed")
        calls = node._calls
        now = time.monotonic()
        if calls != seen_calls or node._deadline is not None:
            seen_calls, idle_since = calls, now
        elif now - idle_since > _IDLE_SECONDS and node._stop_if_idle(calls):
            return
        del node


def _flush_logs() -> None:
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:  # noqa: BLE001, S110 - best effort before the process ends
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001, S110 - best effort before the process ends
            pass


def describe_stack(frame: FrameType, *, locals_below: Any = None) -> str:
    """A thread's stack, oldest call first: file, line and source of every call, plus short
    reprs of the arguments and locals of the calls below the frame running ``locals_below``
    (a code object; the innermost calls when it is not on the stack).

    Tensors are described by shape, dtype and device only (the repr of a CUDA tensor would wait
    for the device, which may be what is stuck).
    """
    frames: list[FrameType] = []
    current: FrameType | None = frame
    while current is not None:
        frames.append(current)
        current = current.f_back
    frames.reverse()
    below = next((i + 1 for i, fr in enumerate(frames) if fr.f_code is locals_below), None)
    if below is None:
        below = max(0, len(frames) - _LOCALS_FRAMES)
    lines = []
    for depth, fr in enumerate(frames):
        code = fr.f_code
        lines.append(f'  File "{code.co_filename}", line {fr.f_lineno}, in {code.co_name}')
        source = linecache.getline(code.co_filename, fr.f_lineno).strip()
        if source:
            lines.append(f"    {source}")
        if depth < below:
            continue
        local_vars = dict(fr.f_locals)  # one snapshot: the thread is still running
        names = [name for name in local_vars if not name.startswith("__")]
        for name in names[:_LOCALS_PER_FRAME]:
            lines.append(f"      {name} = {short_repr(local_vars[name])}")
        if len(names) > _LOCALS_PER_FRAME:
            lines.append(f"      ... and {len(names) - _LOCALS_PER_FRAME} more locals")
    return "\n".join(lines)


def short_repr(value: Any) -> str:
    """``repr(value)`` cut to a readable length; never fails, never touches tensor data."""
    kind = type(value)
    if kind.__module__.startswith("torch") and hasattr(value, "shape") and hasattr(value, "device"):
        return f"<{kind.__name__} shape={tuple(value.shape)} dtype={getattr(value, 'dtype', '?')} device={value.device}>"
    try:
        text = repr(value)
    except Exception as exc:  # noqa: BLE001 - a broken __repr__ must not hide the stack
        return f"<{kind.__name__}: repr failed with {type(exc).__name__}>"
    if len(text) > _REPR_LIMIT:
        half = _REPR_LIMIT // 2
        text = f"{text[:half]} ... {text[-half:]}"
    return text
