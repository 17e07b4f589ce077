"""Counter-based randomness: every random choice is a function of (seed, stage, counter).

No stage keeps a generator object in its state, and nothing saves or restores global RNG state:
a stage that needs the k-th random draw asks for ``rng_for(seed, stage, k)``.  Restoring a stage
therefore only needs its counters.
"""

from __future__ import annotations

import hashlib

# numpy.random is loaded here, before workers fork (numpy loads it lazily): a forked worker
# importing it itself sometimes died with a KeyError in importlib's module lock (seen in
# tests/cli/test_checkpoint.py, 4 runs of 4).
import numpy as np
import numpy.random  # noqa: F401


def stage_id(name: str) -> int:
    """A stable 32-bit number for a stage name (Python's ``hash`` changes between runs)."""
    return int.from_bytes(hashlib.sha1(name.encode("utf-8")).digest()[:4], "little")


def rng_for(seed: int, stage: str, *counter: int) -> np.random.Generator:
    """A fresh generator for draw ``counter`` of ``stage``; the same inputs give the same stream."""
    return np.random.default_rng((seed & 0xFFFFFFFFFFFFFFFF, stage_id(stage), *counter))


class UniformStream:
    """Draw ``n`` of (seed, stage, *prefix) in [0, 1), for hot paths that draw once per sample.

    Draws come in blocks of :attr:`BLOCK` from ``rng_for(seed, stage, *prefix, block)``, so a draw
    is a pure function of its counter (restorable from the counter alone) and costs an array
    lookup instead of a generator or a hash.
    """

    BLOCK = 1024

    def __init__(self, seed: int, stage: str, *prefix: int) -> None:
        self._key = (seed, stage, *prefix)
        self._block_index = -1
        self._block: list[float] = []

    def at(self, counter: int) -> float:
        block, offset = divmod(counter, self.BLOCK)
        if block != self._block_index:
            self._block = rng_for(*self._key, block).random(self.BLOCK).tolist()
            self._block_index = block
        return self._block[offset]


def worker_seed(global_worker_id: int, seed_offset: int = 0) -> int:
    """Energon's per-worker seed: the last 4 bytes of sha1(f"{worker},{offset}"), big-endian."""
    digest = hashlib.sha1(f"{global_worker_id},{seed_offset}".encode()).digest()
    return int.from_bytes(digest, "big") & 0xFFFFFFFF


def dataset_seed(seed: int, dataset_index: int) -> int:
    """The seed of dataset ``dataset_index`` of a blend in one worker.

    The first dataset keeps the worker seed (a single dataset reads as before); the others get a
    hash of it, so two entries of the same dataset do not read in the same order (in Energon they
    do, en#266).
    """
    if dataset_index == 0:
        return seed
    digest = hashlib.sha1(f"{seed},dataset,{dataset_index}".encode()).digest()
    return int.from_bytes(digest[:4], "little")
