"""In a dataloader worker process: the shared-memory slabs its items go out through.

The loader activates them in each of its worker processes (:func:`activate_slabs`, from
``loader/streams.py``); the hand-over (``loader/handover/slabs.py``) copies a batch's tensors
into them, and batching (``samples.batch_stack``) stacks a batch straight into one
(:func:`slab_empty`), so that the hand-over has nothing left to copy.  It lives below the loader
because batching does.
"""

from __future__ import annotations

from typing import Any

__all__ = ["activate_slabs", "active", "slab_empty"]

#: In a worker process: (its loader's ring, its physical worker id).
active: tuple[Any, int] | None = None


def slab_empty(shape: tuple[int, ...], dtype: Any) -> Any:
    """In a worker with slabs: an uninitialised tensor in a free slab of its own, for a batch
    that will be sent as it is (the hand-over then copies nothing); None elsewhere, when it
    does not fit or no slab is free."""
    if active is None:
        return None
    ring, worker = active
    return ring.allocate(worker, shape, dtype)


def activate_slabs(ring: Any, worker: int) -> None:
    """In a worker process: its items go out through ``ring``'s slabs of ``worker``."""
    global active
    active = None if ring is None else (ring, worker)
