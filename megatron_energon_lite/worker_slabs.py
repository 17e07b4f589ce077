"""In a dataloader worker process: the shared-memory slabs its items go out through.

The loader sets them in each of its worker processes (:func:`use_in_this_process`, from
``loader/streams.py``); the hand-over (``loader/handover/slabs.py``) copies a batch's tensors
into them, and batching (``samples.batch_stack``) stacks a batch straight into one
(:func:`slab_empty`), so that the hand-over has nothing left to copy.  It lives below the loader
because batching does.

Process-wide, not per run (unlike the rest of a worker pipeline's runtime,
``pipeline/runtime.py``): a DataLoader worker process serves one worker of one loader for its
whole life, and ``batch_stack`` is a public helper that user hooks call without any handle on the
pipeline.  The main process never has slabs.
"""

from __future__ import annotations

from typing import Any

__all__ = ["active", "slab_empty", "use_in_this_process"]

#: In a dataloader worker process: (its loader's ring, its physical worker id); None elsewhere.
active: tuple[Any, int] | None = None


def slab_empty(shape: tuple[int, ...], dtype: Any) -> Any:
    """In a worker with slabs: an uninitialised tensor in a free slab of its own, for a batch
    that will be sent as it is (the hand-over then copies nothing); None elsewhere, when it
    does not fit or no slab is free."""
    if active is None:
        return None
    ring, worker = active
    return ring.allocate(worker, shape, dtype)


def use_in_this_process(ring: Any, worker: int) -> None:
    """In a dataloader worker process: its items go out through ``ring``'s slabs of ``worker``
    (None: torch's shared memory)."""
    global active
    active = None if ring is None else (ring, worker)
