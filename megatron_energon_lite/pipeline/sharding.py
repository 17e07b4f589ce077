"""Which samples each worker reads, and in which order its slices come: pure functions only.

Everything here is a function of (dataset sizes, rank, world size, workers, seed, epoch): no I/O,
no global state, no torch.  The split reproduces Megatron Energon 7.x
(``flavors/webdataset/sharder.py``) to the sample, so a dataset sharded here gives every worker the
same sample ranges and the same slice boundaries as Energon does.

Vocabulary
----------
* **sample index**: the position of a sample in the split's shards concatenated in split order,
  ``0 .. total_samples - 1`` (Energon's ``("Webdataset", index)`` restore key).
* **shard_starts**: the cumulative sample index where each shard starts, plus the total at the
  end: shards of 2, 3 and 5 samples give ``[0, 2, 5, 10]``.  Empty shards are allowed (repeated
  values).
* **global worker id**: ``rank * max(1, num_workers) + local_worker_id``.  With ``num_workers=0``
  the main process is the one worker of its rank.
* **slice**: a half-open range ``(start, end)`` of sample indices inside one shard, read
  sequentially.  A worker's slices are listed in sample order.

Sharding depends on the topology only through the number of global workers ``W``, so any
``(world_size, num_workers)`` with the same product gives the same global partition (Energon's
"reproducible scaling").
"""

from __future__ import annotations

import operator
import sys
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from itertools import islice

from ..errors import ConfigError, format_message
from ..format.metadataset import (
    WITH_REPLACEMENT,
    check_shuffle_over_epochs,
    combine_shuffle_over_epochs,
)
from ..rng import rng_for, stage_id

__all__ = [
    "SLICE_ORDER_STAGE",
    "STAGE_ID",
    "Slices",
    "WITH_REPLACEMENT",
    "SliceDraws",
    "bit_reversal_permutation",
    "check_shuffle_over_epochs",
    "combine_shuffle_over_epochs",
    "epoch_slice_order",
    "rotation_offset_for",
    "slice_ranges",
    "worker_sample_range",
    "worker_sample_ranges",
    "worker_slices",
]

#: The stage name that keys the slice-order randomness (see :func:`epoch_slice_order`).
SLICE_ORDER_STAGE = "pipeline.sharding.slice_order"
#: Its stable 32-bit id: the middle word of the ``default_rng((seed, STAGE_ID, epoch))`` key.
STAGE_ID = stage_id(SLICE_ORDER_STAGE)


# --------------------------------------------------------------------------------------------
# Validation helpers (messages built with errors.format_message: what, expected, found, fix)
# --------------------------------------------------------------------------------------------


def _is_int(value: object) -> bool:
    # numpy integers are accepted; bools are not counts.
    return not isinstance(value, bool) and hasattr(value, "__index__")


def _check_int(name: str, value: object, *, minimum: int, fix: str) -> int:
    if not _is_int(value) or int(value) < minimum:  # type: ignore[call-overload]
        raise ConfigError(
            format_message(
                f"Invalid {name} for sharding.",
                expected=f"an integer >= {minimum}",
                found=repr(value),
                fix=fix,
            )
        )
    return int(value)  # type: ignore[call-overload]


def _check_max_samples_per_sequence(value: object) -> int | None:
    if value is None:
        return None
    return _check_int(
        "max_samples_per_sequence",
        value,
        minimum=1,
        fix="pass a positive number of samples to read sequentially, or None to read each shard "
        "piece of a worker as one slice",
    )


def _check_topology(rank: object, world_size: object, num_workers: object) -> tuple[int, int, int]:
    world = _check_int(
        "world_size", world_size, minimum=1, fix="pass the number of data-parallel ranks (1 without distributed training)"
    )
    workers = _check_int(
        "num_workers", num_workers, minimum=0, fix="pass the number of loader worker processes per rank (0 for none)"
    )
    if not _is_int(rank) or not 0 <= int(rank) < world:  # type: ignore[call-overload]
        raise ConfigError(
            format_message(
                "Invalid rank for sharding: it is not one of the world's ranks.",
                expected=f"an integer in [0, {world}) for world_size={world}",
                found=repr(rank),
                fix="pass the data-parallel rank of this process, below world_size",
            )
        )
    return int(rank), world, workers  # type: ignore[call-overload]


def _check_rotation_offset(rotation_offset: object) -> int:
    if not _is_int(rotation_offset):
        raise ConfigError(
            format_message(
                "Invalid rotation_offset for sharding.",
                expected="an integer (only its value modulo the number of global workers matters)",
                found=repr(rotation_offset),
                fix="use rotation_offset_for(...) to compute it",
            )
        )
    return int(rotation_offset)  # type: ignore[call-overload]


def _check_shard_starts(shard_starts: Sequence[int], total_samples: int | None = None) -> list[int]:
    starts = list(map(int, shard_starts))
    problem = None
    if not starts or starts[0] != 0:
        problem = "it does not start with 0"
    elif not all(map(operator.le, starts, starts[1:])):
        problem = "it decreases somewhere"
    elif total_samples is not None and starts[-1] != total_samples:
        problem = f"it ends with {starts[-1]}, not total_samples={total_samples}"
    if problem is not None:
        shown = starts if len(starts) <= 12 else [*starts[:6], "...", *starts[-5:]]
        raise ConfigError(
            format_message(
                f"Invalid shard_starts for sharding: {problem}.",
                expected="the cumulative sample count before each shard, plus the total: "
                "[0, n0, n0+n1, ..., total]",
                found=str(shown),
                fix="build it as [0, *itertools.accumulate(shard_sample_counts)]",
            )
        )
    return starts


# --------------------------------------------------------------------------------------------
# 1. Bit reversal
# --------------------------------------------------------------------------------------------


def bit_reversal_permutation(n: int) -> list[int]:
    """Energon's generalized bit-reversal permutation of ``range(n)``.

    For a power of two it is the classic bit reversal (``n=8 -> [0, 4, 2, 6, 1, 5, 3, 7]``); for
    other lengths the same divide-and-interleave recursion is used (``n=6 -> [0, 3, 1, 4, 2, 5]``,
    ``n=5 -> [0, 2, 1, 3, 4]``).  Reading it left to right visits indices spread as evenly as
    possible over the range, which is what spreads the remainder samples over ranks.
    """
    n = _check_int("permutation length", n, minimum=0, fix="pass the number of global workers")

    def interleave(indices: list[int]) -> list[int]:
        # 1. Two or fewer indices are already in order.
        if len(indices) <= 2:
            return indices
        # 2. Split into a front half (the shorter one when odd) and a back half; order each
        #    half recursively.
        mid = len(indices) // 2
        front, back = interleave(indices[:mid]), interleave(indices[mid:])
        # 3. Alternate front, back, front, back, ...; the back half may have one element more,
        #    which then comes last.
        out: list[int] = []
        for i in range(len(back)):
            if i < len(front):
                out.append(front[i])
            out.append(back[i])
        return out

    return interleave(list(range(n)))


# --------------------------------------------------------------------------------------------
# 2. Samples per global worker
# --------------------------------------------------------------------------------------------


def worker_sample_ranges(
    total_samples: int, num_global_workers: int, *, rotation_offset: int = 0
) -> list[tuple[int, int]]:
    """The contiguous sample range ``(start, end)`` of every global worker, by global worker id.

    The ranges are disjoint, in order, and cover ``[0, total_samples)``; their lengths differ by
    at most one.  ``rotation_offset`` shifts which workers get the extra samples (see
    :func:`rotation_offset_for`); it only matters modulo ``num_global_workers``.
    """
    total = _check_int("total_samples", total_samples, minimum=0, fix="pass the number of samples in the split")
    workers = _check_int(
        "num_global_workers",
        num_global_workers,
        minimum=1,
        fix="pass world_size * max(1, num_workers)",
    )
    _check_rotation_offset(rotation_offset)
    # 1. Every worker gets total // W samples; total % W of them get one more.  Exact integer
    #    arithmetic (Energon divides in floating point, which only differs beyond 2**53 samples).
    base, remainder = divmod(total, workers)
    # 2. In "linear" order the workers with one more sample are the `remainder` workers starting
    #    at `rotation_offset`, wrapping around.
    linear_counts = [base + 1 if (g - int(rotation_offset)) % workers < remainder else base for g in range(workers)]
    # 3. The i-th linear count goes to global worker perm[i]: the bit reversal scatters the
    #    "+1" workers over the ranks instead of giving them all to the first ranks.
    counts = [0] * workers
    for linear_index, worker in enumerate(bit_reversal_permutation(workers)):
        counts[worker] = linear_counts[linear_index]
    # 4. Cumulative sums turn the counts into contiguous ranges, global worker 0 first.
    ranges = []
    start = 0
    for count in counts:
        ranges.append((start, start + count))
        start += count
    return ranges


# The bit-reversal permutation perm_n of range(n) is a recursive interleave: for n > 2, with
# mid = n // 2, position 2k holds perm_mid[k] (k < mid), position 2k + 1 holds mid + perm_{n-mid}[k]
# (k < mid), and for odd n the last position n - 1 = 2 * mid holds mid + perm_{n-mid}[mid].  The two
# helpers below follow that recursion down one path only, so a single worker's range is computed in
# O(log n) without building the permutation (O(n), which dominates start-up at large W).


def _bit_reversal_index(n: int, value: int) -> int:
    """The position of ``value`` (``0 <= value < n``) in ``bit_reversal_permutation(n)``."""
    # 1. Descend: at each level the value lies in the front half (values < mid) or the back half;
    #    remember the level's mid and the side.
    path: list[tuple[int, bool]] = []
    while n > 2:
        mid = n // 2
        if value < mid:
            path.append((mid, False))
            n = mid
        else:
            path.append((mid, True))
            value -= mid
            n -= mid
    # 2. Two or fewer values are in order: the position inside the innermost half is the value.
    position = value
    # 3. Climb back up: front position k -> 2k; back position k -> 2k + 1, except the back half's
    #    extra element (k == mid, odd n only), which comes last, at 2 * mid = 2k.
    for mid, back in reversed(path):
        position = 2 * position + 1 if back and position < mid else 2 * position
    return position


def _bit_reversal_prefix_count(n: int, length: int, bound: int) -> int:
    """``#{i < length : bit_reversal_permutation(n)[i] < bound}`` for ``0 <= length <= n``."""
    count = 0
    while True:
        # 1. No value is below bound, or every value is: nothing to split.
        if bound <= 0:
            return count
        if bound >= n:
            return count + length
        # 2. Two or fewer values are in order: positions < length hold values < length.
        if n <= 2:
            return count + min(length, bound)
        # 3. The first `length` positions hold `front` front-half values (the even positions,
        #    at most mid of them) and `length - front` back-half values.
        mid = n // 2
        front = min(mid, (length + 1) // 2)
        if bound <= mid:
            # 3a. No back-half value (all >= mid) is below bound: count in the front half only.
            n, length = mid, front
        else:
            # 3b. Every front-half value (all < mid) is below bound: count them, go into the back.
            count += front
            n, length, bound = n - mid, length - front, bound - mid


def _worker_range(worker: int, total: int, workers: int, rotation: int) -> tuple[int, int]:
    # Validated inputs: 0 <= worker < workers, total >= 0.  Same result as
    # worker_sample_ranges(total, workers, rotation_offset=rotation)[worker].
    base, remainder = divmod(total, workers)
    # 1. The "+1" workers are those whose linear index lies in the cyclic interval
    #    [first, first + remainder) modulo W.
    first = rotation % workers
    # 2. Count the "+1" workers with a global id below `worker`: the linear indices in that
    #    interval whose permutation value is below `worker` (split in two when it wraps around).
    stop = first + remainder
    if stop <= workers:
        extra_below = _bit_reversal_prefix_count(workers, stop, worker) - _bit_reversal_prefix_count(
            workers, first, worker
        )
    else:
        extra_below = (
            worker  # all W linear indices
            - _bit_reversal_prefix_count(workers, first, worker)
            + _bit_reversal_prefix_count(workers, stop - workers, worker)
        )
    # 3. The worker's own count: one more iff its own linear index is in the interval.
    start = worker * base + extra_below
    own = base + 1 if (_bit_reversal_index(workers, worker) - first) % workers < remainder else base
    return start, start + own


def worker_sample_range(
    global_worker_id: int, total_samples: int, num_global_workers: int, *, rotation_offset: int = 0
) -> tuple[int, int]:
    """The sample range ``(start, end)`` of one global worker, without computing the others.

    Exactly ``worker_sample_ranges(total_samples, num_global_workers,
    rotation_offset=rotation_offset)[global_worker_id]``, in O(log num_global_workers) time: a
    rank needs only its own workers' ranges, whatever the world size.
    """
    total = _check_int("total_samples", total_samples, minimum=0, fix="pass the number of samples in the split")
    workers = _check_int(
        "num_global_workers",
        num_global_workers,
        minimum=1,
        fix="pass world_size * max(1, num_workers)",
    )
    rotation = _check_rotation_offset(rotation_offset)
    if not _is_int(global_worker_id) or not 0 <= int(global_worker_id) < workers:  # type: ignore[call-overload]
        raise ConfigError(
            format_message(
                "Invalid global_worker_id for sharding.",
                expected=f"an integer in [0, {workers}) for num_global_workers={workers}",
                found=repr(global_worker_id),
                fix="pass rank * max(1, num_workers) + local_worker_id",
            )
        )
    return _worker_range(int(global_worker_id), total, workers, rotation)  # type: ignore[call-overload]


# --------------------------------------------------------------------------------------------
# 3. A worker's range -> slices
# --------------------------------------------------------------------------------------------


class Slices(Sequence[tuple[int, int]]):
    """Consecutive slices kept as their bounds: slice ``i`` is ``(bounds[i], bounds[i + 1])``.

    A worker's slices tile its sample range (see :func:`worker_slices`), so ``n`` slices are
    ``n + 1`` increasing numbers.  A rank may own 10,000s of slices and makes them on every start:
    one list of ints costs no tuple per slice and gives the garbage collector nothing to walk (the
    tuples cost twice the time of the whole cut, cold); a slice is made when it is asked for.
    Compares equal to any sequence of the same ``(start, end)`` pairs.
    """

    __slots__ = ("bounds",)

    def __init__(self, bounds: Sequence[int] = ()) -> None:
        self.bounds = list(bounds)  # strictly increasing; empty or at least two

    def __len__(self) -> int:
        return max(len(self.bounds) - 1, 0)

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self)
        i = operator.index(index)
        i = i + n if i < 0 else i
        if not 0 <= i < n:
            raise IndexError(f"slice {index} of {n}")
        return (self.bounds[i], self.bounds[i + 1])

    def __iter__(self):
        return zip(self.bounds, islice(self.bounds, 1, None))

    @property
    def samples(self) -> int:
        """Samples in all slices: the range they tile."""
        return self.bounds[-1] - self.bounds[0] if self.bounds else 0

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Slices):
            return self.bounds == other.bounds
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(other) == len(self) and all(map(operator.eq, self, map(tuple, other)))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self):
        return (Slices, (self.bounds,))

    def __repr__(self) -> str:
        shown = list(self) if len(self) <= 6 else [*self[:3], "...", *self[-2:]]
        return f"Slices({shown})"


def _split_piece(start: int, end: int, max_samples_per_sequence: int) -> list[int]:
    """The starts of the slices of the within-shard piece ``[start, end)``, ``start`` first."""
    length = end - start
    # 3a. Short pieces (up to 1.5 * msps samples) stay one slice.
    if not length > max_samples_per_sequence * 1.5:
        return [start]
    # 3b. Longer pieces are cut into round(length / msps) slices of near-equal length.  Python's
    #     round() rounds halves to even (2.5 -> 2), and the starts are computed like Energon's,
    #     as int(i * (length / count)) in floating point: that is sometimes one less than the exact
    #     floor(i * length / count) (length 122, count 14, i 7 gives 60, not 61), and we keep it so
    #     boundaries match Energon's to the sample.  (Equal starts, an empty slice, are dropped.)
    count = max(round(length / max_samples_per_sequence), 1)
    step = length / count
    return list(dict.fromkeys(start + int(i * step) for i in range(count)))


def _slice_ranges(start: int, end: int, starts: list[int], msps: int | None) -> Slices:
    if start >= end:
        return Slices()
    # 1. Cut [start, end) at every shard start strictly inside it: the first shard holding
    #    `start` is the last whose start is <= `start` (bisect_right skips empty shards), and the
    #    cuts stop before the first shard starting at or after `end`.  An empty shard repeats a
    #    cut point (an empty piece): repeated bounds are dropped.
    first = bisect_right(starts, start)
    bounds = [start, *starts[first : bisect_left(starts, end, lo=first)], end]
    if not all(map(operator.lt, bounds, islice(bounds, 1, None))):
        bounds = list(dict.fromkeys(bounds))  # non-decreasing: this keeps one of each, in order
    # 2. Split each within-shard piece by max_samples_per_sequence (see _split_piece).
    if msps is not None:
        bounds = [*(cut for a, b in zip(bounds, bounds[1:]) for cut in _split_piece(a, b, msps)), end]
    return Slices(bounds)


def slice_ranges(
    start: int,
    end: int,
    shard_starts: Sequence[int],
    max_samples_per_sequence: int | None,
) -> Slices:
    """Cuts the sample range ``[start, end)`` into slices that never cross a shard boundary.

    The range is first cut at every shard boundary.  A resulting piece longer than
    ``1.5 * max_samples_per_sequence`` is split into ``round(len / max_samples_per_sequence)``
    near-equal slices; with ``max_samples_per_sequence=None`` each piece is one slice.  Empty
    slices are dropped, so ``start == end`` gives ``[]``.
    """
    starts = _check_shard_starts(shard_starts)
    msps = _check_max_samples_per_sequence(max_samples_per_sequence)
    lo = _check_int("slice start", start, minimum=0, fix="pass a sample index inside the split")
    hi = _check_int("slice end", end, minimum=lo, fix="pass end >= start")
    if hi > starts[-1]:
        raise ConfigError(
            format_message(
                "Invalid slice end for sharding: it lies past the last shard.",
                expected=f"end <= {starts[-1]} (the last value of shard_starts)",
                found=str(hi),
                fix="pass a range inside the split",
            )
        )
    return _slice_ranges(lo, hi, starts, msps)


# --------------------------------------------------------------------------------------------
# 4. All local workers of one rank
# --------------------------------------------------------------------------------------------


def worker_slices(
    *,
    total_samples: int,
    shard_starts: Sequence[int],
    rank: int,
    world_size: int,
    num_workers: int,
    max_samples_per_sequence: int | None,
    rotation_offset: int = 0,
    sample_range: tuple[int, int] | None = None,
) -> list[Slices]:
    """The slices of each local worker of ``rank``: Energon's ``Sharder.shard_workers``.

    Returns ``max(1, num_workers)`` lists (one per local worker id), each with that worker's
    slices in sample order, tiling the worker's one sample range without gaps (each slice ends
    where the next starts).  A worker with no samples gets an empty list.  ``sample_range``
    (a metadataset ``subset``) restricts the split to samples ``[start, end)``, which are then
    divided over the workers as the whole split would be.
    """
    # 1. Check the inputs once: topology, msps, and shard_starts ending at total_samples.
    rank, world_size, num_workers = _check_topology(rank, world_size, num_workers)
    msps = _check_max_samples_per_sequence(max_samples_per_sequence)
    total = _check_int("total_samples", total_samples, minimum=0, fix="pass the number of samples in the split")
    starts = _check_shard_starts(shard_starts, total)
    # 2. The samples are split over all global workers; the split depends on the product only.
    local = max(1, num_workers)
    first, last = (0, total) if sample_range is None else sample_range
    if not (_is_int(first) and _is_int(last) and 0 <= first <= last <= total):
        raise ConfigError(
            format_message(
                "Invalid sample_range for sharding.",
                expected=f"0 <= start <= end <= {total}",
                found=repr(sample_range),
                fix="pass a range inside the split",
            )
        )
    rotation = _check_rotation_offset(rotation_offset)
    first, last = int(first), int(last)
    # 3. This rank's workers are global ids rank*local .. rank*local + local - 1: compute only
    #    their ranges (O(log W) each, see worker_sample_range), shifted to the sample_range, and
    #    cut each one into slices.
    workers = world_size * local
    slices: list[Slices] = []
    for worker in range(rank * local, (rank + 1) * local):
        a, b = _worker_range(worker, last - first, workers, rotation)
        slices.append(_slice_ranges(first + a, first + b, starts, msps))
    return slices


# --------------------------------------------------------------------------------------------
# 5. Rotation for blends and concatenations
# --------------------------------------------------------------------------------------------


def rotation_offset_for(dataset_index: int, dataset_lengths: Sequence[int], num_global_workers: int) -> int:
    """Energon's rotation offset of dataset ``dataset_index`` in a blend or concatenation.

    It is the number of samples in the datasets before it, modulo the number of global workers,
    so the "+1" workers of one dataset continue where the previous dataset's ended and the
    remainders do not all land on the same workers.  ``dataset_lengths`` are the full lengths of
    the datasets' splits (Energon uses ``len(dataset)``, which ignores a ``subset``).
    """
    workers = _check_int(
        "num_global_workers", num_global_workers, minimum=1, fix="pass world_size * max(1, num_workers)"
    )
    lengths = [_check_int("dataset length", n, minimum=0, fix="pass sample counts") for n in dataset_lengths]
    if not _is_int(dataset_index) or not 0 <= int(dataset_index) < len(lengths):
        raise ConfigError(
            format_message(
                "Invalid dataset_index for the rotation offset.",
                expected=f"an integer in [0, {len(lengths)}) (one per dataset length)",
                found=repr(dataset_index),
                fix="pass the position of the dataset in the blend or concatenation",
            )
        )
    # 1. Samples before this dataset, 2. wrapped onto the global workers.
    return sum(lengths[: int(dataset_index)]) % workers


# --------------------------------------------------------------------------------------------
# 6. Slice order per epoch
# --------------------------------------------------------------------------------------------


class SliceDraws(Sequence[int]):
    """Slice ids drawn uniformly with replacement, without end (``shuffle_over_epochs=-1``).

    Item ``i`` is the ``i``-th draw, a pure function of ``(seed, epoch, i)``: draws come in blocks
    of :attr:`BLOCK` from ``rng_for(seed, SLICE_ORDER_STAGE, epoch, block)``, so any position is
    computed without the ones before it and a restored reader needs only its position.  ``len()``
    is ``sys.maxsize`` (there is no last slice).  Iterating over it (``list(draws)``) would never
    end and raises instead: index it.
    """

    BLOCK = 1024

    def __init__(self, num_slices: int, *, seed: int, epoch: int) -> None:
        self.num_slices, self.seed, self.epoch = num_slices, seed, epoch
        self._block_index = -1
        self._block: list[int] = []

    def __len__(self) -> int:
        return sys.maxsize

    def __getitem__(self, position):  # type: ignore[override]
        if not _is_int(position) or int(position) < 0:
            raise IndexError(f"SliceDraws takes a draw number >= 0, not {position!r}")
        block, offset = divmod(int(position), self.BLOCK)
        if block != self._block_index:
            rng = rng_for(self.seed, SLICE_ORDER_STAGE, self.epoch, block)
            self._block = rng.integers(0, self.num_slices, self.BLOCK).tolist()
            self._block_index = block
        return self._block[offset]

    def __iter__(self):
        raise ConfigError(
            format_message(
                "the slice draws of shuffle_over_epochs=-1 never end and cannot be listed",
                expected="indexing: draws[i] for the i-th slice to open",
                fix="keep the sequence epoch_slice_order returns and index it",
            )
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SliceDraws) and (self.num_slices, self.seed, self.epoch) == (other.num_slices, other.seed, other.epoch)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"SliceDraws(num_slices={self.num_slices}, seed={self.seed}, epoch={self.epoch})"


def epoch_slice_order(num_slices: int, *, seed: int, epoch: int, shuffle_over_epochs: int | None = 1) -> Sequence[int]:
    """The order in which a worker opens its slices in (super-)epoch ``epoch``.

    * ``shuffle_over_epochs=k >= 1``: a uniformly random permutation of
      ``list(range(num_slices)) * k``: the slices of ``k`` consecutive epochs are shuffled
      together (each slice appears ``k`` times), and ``epoch`` is the index of that group of ``k``
      epochs (the super-epoch: pass ``plain_epoch // k``).
    * ``None``: no shuffling, ``list(range(num_slices))`` every epoch (Energon reads the slices in
      order and, with one slice open at a time, the samples in dataset order).
    * ``-1``: a :class:`SliceDraws`, slices drawn uniformly with replacement without end, so the
      epoch never ends (Energon's "infinite epochs").  Index it; do not list it.

    The order depends on nothing but the arguments: the generator is
    ``numpy.random.default_rng((seed, STAGE_ID, epoch))`` (``rng.rng_for``), a counter-based key,
    so the order of any epoch can be recomputed from ``(seed, epoch)`` alone, with no saved RNG
    state.  Pass the worker's seed (``rng.worker_seed(global_worker_id, seed_offset)``) so that
    workers differ.

    Energon draws these orders with its worker generator (``torch.randperm`` / ``randbelow``); the
    orders differ from Energon's, but the distribution is the same.
    """
    k = check_shuffle_over_epochs(shuffle_over_epochs)
    n = _check_int("num_slices", num_slices, minimum=0, fix="pass the number of slices of this worker")
    e = _check_int("epoch", epoch, minimum=0, fix="count epochs from 0")
    if not _is_int(seed):
        raise ConfigError(
            format_message(
                "Invalid seed for the slice order.",
                expected="an integer",
                found=repr(seed),
                fix="pass the worker seed, e.g. rng.worker_seed(global_worker_id, seed_offset)",
            )
        )
    # 1. No slices: nothing to order (also for -1: a worker without samples ends at once).
    if n == 0:
        return []
    # 2. No shuffling: the slices in sample order, the same every epoch.
    if k is None:
        return list(range(n))
    # 3. With replacement: an endless sequence of uniform draws, computed on demand.
    if k == WITH_REPLACEMENT:
        return SliceDraws(n, seed=int(seed), epoch=e)
    # 4. A fresh generator keyed by (seed, STAGE_ID, epoch): no state carried between epochs.
    rng = rng_for(int(seed), SLICE_ORDER_STAGE, e)
    # 5. A uniform permutation of the k * n positions of range(n) repeated k times; position p
    #    holds slice p % n, so every slice appears exactly k times in a uniformly random order.
    return (rng.permutation(n * k) % n).tolist()
