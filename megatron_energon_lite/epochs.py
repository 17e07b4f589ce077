"""Epochs over a map-style dataset: ``EpochIndex``, a stateless shuffle, and the resampler.

The shapes BioNeMo's Megatron recipes use (research/megatron_data.md 4): a dataset looked up by
``EpochIndex(epoch, idx)`` returns the same sample for the same index, and may let ``epoch`` vary
its augmentation; :class:`MultiEpochResampler` turns it into a flat dataset of ``num_samples``
positions, each epoch in its own order. Nothing here keeps state: position ``i`` of the resampler
is a pure function of ``(i, len(dataset), seed)``, so resuming only needs the count of samples
consumed (what Megatron's samplers save).

:func:`permute` is a hashed permutation in O(1) memory: a bijection on the ``b``-bit integers
(``2**b >= length``) built from xor with a key, multiplication by an odd number and xorshift,
each invertible modulo ``2**b``, applied in rounds keyed by the seed; values ``>= length`` walk
the cycle until they land inside ``[0, length)``, which keeps it a bijection there.
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Any, NamedTuple

import numpy as np
import torch.utils.data

from .errors import (
    ConfigError,
    EmptyDatasetError,
    IndexTypeError,
    SampleIndexError,
    format_message,
)

__all__ = [
    "EpochIndex",
    "IdentityEpochWrapper",
    "MultiEpochResampler",
    "permute",
]

logger = logging.getLogger(__name__)

_MASK64 = (1 << 64) - 1
_ROUNDS = 4


class EpochIndex(NamedTuple):
    """Sample ``idx`` of a map-style dataset, read in epoch ``epoch`` (which may vary its augmentation)."""

    epoch: int
    idx: int


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


@functools.lru_cache(maxsize=256)  # a resampler asks for the same epoch's keys again and again
def _round_keys(seed: int) -> tuple[int, ...]:
    keys, state = [], seed & _MASK64
    for _ in range(_ROUNDS):
        state = _splitmix64(state)
        keys.append(state)
    return tuple(keys)


def _scramble(x: Any, mask: int, shift: int, keys: tuple[int, ...]) -> Any:
    """A bijection on ``[0, mask]`` (``mask = 2**b - 1``); ``x``: a Python int or a uint64 array
    (whose products wrap modulo 2**64, a multiple of 2**b, so the masked result is the same)."""
    for key in keys:
        x = x ^ (key & mask)
        x = (x * ((key >> 32) | 1)) & mask  # odd: invertible modulo 2**b
        x = x ^ (x >> shift)  # the product only carries low bits up; this brings high bits down
    return x


def permute(index: Any, length: int, seed: int) -> Any:
    """Where ``index`` goes in a pseudo-random permutation of ``range(length)`` chosen by ``seed``.

    O(1) memory and a few microseconds per int; ``index`` may also be an integer numpy array (all of
    it permuted at once). The same ``(length, seed)`` always gives the same permutation; a length
    of 1 gives the identity. Raises :class:`SampleIndexError` for an index outside the range.
    """
    if not isinstance(length, (int, np.integer)) or isinstance(length, bool) or length < 1:
        raise ConfigError(format_message("invalid permutation length", expected="an integer >= 1", found=repr(length)))
    length = int(length)
    if isinstance(index, np.ndarray):
        return _permute_array(index, length, seed)
    index = int(index)
    if not 0 <= index < length:
        raise SampleIndexError(format_message("index outside the permuted range", expected=f"0 <= index < {length}", found=str(index)))
    if length == 1:
        return 0
    bits = (length - 1).bit_length()
    mask, shift, keys = (1 << bits) - 1, max(1, bits // 2), _round_keys(int(seed))
    x = _scramble(index, mask, shift, keys)
    while x >= length:  # cycle walk: fewer than 2 steps on average (2**b < 2 * length)
        x = _scramble(x, mask, shift, keys)
    return x


def _permute_array(index: np.ndarray, length: int, seed: int) -> np.ndarray:
    if index.size and (index.min() < 0 or index.max() >= length):
        raise SampleIndexError(format_message("index outside the permuted range", expected=f"0 <= index < {length}", found=f"{index.min()}..{index.max()}"))
    if length == 1:
        return np.zeros(index.shape, dtype=np.int64)
    bits = (length - 1).bit_length()
    mask, shift, keys = (1 << bits) - 1, max(1, bits // 2), _round_keys(int(seed))
    x = _scramble(index.astype(np.uint64), mask, shift, keys)
    outside = x >= length
    while outside.any():
        x[outside] = _scramble(x[outside], mask, shift, keys)
        outside = x >= length
    return x.astype(np.int64)


def _check_count(value: Any, name: str) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ConfigError(format_message(f"invalid {name}", where="MultiEpochResampler", expected="an integer >= 1 or None", found=repr(value)))
    return int(value)


def check_flat_index(index: Any, length: int, where: str) -> int:
    """``index`` as an int in ``[0, length)``, else :class:`IndexTypeError` / :class:`SampleIndexError`."""
    if not isinstance(index, (int, np.integer)) or isinstance(index, bool):
        raise IndexTypeError(format_message("invalid index", where=where, expected="an int", found=f"{type(index).__name__} {index!r}"[:120]))
    if not 0 <= index < length:
        raise SampleIndexError(
            format_message("index out of range", where=where, expected=f"0 <= index < {length} (the length)", found=str(index), fix="index below len(dataset)")
        )
    return int(index)


class MultiEpochResampler(torch.utils.data.Dataset):
    """``num_samples`` positions over a dataset looked up by :class:`EpochIndex`, each epoch a
    full pass in its own order (BioNeMo's ``MultiEpochDatasetResampler``, not its numbers).

    Give at most one of ``num_epochs`` and ``num_samples``; neither means one epoch.
    ``num_samples`` takes ``ceil(num_samples / len(dataset))`` epochs and cuts the last one
    short. Position ``i`` reads ``dataset[EpochIndex(i // n, j)]`` with ``j`` = ``i % n``, or
    with ``shuffle``, ``permute(i % n, n, epoch_seeds[i // n])``; the per-epoch seeds are drawn
    once from ``numpy.random.default_rng(seed)``. No order is stored (memory O(epochs)). A
    dataset of length 1 works (its one sample, every epoch).
    """

    def __init__(self, dataset: Any, num_epochs: int | None = None, num_samples: int | None = None, shuffle: bool = True, seed: int = 42) -> None:
        if num_epochs is not None and num_samples is not None:
            raise ConfigError(
                format_message(
                    "MultiEpochResampler takes num_epochs or num_samples, not both",
                    found=f"num_epochs={num_epochs!r}, num_samples={num_samples!r}",
                    fix="pass one of them (neither: one epoch)",
                )
            )
        length = len(dataset)
        if length == 0:
            raise EmptyDatasetError(format_message("MultiEpochResampler over an empty dataset", where=type(dataset).__name__, expected="a dataset of length >= 1"))
        if num_samples is not None:
            num_samples = _check_count(num_samples, "num_samples")
            num_epochs = math.ceil(num_samples / length)
        else:
            num_epochs = 1 if num_epochs is None else _check_count(num_epochs, "num_epochs")
            num_samples = length * num_epochs
        self.dataset = dataset
        self.num_epochs = num_epochs
        self.num_samples = num_samples
        self.shuffle = bool(shuffle)
        self.seed = seed
        self._length = length
        # BioNeMo's draw: one seed per epoch, below 2**31 - 1.
        self.epoch_seeds = np.random.default_rng(seed).integers(0, 2**31 - 1, size=num_epochs)

    def __len__(self) -> int:
        return self.num_samples

    def index(self, i: int) -> EpochIndex:
        """The :class:`EpochIndex` that position ``i`` reads."""
        i = check_flat_index(i, self.num_samples, f"MultiEpochResampler of length {self.num_samples}")
        epoch, j = divmod(i, self._length)
        if self.shuffle:
            j = permute(j, self._length, int(self.epoch_seeds[epoch]))
        return EpochIndex(epoch, j)

    def __getitem__(self, i: int) -> Any:
        return self.dataset[self.index(i)]


class IdentityEpochWrapper(torch.utils.data.Dataset):
    """Adapts a dataset indexed by ``int`` to :class:`EpochIndex` lookups: ``dataset[index.idx]``,
    the same sample in every epoch (BioNeMo's ``IdentityMultiEpochDatasetWrapper``)."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: EpochIndex | int) -> Any:
        idx = index.idx if isinstance(index, EpochIndex) else index
        return self.dataset[check_flat_index(idx, len(self.dataset), f"{type(self.dataset).__name__} of length {len(self.dataset)}")]
