"""The first stage of a worker: read this worker's slices of one dataset.

Training: at the start of each epoch the worker's slices are put in a random order (a pure
function of seed and epoch), up to ``parallel_slices`` are open at once, and each step draws one
open slice with probability proportional to its total length (as Energon does), yields its next
sample and replaces it with the next pending slice when it is used up.  Validation: slices in
order, one at a time.  The end of the slices is the end of an epoch (``StopIteration``);
``start_epoch(n)`` begins the next.

State keys: ``epoch``, ``next_slice`` (position in this epoch's slice order of the next slice to
open), ``open`` (``[slice id, samples taken]`` of each open slice, in draw order), ``draws`` (how
many random draws this epoch has used), ``failures`` (consecutive samples that failed to load);
``seed`` only where it differs from the one the loader gives this dataset (a weight edit at resume
moved the dataset to another place in its blend, ``loader/reweight.py``: it reads on in the order
of the place it was saved from).  Nothing else: the rest is recomputed.

On object storage the source tells its loader which slices it reads next (the open ones and the
next ``prefetch_depth`` of this epoch's order), so their bytes are requested while it reads the
current ones; what was requested but not read is dropped on a restore and is no part of the
state.  After an elastic restore (``carry_in``) the running epoch
is the ranges carried over from the saved topology instead of this worker's own slices: they are
in ``carried`` (``[start, end]`` split indices; slice ids ``len(slices) + i``) until it ends.
"""

from __future__ import annotations

import bisect
from itertools import accumulate
from typing import Callable, Sequence

from ..errors import NotSupportedError, format_message
from ..rng import UniformStream
from .guard import DROPPED, SampleGuard
from .load import RESTORE_TAG, SampleLoader
from .node import Elastic, Node, OwnsEpochs, Remainder, State
from .sharding import SliceDraws, Slices
from .state_check import check_count, check_index, check_list, check_stage, invalid


def sequential_order(num_slices: int, epoch: int, seed: int) -> list[int]:
    return list(range(num_slices))


class SliceSource(Node, OwnsEpochs, Elastic):
    """Yields the samples of ``slices`` (``[start, end)`` split indices) of one dataset."""

    tag = "Source"

    def __init__(
        self,
        loader: SampleLoader,
        slices: Sequence[tuple[int, int]],
        *,
        seed: int,
        parallel_slices: int = 1,
        slice_order: Callable[[int, int, int], list[int]] = sequential_order,
        guard: SampleGuard | None = None,
    ) -> None:
        self.loader = loader
        self.slices = slices if isinstance(slices, Slices) else list(map(tuple, slices))
        self.seed = self._own_seed = seed
        self.parallel_slices = max(1, parallel_slices)
        self.slice_order = slice_order  # (num_slices, epoch, seed) -> order of slice ids
        # Read and decode failures go through the bad-sample policy: skipped, logged, counted.
        self.guard = guard if guard is not None else SampleGuard(stage="load")
        self._stream: UniformStream | None = None
        self._stream_epoch: int | None = None
        # The running epoch's ranges after carry_in (maybe none: this worker's share of the rest
        # was empty), None otherwise.
        self._carried: list[tuple[int, int]] | None = None
        # Whether the open slices (restored or new) still have to be handed to the loader's
        # prefetch; done at the first read, in the process that reads (a worker, not its parent).
        self._plan_open = True
        self.reset()

    # --- state -------------------------------------------------------------------------------
    def start_epoch(self, epoch: int) -> None:
        self._carried = None
        self._begin(epoch)

    def carry_in(self, remainder: Remainder) -> None:
        """The running epoch is the remainder's ranges (carried from another topology), read like
        slices; the next epoch is this worker's own again."""
        (epoch,), (ranges,) = remainder.epochs, remainder.ranges  # a source reads one dataset
        self._carried = [(int(start), int(end)) for start, end in ranges]
        self._begin(epoch)

    def undelivered(self) -> Remainder:
        """The unread part of the open slices and the slices not opened yet, this epoch."""
        if isinstance(self._order, SliceDraws):
            raise NotSupportedError(
                format_message(
                    "slices drawn with replacement (shuffle_over_epochs_multiplier=-1) have no end of epoch to carry to another topology",
                    fix="restore on the topology the state was saved with",
                )
            )
        opened = [(self._slice(s)[0] + taken, self._slice(s)[1]) for s, taken in self._open]
        pending = [self._slice(int(s)) for s in self._order[self._next_slice :]]
        return Remainder.of_one(self._epoch, [*opened, *pending])

    def running_epoch_carried(self, base: int) -> State:
        """This source's state with the rest of its running epoch as carried ranges, in the
        order it reads them (its open slices, then the pending ones, with the same draws), for a
        source of the same dataset grown by appended shards that has ``base`` slices of its own:
        it finishes this epoch exactly as this one would, then reads its own slices."""
        if isinstance(self._order, SliceDraws):
            raise NotSupportedError(
                format_message(
                    "slices drawn with replacement (shuffle_over_epochs_multiplier=-1) have no end of epoch: a dataset that grew cannot finish its running epoch first",
                    fix="restore into the data the state was saved with",
                )
            )
        ranges = [self._slice(s) for s, _ in self._open] + [self._slice(int(s)) for s in self._order[self._next_slice :]]
        return {
            **self.get_state(),
            "next_slice": len(self._open),
            "open": [[base + i, taken] for i, (_, taken) in enumerate(self._open)],
            "carried": [list(r) for r in ranges],
        }

    def _slice(self, slice_id: int) -> tuple[int, int]:
        n = len(self.slices)
        return self.slices[slice_id] if slice_id < n else self._carried[slice_id - n]  # type: ignore[index]

    def _epoch_order(self, epoch: int):
        if self._carried is not None:
            return list(range(len(self.slices), len(self.slices) + len(self._carried)))
        return self.slice_order(len(self.slices), epoch, self.seed)

    def _begin(self, epoch: int) -> None:
        self._forget_prefetched()
        self._epoch = epoch
        self._order = self._epoch_order(epoch)
        self._next_slice = 0
        self._open: list[list[int]] = []
        self._draws = 0
        while len(self._open) < self.parallel_slices and self._next_slice < len(self._order):
            self._open_next()
        self._update_weights()

    def reset(self, state: State | None = None) -> None:
        if state is None:
            self.guard.reset()
            self.seed, self._stream_epoch = self._own_seed, None
            self.start_epoch(0)
            return
        check_stage(state, self.tag, "epoch", "next_slice", "open", "draws", "failures")
        seed = state.get("seed", self._own_seed)
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise invalid(("seed",), "the dataset's seed (an integer)", seed, stage=self.tag)
        if seed != self.seed:
            self.seed, self._stream_epoch = seed, None  # the draws of the other seed
        epoch = check_count(state["epoch"], "epoch", stage=self.tag)
        self._carried = None if "carried" not in state else self._check_carried(state["carried"])
        order = self._epoch_order(epoch)
        next_slice = check_count(state["next_slice"], "next_slice", stage=self.tag, high=len(order), high_reason="this worker's slices")
        open_slices = self._check_open(state["open"])
        draws = check_count(state["draws"], "draws", stage=self.tag)
        self.guard.reset(check_count(state["failures"], "failures", stage=self.tag))
        self._forget_prefetched()
        self._epoch, self._order, self._next_slice, self._open, self._draws = epoch, order, next_slice, open_slices, draws
        self._update_weights()

    def _check_carried(self, value: object) -> list[tuple[int, int]]:
        ranges = check_list(value, "carried", stage=self.tag)
        result = []
        for i, entry in enumerate(ranges):
            check_list(entry, "carried", i, stage=self.tag, length=2, of="numbers: [start, end]")
            start = check_count(entry[0], "carried", i, 0, stage=self.tag)
            end = check_count(entry[1], "carried", i, 1, stage=self.tag, high=len(self.loader), high_reason="the samples of the split")
            if end <= start:
                raise invalid(("carried", i), "a range [start, end] with start < end", entry, stage=self.tag)
            result.append((start, end))
        return result

    def _check_open(self, value: object) -> list[list[int]]:
        """The saved ``open`` entries, each ``[slice id, samples taken]`` with the slice id one of
        this worker's slices and taken before the slice's end (a used-up slice is never open).
        (Slice ids may repeat: with ``shuffle_over_epochs_multiplier=-1`` slices are drawn with
        replacement.)"""
        entries = check_list(value, "open", stage=self.tag)
        if len(entries) > self.parallel_slices:
            raise invalid(("open",), f"at most {self.parallel_slices} open slices (parallel_slices)", value, stage=self.tag)
        result: list[list[int]] = []
        for i, entry in enumerate(entries):
            check_list(entry, "open", i, stage=self.tag, length=2, of="numbers: [slice id, samples taken]")
            slice_id = check_index(entry[0], len(self.slices) + len(self._carried or ()), "open", i, 0, stage=self.tag, of="slices on this worker")
            start, end = self._slice(slice_id)
            taken = check_count(entry[1], "open", i, 1, stage=self.tag, high=max(end - start - 1, 0), high_reason=f"slice {slice_id} holds {end - start} samples")
            result.append([slice_id, taken])
        return result

    def get_state(self) -> State:
        state = {
            "stage": self.tag,
            "epoch": self._epoch,
            "next_slice": self._next_slice,
            "open": [list(entry) for entry in self._open],
            "draws": self._draws,
            "failures": self.guard.failures,
        }
        if self.seed != self._own_seed:
            state["seed"] = self.seed
        if self._carried is not None:  # only after an elastic restore, until that epoch ends
            state["carried"] = [list(r) for r in self._carried]
        return state

    # --- iteration -----------------------------------------------------------------------------
    def _open_next(self) -> None:
        self._open.append([int(self._order[self._next_slice]), 0])
        self._next_slice += 1

    def _update_weights(self) -> None:
        # Energon weighs an open slice by its total length, not by what is left of it.
        self._cumulative = list(accumulate(self._slice(s)[1] - self._slice(s)[0] for s, _ in self._open))

    def _pick(self) -> int:
        if len(self._open) == 1:
            return 0
        if self._stream_epoch != self._epoch:
            self._stream = UniformStream(self.seed, "source", self._epoch)
            self._stream_epoch = self._epoch
        draw = self._stream.at(self._draws) * self._cumulative[-1]
        self._draws += 1
        return bisect.bisect_right(self._cumulative, draw)

    def _forget_prefetched(self) -> None:
        self.loader.discard_prefetched()
        self._plan_open = True

    def _prefetch(self, opened: bool) -> None:
        """Hands the loader the slices read next: the pending ones within ``prefetch_depth``
        (each once, when it comes in reach) and, after a start or restore, the open ones from
        where they stand (a slice already being read is never handed over again: its bytes
        would be requested a second time)."""
        depth = self.loader.prefetch_depth
        if not depth:
            self._plan_open = False
            return
        ranges = []
        if self._plan_open:
            ranges = [(self._slice(s)[0] + taken, self._slice(s)[1]) for s, taken in self._open]
            self._plan_open = False
        if opened or ranges:
            pending = range(self._next_slice, min(self._next_slice + depth, len(self._order)))
            ranges.extend(self._slice(int(self._order[i])) for i in pending)
            self.loader.prefetch(ranges)

    def next(self):
        if self._plan_open:
            self._prefetch(opened=False)
        while self._open:
            position = self._pick()
            entry = self._open[position]
            start, end = self._slice(entry[0])
            index = start + entry[1]
            entry[1] += 1
            if start + entry[1] >= end:
                del self._open[position]
                if self._next_slice < len(self._order):
                    self._open.insert(position, [int(self._order[self._next_slice]), 0])
                    self._next_slice += 1
                    self._prefetch(opened=True)
                self._update_weights()
            sample = self._load(index, end)
            if sample is not None:  # None: excluded by key in split.yaml, or skipped as bad
                return sample
        raise StopIteration

    def _load(self, index: int, slice_end: int):
        about = {"__restore_key__": (RESTORE_TAG, index)}  # the loader adds the key and sources
        sample = self.guard.call(about, self.loader.load, index, slice_end, about)
        if sample is DROPPED:
            return None
        if sample is not None:
            self.guard.passed()
        return sample

    def draws_with_replacement(self) -> bool:
        return isinstance(self._order, SliceDraws)

    def restore_key_problem(self, key: tuple) -> str | None:
        if len(key) != 2 or key[0] != RESTORE_TAG or not isinstance(key[1], int) or isinstance(key[1], bool) or not 0 <= key[1] < len(self.loader):
            return f"[{RESTORE_TAG!r}, sample index from 0 to {len(self.loader) - 1}]"
        return None

    def restore(self, restore_key: tuple):
        if len(restore_key) != 2 or restore_key[0] != RESTORE_TAG:
            raise ValueError(f"not a {RESTORE_TAG} restore key: {restore_key!r}")
        return self.loader.load(int(restore_key[1]), check_key=True)
