"""The hand-over of items from loader workers to the main process through slabs of shared memory.

torch's default path sends every tensor of a batch through a new shared-memory segment whose file
descriptor the main process fetches over a socket: a copy, two system calls and a socket round
trip per tensor, with the main process (which also runs the training loop) doing its share.
Here each worker owns a ring of slabs in one anonymous ``MAP_SHARED`` mapping that the loader
creates before it forks its workers: a worker copies a batch's tensors into a free slab of its
ring and pickles only a small descriptor for each (slot, offset, dtype, shape); the main process
maps them as tensors over the same memory, without a copy.  The mapping has no name (nothing in
/dev/shm) and goes with the last process that maps it, however it ends (``kill -9`` included).

Lifetime: a slab is lent to the main process with the tensors made over it and returns to its
worker when the last of them is garbage (a ``weakref.finalize`` on the array they view), so the
training loop may hold a batch as long as it likes.  A worker that finds no free slab (the loop
holds many batches), a tensor that does not fit in what is left of the slab, and a tensor that
cannot be placed (not a dense CPU tensor, one that needs a gradient) take torch's path instead,
transparently; a batch larger than a slab is logged once with its size.

Per slab, a control word says who has it (free, written by its worker and in flight, held by the
main process) and a sequence number written after the data: the main process checks it against
the descriptor, so a slab that was not written completely is never read as a batch.

Fewer copies: the default batching stacks a batch's tensors straight into a slab of its worker
(``worker_slabs.slab_empty``), so the hand-over has nothing left to copy: its descriptor points
at where the stacked tensor already is.  Such a slab is held by the worker until the batch is sent (or
dropped without being sent: then it is free again).

Pickled items in bulk: a worker's bundle of small batches (text: 10 batches, 300-400 KB of
pickled strings) crossed the pipe whole, written to it by one process and read from it by the
other, page by page: on a 2-core machine about 0.5 ms per 380 KB, more than pickling them.  So
a bundle whose items' pickles reach :data:`PICKLES_IN_SLAB_MIN_BYTES` is written into one free
slab of its worker (:func:`pickles_to_slab`), and only their lengths and the slab's descriptor go
through the pipe; the main process unpickles each item straight from the slab and frees it at
once (:func:`load_pickles_from_slab`): nothing made from a pickle refers to the slab.

Tensors that share storage in the worker (a tensor and its view) arrive as separate copies.
"""

from __future__ import annotations

import io
import itertools
import logging
import mmap
import pickle
import sys
import threading
import weakref
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable

import numpy as np
import torch

from ... import worker_slabs
from ...errors import DatasetError, format_message
from ..env_settings import nonnegative_number

__all__ = [
    "PICKLES_IN_SLAB_MIN_BYTES",
    "SLAB_MIB_ENV",
    "SlabRing",
    "dump_for_main",
    "load_from_worker",
    "load_pickles_from_slab",
    "pickles_to_slab",
    "slab_bytes_from_env",
]

logger = logging.getLogger("megatron_energon_lite.handover")  # unchanged by the move into loader/: the name users configure

#: Environment variable: MiB per slab (default 64); 0 turns slabs off (torch's path for all).
SLAB_MIB_ENV = "ENERGON_LITE_SLAB_MIB"
_DEFAULT_SLAB_MIB = 64
#: Pickles that reach this many bytes together cross in a slab (:func:`pickles_to_slab`); fewer
#: go through the pipe, in one write.
PICKLES_IN_SLAB_MIN_BYTES = 16 << 10
#: Offsets of tensors in a slab are multiples of this (cache lines; any dtype's alignment).
_ALIGN = 64
#: Linux's MAP_NORESERVE (Python's mmap module does not name it; the same value on x86-64 and
#: arm64); elsewhere no flag.
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform == "linux" else 0)

# Control words: who has a slab (allocated: a worker's batch was made in it and is not sent yet).
_FREE, _IN_FLIGHT, _HELD, _ALLOCATED = 0, 1, 2, 3

# Process-wide, not per run: the live rings by id (a batch's descriptor names its ring), their lock.
_rings: weakref.WeakValueDictionary[int, SlabRing] = weakref.WeakValueDictionary()
_ring_ids = itertools.count()
_lock = threading.Lock()
_logged_too_large = False  # process-wide, not per run: the message is logged once per process


def slab_bytes_from_env() -> int:
    """Bytes per slab from :data:`SLAB_MIB_ENV` (0: slabs off)."""
    mib = nonnegative_number(SLAB_MIB_ENV, _DEFAULT_SLAB_MIB, unit="MiB", zero_means="send every batch through torch's shared memory")
    return int(mib * (1 << 20)) // _ALIGN * _ALIGN


class SlabRing:
    """``slots`` slabs of ``slab_bytes`` for each of ``workers`` workers, in one anonymous shared
    mapping, made by the main process before it forks the workers.  Pages are committed only
    where a batch was written (a slab of 64 MiB that holds 6 MiB batches costs 6 MiB)."""

    def __init__(self, workers: int, slots: int, slab_bytes: int) -> None:
        self.workers, self.slots, self.slab_bytes = workers, slots, slab_bytes
        data = workers * slots * slab_bytes
        control = workers * slots * 2 * 8  # (state, sequence) per slab, int64
        # No reservation: most of the mapping is never written (a slab of 64 MiB that holds
        # 6 MiB batches), and counting all of it against the commit limit could refuse it.
        self._map = mmap.mmap(-1, data + control, flags=mmap.MAP_SHARED | _MAP_NORESERVE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        self.data = np.frombuffer(self._map, dtype=np.uint8, count=data)
        self.control = np.frombuffer(self._map, dtype=np.int64, count=workers * slots * 2, offset=data).reshape(workers, slots, 2)
        self._sequence = 0  # a worker's own counter (each forked copy counts on its own)
        # In a worker, its main thread (allocating batches) and its queue feeder (sending them)
        # both change its control words.
        self._worker_lock = threading.Lock()
        self._address = self.data.ctypes.data
        with _lock:
            self.id = next(_ring_ids)
            _rings[self.id] = self

    def slab(self, worker: int, slot: int) -> np.ndarray:
        start = (worker * self.slots + slot) * self.slab_bytes
        return self.data[start : start + self.slab_bytes]

    def reclaim_in_flight(self) -> None:
        """Before new workers start: slabs written or allocated by the old ones and never
        received (their queue was dropped) are free again; slabs the main process holds stay
        held."""
        states = self.control[..., 0]
        states[(states == _IN_FLIGHT) | (states == _ALLOCATED)] = _FREE

    # --- worker side ---------------------------------------------------------------------------
    def acquire(self, worker: int, state: int = _IN_FLIGHT) -> tuple[int, int] | None:
        """A free slot of ``worker``'s ring, marked ``state``, and its sequence number."""
        with self._worker_lock:
            states = self.control[worker, :, 0]
            free = np.flatnonzero(states == _FREE)
            if not len(free):
                return None
            slot = int(free[0])
            states[slot] = state
            self._sequence += 1
            return slot, self._sequence

    def give_back(self, worker: int, slot: int) -> None:
        with self._worker_lock:
            self.control[worker, slot, 0] = _FREE

    def allocate(self, worker: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
        """An uninitialised tensor in a free slab of ``worker``, marked allocated (see
        ``worker_slabs.slab_empty``), or None when it does not fit or no slab is free."""
        nbytes = int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size()
        if nbytes == 0 or nbytes > self.slab_bytes:
            return None
        taken = self.acquire(worker, _ALLOCATED)
        if taken is None:
            return None
        slot, sequence = taken
        with self._worker_lock:
            self.control[worker, slot, 1] = sequence
        start = (worker * self.slots + slot) * self.slab_bytes
        # Its own array (over its own memoryview): when the worker drops the batch unsent, the
        # slab is free again.
        array = np.frombuffer(memoryview(self._map)[start : start + nbytes], dtype=np.uint8)
        weakref.finalize(array, self._drop_allocation, worker, slot, sequence)
        return torch.from_numpy(array).view(dtype).view(shape)

    def seal(self, worker: int, slot: int, sequence: int) -> None:
        """The slab's data is complete (written last, checked by the main process)."""
        with self._worker_lock:
            self.control[worker, slot, 1] = sequence
            self.control[worker, slot, 0] = _IN_FLIGHT

    def allocation_of(self, worker: int, tensor: torch.Tensor) -> tuple[int, int, int] | None:
        """``(slot, sequence, offset)`` when ``tensor`` is contiguous and lies in a slab that
        ``worker`` allocated (``worker_slabs.slab_empty``) and has not sent yet."""
        address = tensor.data_ptr() - self._address
        first = worker * self.slots * self.slab_bytes
        if not (first <= address < first + self.slots * self.slab_bytes) or not tensor.is_contiguous():
            return None
        slot, offset = divmod(address - first, self.slab_bytes)
        state, sequence = (int(v) for v in self.control[worker, slot])
        if state != _ALLOCATED or offset + tensor.numel() * tensor.element_size() > self.slab_bytes:
            return None
        return slot, sequence, offset

    def _drop_allocation(self, worker: int, slot: int, sequence: int) -> None:
        """The worker's tensor over an allocated slab is gone: free unless it was sent."""
        with self._worker_lock:
            if tuple(int(v) for v in self.control[worker, slot]) == (_ALLOCATED, sequence):
                self.control[worker, slot, 0] = _FREE

    # --- main side -----------------------------------------------------------------------------
    def lease(self, worker: int, slot: int, sequence: int) -> np.ndarray:
        """The slab as an array whose death (with every tensor made over it) frees the slab."""
        if not (0 <= worker < self.workers and 0 <= slot < self.slots):
            raise DatasetError(format_message("a batch names a slab that does not exist", found=f"worker {worker}, slot {slot}", expected=f"{self.workers} workers x {self.slots} slots"))
        state, sealed = (int(v) for v in self.control[worker, slot])
        if state != _IN_FLIGHT or sealed != sequence:
            raise DatasetError(
                format_message(
                    "a dataloader worker's batch was not written completely to shared memory; it is discarded",
                    where=f"worker {worker}, slab {slot}",
                    expected=f"slab in flight with sequence {sequence}",
                    found=f"state {state}, sequence {sealed}",
                    fix="see the worker's error above (it probably died while writing)",
                )
            )
        self.control[worker, slot, 0] = _HELD
        # Over a memoryview of its own, so that the arrays sliced from it name it as their base
        # (slices of an array over the mapping itself would skip it): it lives as long as they do.
        start = (worker * self.slots + slot) * self.slab_bytes
        array = np.frombuffer(memoryview(self._map)[start : start + self.slab_bytes], dtype=np.uint8)
        weakref.finalize(array, _release, self.control, worker, slot)
        return array

    def close(self) -> None:
        with _lock:
            _rings.pop(self.id, None)


def _release(control: np.ndarray, worker: int, slot: int) -> None:
    control[worker, slot, 0] = _FREE


class _Placement:
    """Puts the dense CPU tensors of one item into a slab of its worker, for its pickler.

    ``reduce`` is the pickler's reducer for ``torch.Tensor`` (its dispatch table, which pickle
    consults for tensors alone: a ``persistent_id`` would be a Python call for every string and
    number of the item, and doubled the pickling time of a text batch).  It holds no reference
    to the pickler, whose memo would otherwise live in a cycle until the garbage collector runs.
    """

    def __init__(self, ring: SlabRing, worker: int, torch_reduce: Callable[[torch.Tensor], tuple] | None) -> None:
        self.ring, self.worker = ring, worker
        self.torch_reduce = torch_reduce
        self.slot: tuple[int, int] | None = None  # where tensors are copied
        self.sent: set[tuple[int, int]] = set()  # allocated slabs whose tensors go as they are
        self.used = 0
        self.refused = False  # no free slab: the rest goes torch's way
        self.too_large = 0

    def reduce(self, obj: torch.Tensor) -> tuple:
        descriptor = self._place(obj)
        if descriptor is not None:
            return _slab_tensor, (descriptor,)
        return self.torch_reduce(obj) if self.torch_reduce is not None else obj.__reduce_ex__(pickle.HIGHEST_PROTOCOL)

    def _place(self, obj: torch.Tensor) -> tuple | None:
        """The descriptor of ``obj`` in a slab (copied there, unless it was made there), or None."""
        if self.refused or obj.device.type != "cpu" or obj.layout is not torch.strided or obj.requires_grad or obj.is_quantized or obj.numel() == 0:
            return None
        allocated = self.ring.allocation_of(self.worker, obj)
        if allocated is not None:  # made in a slab already: nothing to copy
            slot, sequence, offset = allocated
            self.sent.add((slot, sequence))
            return ("slab", self.ring.id, self.worker, slot, sequence, offset, obj.dtype, tuple(obj.shape))
        nbytes = obj.numel() * obj.element_size()
        offset = -(-self.used // _ALIGN) * _ALIGN
        if offset + nbytes > self.ring.slab_bytes:
            self.too_large += nbytes
            return None
        if self.slot is None:
            self.slot = self.ring.acquire(self.worker)
            if self.slot is None:
                self.refused = True
                return None
        target = torch.from_numpy(self.ring.slab(self.worker, self.slot[0])[offset : offset + nbytes]).view(obj.dtype).view(obj.shape)
        target.copy_(obj)
        self.used = offset + nbytes
        return ("slab", self.ring.id, self.worker, self.slot[0], self.slot[1], offset, obj.dtype, tuple(obj.shape))


def dump_for_main(payload: Any) -> bytes:
    """``payload`` pickled for the main process: through this worker's slabs when it has a ring,
    else (and for what does not fit) as torch pickles it."""
    global _logged_too_large
    if worker_slabs.active is None:
        return bytes(ForkingPickler.dumps(payload))
    ring, worker = worker_slabs.active
    buffer = io.BytesIO()
    pickler = ForkingPickler(buffer, pickle.HIGHEST_PROTOCOL)
    # Exact type: tensor subclasses (parameters) go torch's way.
    placement = _Placement(ring, worker, pickler.dispatch_table.get(torch.Tensor))
    pickler.dispatch_table[torch.Tensor] = placement.reduce
    try:
        pickler.dump(payload)
    except BaseException:
        if placement.slot is not None:
            ring.give_back(worker, placement.slot[0])
        raise
    for slot, sequence in [*placement.sent, *([placement.slot] if placement.slot is not None else [])]:
        ring.seal(worker, slot, sequence)
    if placement.too_large and not _logged_too_large:
        _logged_too_large = True
        logger.info(
            "a batch holds more tensor data than a slab (%d bytes did not fit in %d); it went through torch's shared memory (set %s to a larger number of MiB)",
            placement.used + placement.too_large, ring.slab_bytes, SLAB_MIB_ENV,
        )
    return buffer.getvalue()


def pickles_to_slab(pickles: list[bytes]) -> tuple[int, int, int, int, int] | None:
    """In a worker with slabs: ``pickles`` (made by :func:`dump_for_main`) written one after
    another into a free slab of its own, which is then sealed; the descriptor that
    :func:`load_pickles_from_slab` takes.  None, and they go as they are, without slabs, when
    they are smaller than :data:`PICKLES_IN_SLAB_MIN_BYTES` together or larger than a slab, or
    when no slab is free."""
    if worker_slabs.active is None:
        return None
    ring, worker = worker_slabs.active
    total = sum(len(data) for data in pickles)
    if total < PICKLES_IN_SLAB_MIN_BYTES or total > ring.slab_bytes:
        return None
    taken = ring.acquire(worker)
    if taken is None:
        return None
    slot, sequence = taken
    slab = ring.slab(worker, slot)
    offset = 0
    for data in pickles:
        slab[offset : offset + len(data)] = np.frombuffer(data, dtype=np.uint8)
        offset += len(data)
    ring.seal(worker, slot, sequence)
    return ring.id, worker, slot, sequence, total


def load_pickles_from_slab(descriptor: tuple, lengths: list[int]) -> list[Any]:
    """In the main process: the payloads of :func:`pickles_to_slab`'s pickles, of ``lengths``
    bytes each, loaded as :func:`load_from_worker` loads them; the slab is free again when this
    returns (or raises)."""
    if not (isinstance(descriptor, tuple) and len(descriptor) == 5 and all(type(v) is int for v in descriptor)):
        raise pickle.UnpicklingError(f"a slab of pickles {descriptor!r} is not one pickles_to_slab made")
    ring_id, worker, slot, sequence, total = descriptor
    ring = _rings.get(ring_id)
    if ring is None:
        raise DatasetError(format_message("a batch arrived for a loader whose shared memory is gone", found=f"ring {ring_id}"))
    if not (0 <= total <= ring.slab_bytes and sum(lengths) == total and all(type(n) is int and n >= 0 for n in lengths)):
        raise pickle.UnpicklingError(f"pickles of {lengths!r} bytes do not make the {total} bytes written to a slab of {ring.slab_bytes}")
    lease = ring.lease(worker, slot, sequence)
    try:
        loaded = []
        offset = 0
        with memoryview(lease) as view:
            for length in lengths:
                with view[offset : offset + length] as data:
                    loaded.append(load_from_worker(data))
                offset += length
        return loaded
    finally:
        del lease  # its finalizer frees the slab (a traceback would otherwise keep it held)


#: While :func:`load_from_worker` runs: the slabs its payload's tensors were leased from (one
#: call's, in its thread: not per run).
_loading = threading.local()


def _slab_tensor(descriptor: tuple) -> torch.Tensor:
    """A tensor over the main process's mapping of a slab (unpickling a :func:`dump_for_main`)."""
    leases = getattr(_loading, "leases", None)
    if leases is None or not (isinstance(descriptor, tuple) and len(descriptor) == 8 and descriptor[0] == "slab"):
        raise pickle.UnpicklingError(f"a slab tensor {descriptor!r} outside load_from_worker")
    _, ring_id, worker, slot, sequence, offset, dtype, shape = descriptor
    ring = _rings.get(ring_id)
    if ring is None:
        raise DatasetError(format_message("a batch arrived for a loader whose shared memory is gone", found=f"ring {ring_id}"))
    key = (ring_id, worker, slot)
    lease = leases.get(key)
    if lease is None:
        lease = leases[key] = ring.lease(worker, slot, sequence)
    nbytes = int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size()
    return torch.from_numpy(lease[offset : offset + nbytes]).view(dtype).view(shape)


def load_from_worker(data: bytes | memoryview) -> Any:
    """The payload :func:`dump_for_main` made, its slab tensors mapped over the shared memory."""
    _loading.leases = {}
    try:
        return pickle.loads(data)
    finally:
        _loading.leases = None
