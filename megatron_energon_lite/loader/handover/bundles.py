"""Several of a worker's items in one message to the main process, delivered in the same order.

Every message from a dataloader worker costs both sides a fixed amount: the worker's queue thread
wakes up and writes to a pipe, the main process polls, reads, unpickles and asks for the next
item through the index queue (whose own thread wakes up in turn).  For small items, text batches
of a few KB, that cost is as large as making the item, and on a machine with as many cores as
processes it is paid in the time the training loop waits.  So a worker sends what it made within
a few milliseconds in one :class:`Bundle`: heavy items (image batches take longer than that) still
go one per message, while small ones go by the dozen.

The order the training loop sees does not change.  torch asks its workers in turn and returns
their results in that order, skipping a worker once its pass is over; :class:`Interleave` takes
the bundles as they come and hands out their items one worker at a time in the same turns, so the
items, the worker states that travel with them (and so every saved state) are those of sending
one item per message.  A worker ends its last bundle with :data:`PASS_OVER`, which tells whose
turns are over.

Bounded: torch returns the workers' bundles strictly in turn, so a worker whose bundles hold more
items than another's would pile up items in the main process, one bundle's worth per round.  The
main process tells each worker, through a word of shared memory (:class:`BundleLimits`), how many
items its next bundle may hold: one while it already holds more than a full bundle of that
worker's items, else :data:`MAX_BUNDLE_ITEMS`.  So the items waiting in the main process stay
below a few bundles per worker, besides torch's ``prefetch_factor`` requests.

A bundle's items are pickled already in the worker (the loader's carriers hold their
:func:`~.slabs.dump_for_main` bytes as ``data``): with slabs, those bytes cross in a slab of
the worker and only their lengths go through the pipe (see :mod:`.slabs`).
"""

from __future__ import annotations

import mmap
import time
from collections import deque
from typing import Any, Callable, Iterable, Iterator

from torch._utils import ExceptionWrapper

from ...errors import DatasetError, format_message
from ..env_settings import nonnegative_number
from .slabs import load_pickles_from_slab, pickles_to_slab

__all__ = ["BUNDLE_MS_ENV", "Bundle", "BundleLimits", "Interleave", "PASS_OVER", "bundle_seconds_from_env", "bundled"]

#: Environment variable: milliseconds a worker may spend filling one bundle (default 5); 0 sends
#: every item in a message of its own.
BUNDLE_MS_ENV = "ENERGON_LITE_BUNDLE_MS"
_DEFAULT_BUNDLE_MS = 5.0
#: Most items in one bundle: at a worker's start, bundles grow from one item (the first batch is
#: not held back) by doubling up to this.
MAX_BUNDLE_ITEMS = 16
#: A bundle closes once its pickled items pass this many bytes (tensors sent through the slabs
#: are not counted: heavy batches close a bundle by taking longer than the time allowed).
MAX_BUNDLE_BYTES = 1 << 20


class _PassOver:
    """The last entry of a worker's pass: its turns are over until the next pass."""

    def __reduce__(self):
        return (_pass_over, ())


def _pass_over() -> _PassOver:
    return PASS_OVER


PASS_OVER = _PassOver()


def bundle_seconds_from_env() -> float:
    """Seconds a worker may spend on one bundle (:data:`BUNDLE_MS_ENV`; 0: bundles are off)."""
    return nonnegative_number(BUNDLE_MS_ENV, _DEFAULT_BUNDLE_MS, unit="milliseconds", zero_means="send items one by one") / 1000


class BundleLimits:
    """Per worker, the most items its next bundle may hold: set by the main process, read by the
    worker (anonymous shared memory made before the workers are forked)."""

    def __init__(self, num_workers: int) -> None:
        import numpy as np

        self._map = mmap.mmap(-1, max(4 * num_workers, mmap.PAGESIZE))
        self.limits = np.frombuffer(self._map, dtype=np.int32, count=num_workers)
        self.limits[:] = MAX_BUNDLE_ITEMS

    def of(self, logical: int) -> int:
        return int(self.limits[logical])

    def set(self, logical: int, limit: int) -> None:
        self.limits[logical] = limit


class Bundle:
    """Entries one worker made, in the order it made them: in the worker each already pickled
    for the main process (whose unpickling gives the entry back)."""

    __slots__ = ("logical", "entries")

    def __init__(self, logical: int, entries: list) -> None:
        self.logical = logical
        self.entries = entries

    def __reduce__(self):
        pickled = [_pickled(entry) for entry in self.entries]
        pickles = [data for data in pickled if data is not None]
        descriptor = pickles_to_slab(pickles)
        if descriptor is None:
            return Bundle, (self.logical, self.entries)
        # In the entries' place: the length of each one's pickle (an entry is never an int).
        layout = [entry if data is None else len(data) for entry, data in zip(self.entries, pickled)]
        return _bundle_from_slab, (self.logical, descriptor, layout)

    def pin_memory(self) -> Bundle:
        """What torch's pin-memory thread calls: the entries' tensors copied to pinned memory."""
        from torch.utils.data._utils.pin_memory import pin_memory

        return Bundle(self.logical, [pin_memory(entry) for entry in self.entries])


def _pickled(entry: Any) -> bytes | None:
    """An entry's payload as :func:`~.slabs.dump_for_main` pickled it (a loader's carrier), or None."""
    data = getattr(entry, "data", None)
    return data if type(data) is bytes else None


def _bundle_from_slab(logical: int, descriptor: tuple, layout: list) -> Bundle:
    """Unpickling a bundle whose pickled entries crossed in a slab (:meth:`Bundle.__reduce__`)."""
    loaded = iter(load_pickles_from_slab(descriptor, [item for item in layout if type(item) is int]))
    return Bundle(logical, [next(loaded) if type(item) is int else item for item in layout])


def bundled(entries: Iterable[Any], logical: int, carry: Callable[[Any], Any], size_of: Callable[[Any], int], seconds: float, limits: BundleLimits, *, where: str) -> Iterator[Bundle]:
    """A worker's ``entries`` in bundles: ``carry`` pickles one entry (``size_of``: the bytes of
    what it returns); a bundle closes after ``seconds``, ``limits.of(logical)`` items (at first
    fewer: 1, 2, 4, ...), or :data:`MAX_BUNDLE_BYTES`, and the last one ends with
    :data:`PASS_OVER`.

    An error raised by ``entries`` travels in the bundle, after the items made before it, as
    torch's ``ExceptionWrapper`` (``where``: the worker, for its message), followed by
    :data:`PASS_OVER`: the main process raises it in that worker's turn, and the worker's pass is
    over, as when torch gets the error directly.
    """
    ramp = 1
    entries = iter(entries)
    while True:
        limit = min(ramp, limits.of(logical))
        bundle: list = []
        size = 0
        started = time.perf_counter()
        while True:
            try:
                carrier = carry(next(entries))
            except StopIteration:
                bundle.append(PASS_OVER)
                yield Bundle(logical, bundle)
                return
            except Exception:  # noqa: BLE001 - re-raised in the main process
                bundle += [ExceptionWrapper(where=where), PASS_OVER]
                yield Bundle(logical, bundle)
                return
            bundle.append(carrier)
            size += size_of(carrier)
            if len(bundle) >= limit or size >= MAX_BUNDLE_BYTES or time.perf_counter() - started >= seconds:
                break
        yield Bundle(logical, bundle)
        ramp = min(2 * ramp, MAX_BUNDLE_ITEMS)


class Interleave:
    """The main process's side: entries from torch's stream of bundles, one worker's turn at a time.

    ``first`` is the logical worker that torch's first physical worker serves; torch asks the
    workers in that cyclic order, and so does this.  ``limits``: where this tells the workers how
    large their next bundles may be.  Not a generator: an error raised by the stream (a worker's
    exception) leaves this usable, as torch's iterator is.
    """

    def __init__(self, stream: Iterator[Any], workers: int, first: int, limits: BundleLimits) -> None:
        self._stream = stream
        self._limits = limits
        limits.limits[:] = MAX_BUNDLE_ITEMS  # a new pass: no items wait yet
        self._workers = workers
        self._pending: list[deque] = [deque() for _ in range(workers)]
        self._over = [False] * workers
        self._turn = first

    def __iter__(self) -> Interleave:
        return self

    def __next__(self) -> Any:
        while not all(self._over):
            worker = self._turn
            if self._over[worker]:  # torch no longer asks a worker whose pass is over
                self._turn = (worker + 1) % self._workers
                continue
            pending = self._pending[worker]
            while not pending:
                self._take(next(self._stream))  # StopIteration here: torch's pass ended early
            entry = pending.popleft()
            if entry is PASS_OVER:
                self._over[worker] = True
            self._turn = (worker + 1) % self._workers
            if isinstance(entry, ExceptionWrapper):
                entry.reraise()
            if entry is not PASS_OVER:
                return entry
        for bundle in self._stream:  # torch ends its pass: nothing more may come
            self._take(bundle)
            if any(self._pending):
                raise DatasetError(format_message("a dataloader worker sent items after its pass was over", found=f"worker {bundle.logical}"))
        raise StopIteration

    def _take(self, bundle: Any) -> None:
        if not isinstance(bundle, Bundle):
            raise TypeError(f"expected a Bundle from a dataloader worker, got {type(bundle).__name__}")
        pending = self._pending[bundle.logical]
        pending.extend(bundle.entries)
        self._limits.set(bundle.logical, 1 if len(pending) > MAX_BUNDLE_ITEMS else MAX_BUNDLE_ITEMS)
