"""Counter-based randomness: every random choice is a function of (seed, stage, counter).

No stage keeps a generator object in its state, and nothing saves or restores global RNG state:
a stage that needs the k-th random draw asks for ``rng_for(seed, stage, k)``.  Restoring a stage
therefore only needs its counters.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np


def stage_id(name: str) -> int:
    """A stable 32-bit number for a stage name (Python's ``hash`` changes between runs)."""
    return int.from_bytes(hashlib.sha1(name.encode("utf-8")).digest()[:4], "little")


def rng_for(seed: int, stage: str, *counter: int) -> np.random.Generator:
    """A fresh generator for draw ``counter`` of ``stage``; the same inputs give the same stream."""
    return np.random.default_rng((seed & 0xFFFFFFFFFFFFFFFF, stage_id(stage), *counter))


def uniform(seed: int, stage: int, *counter: int) -> float:
    """One draw in [0, 1) for (seed, stage, counter): a keyed hash, about 1 µs.

    For per-sample choices on the hot path, where building a generator (about 20 µs) would cost
    more than the rest of the stage.  ``stage`` is a :func:`stage_id`.
    """
    mask = 0xFFFFFFFFFFFFFFFF
    data = struct.pack(f"<{2 + len(counter)}Q", seed & mask, stage & mask, *(c & mask for c in counter))
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") / 18446744073709551616.0


def worker_seed(global_worker_id: int, seed_offset: int = 0) -> int:
    """Energon's per-worker seed: the last 4 bytes of sha1(f"{worker},{offset}"), big-endian."""
    digest = hashlib.sha1(f"{global_worker_id},{seed_offset}".encode()).digest()
    return int.from_bytes(digest, "big") & 0xFFFFFFFF
