"""RepeatNode: runs its source for several epochs (or forever): ``start_epoch`` on sources that
start epochs in place (see ``node.starts_epochs``), a reset on others."""

from __future__ import annotations

import math
from typing import Any

from ..errors import ConfigError, NotSupportedError, format_message
from .node import Elastic, Node, OwnsEpochs, PassThroughNode, Remainder, State, samples_between, starts_epochs
from .state_check import check_bool, check_count, check_stage, invalid, nested

__all__ = ["RepeatNode"]


class RepeatNode(PassThroughNode[Any], OwnsEpochs, Elastic):
    """Repeats ``source`` for ``repeats`` epochs, or forever when ``repeats`` is ``None``.

    At the end of each epoch it calls ``source.start_epoch(epoch + 1)``; the source's epoch number
    only grows, so every epoch gets its own slice order.  A source that cannot start epochs is
    reset instead and repeats the same order.  A fractional ``repeats`` (``2.5``) ends
    with a partial epoch of ``floor(worker_samples * 0.5)`` items, as Energon's ``RepeatDataset``
    (``worker_samples``: the items one epoch of the source holds on this worker).  After the last
    epoch it raises ``StopIteration`` until ``start_epoch`` (the next pass of an epochized blend)
    or ``reset``.  An epoch that yields nothing ends the stream too (an empty source cannot be
    repeated forever).  Items and restore keys pass through unchanged, so ``restore`` is the
    source's.

    Elastic resume: an endless repeat passes the running epoch's remainder on (``undelivered`` /
    ``carry_in``).  Under a ``blend_epochized`` blend a repeat of ``repeats`` epochs gives the rest
    of its pass instead (:meth:`pass_remainder`), and a new worker reads what it carries in as its
    whole pass (:meth:`carry_in_pass`) before starting its own passes.

    State keys:
        ``stage``: ``"Repeat"``.
        ``epoch``: the source's epoch.
        ``repetition``: epochs finished in this pass (``ceil(repeats)`` once the pass is over).
        ``taken``: items yielded in the current epoch.
        ``source``: the source's state.
        ``carried`` (only while a pass carried over by an elastic restore runs): ``true``.
    """

    tag = "Repeat"

    def __init__(self, source: Node[Any], repeats: float | None = None, *, worker_samples: int | None = None) -> None:
        self.check_repeats(repeats)
        if repeats is not None and repeats != int(repeats) and worker_samples is None:
            raise ConfigError(format_message("a fractional repeats needs worker_samples", found=repr(repeats)))
        super().__init__(source)
        # A source that cannot start a new epoch (a batched pipeline, a user's wrapper) starts
        # over instead: the same order again, as Energon's RepeatDataset restarts its dataset.
        self.epochal = starts_epochs(source)
        self.repeats = repeats
        self.full_epochs = None if repeats is None else math.floor(repeats)
        # Items of the final, partial epoch (0: there is none).
        self.partial_items = 0 if repeats is None or worker_samples is None else math.floor(worker_samples * (repeats - math.floor(repeats)))
        self.passes = 0 if repeats is None else self.full_epochs + (1 if self.partial_items else 0)
        self._epoch = self._repetition = self._taken = 0
        self._carried_pass = False  # this pass is what an elastic restore carried in

    @staticmethod
    def check_repeats(repeats: Any) -> None:
        valid = repeats is None or (isinstance(repeats, (int, float)) and not isinstance(repeats, bool) and math.isfinite(repeats) and repeats >= 0)
        if not valid:
            raise ConfigError(format_message("invalid repeats", expected="None (forever) or a number >= 0", found=repr(repeats)))

    def _limit(self) -> int | None:
        """Items the current epoch may still yield at most (None: until the source ends)."""
        if self.repeats is None or self._repetition < self.full_epochs:
            return None
        return self.partial_items - self._taken

    def _over(self) -> bool:
        return self.repeats is not None and (self._repetition >= self.passes or self._limit() == 0)

    def next(self) -> Any:
        if self._carried_pass:
            return self._next_carried()
        if self._over():
            self._repetition = self.passes
            raise StopIteration
        try:
            item = self.source.next()
        except StopIteration:
            self._repetition += 1
            self._taken = 0
            if self.repeats is not None and (self._repetition >= self.passes or self._limit() == 0):
                self._repetition = self.passes
                raise
            self._epoch += 1
            self._next_epoch()
            item = self.source.next()  # StopIteration here: the new epoch is empty, the stream ends
        self._taken += 1
        return item

    def _next_carried(self) -> Any:
        try:
            item = self.source.next()
        except StopIteration:
            self._carried_pass = False
            self._repetition = self.passes  # the carried items were the whole pass
            raise
        self._taken += 1
        return item

    def start_epoch(self, epoch: int) -> None:
        """Starts the next pass (all ``repeats`` epochs again), on the source's next epoch."""
        self._epoch += 1
        self._repetition = self._taken = 0
        self._carried_pass = False
        self._next_epoch()

    def _next_epoch(self) -> None:
        if self.epochal:
            self.source.start_epoch(self._epoch)
        else:
            self.source.reset(None)

    def undelivered(self) -> Remainder:
        self._check_endless()
        return self.source.undelivered()

    def carry_in(self, remainder: Remainder) -> None:
        """The carried remainder is the rest of epoch ``remainder.epoch``; then the next epochs."""
        self._check_endless()
        self.source.carry_in(remainder)
        self._epoch, self._repetition, self._taken = remainder.epochs[0], 0, 0

    def pass_remainder(self) -> Remainder:
        """What this pass of ``repeats`` epochs has still to yield, per repetition: the unread
        part of the running epoch, then the whole of each later one; the final, partial epoch's
        part is the first items of that epoch's slice order (a pass carried in is one layer).
        Its ``epochs`` is the source's: the blend above knows the pass."""
        self._check_counted()
        current = self.source.undelivered()
        layers: list[list[tuple[int, int]]] = [[] for _ in range(max(self.passes, 1))]
        if self._carried_pass:
            layers[0] = list(current.ranges[0])
        elif not self._over():
            limit = self._limit()
            rest = current.ranges[0]
            layers[self._repetition] = list(rest) if limit is None else samples_between(rest, 0, limit)
            for repetition in range(self._repetition + 1, self.passes):
                whole = self._epoch_ranges(self._epoch + repetition - self._repetition)
                layers[repetition] = whole if repetition < self.full_epochs else samples_between(whole, 0, self.partial_items)
        flat = [piece for layer in layers for piece in layer]
        return Remainder(current.epochs, (flat,), current.waiting, layers=(layers,))

    def _epoch_ranges(self, epoch: int) -> list[tuple[int, int]]:
        """The ranges of the source's epoch ``epoch`` in its slice order (the source is left as it was)."""
        saved = self.source.get_state()
        self.source.start_epoch(epoch)
        ranges = self.source.undelivered().ranges[0]
        self.source.reset(saved)
        return ranges

    def carry_in_pass(self, remainder: Remainder) -> None:
        """After ``reset(None)``: pass ``remainder.epochs[0]`` is ``remainder``'s ranges, each read
        once; then this worker's own passes follow, numbered as in an uninterrupted run."""
        self._check_counted()
        # The epoch before the next pass's first: pass p starts at epoch p * max(passes, 1).
        epoch = (remainder.epochs[0] + 1) * max(self.passes, 1) - 1
        self.source.carry_in(Remainder.of_one(epoch, remainder.ranges[0]))
        self._epoch, self._repetition, self._taken = epoch, 0, 0
        self._carried_pass = True

    def _check_endless(self) -> None:
        if self.repeats is not None or not self.epochal:
            raise NotSupportedError(
                format_message(
                    "a repeat with a fixed number of epochs outside a blend_epochized blend (RepeatDataset), or over stages that cannot start epochs, cannot be moved to another topology yet",
                    found=f"repeats={self.repeats}",
                    fix="restore on the topology the state was saved with",
                )
            )

    def _check_counted(self) -> None:
        if self.repeats is None or not self.epochal:
            raise NotSupportedError(
                format_message(
                    "only a repeat with a fixed number of epochs over a dataset source can give the rest of its pass to another topology",
                    found=f"repeats={self.repeats}, over {self.source.tag}",
                    fix="restore on the topology the state was saved with",
                )
            )

    def get_state(self) -> State:
        state = {"stage": self.tag, "epoch": self._epoch, "repetition": self._repetition, "taken": self._taken, "source": self.source.get_state()}
        if self._carried_pass:
            state["carried"] = True
        return state

    def reset(self, state: State | None = None) -> None:
        if state is None:
            self.source.reset(None)
            self._epoch = self._repetition = self._taken = 0
            self._carried_pass = False
            return
        check_stage(state, self.tag, "epoch", "repetition", "taken", "source")
        carried = check_bool(state.get("carried", False), "carried", stage=self.tag)
        if carried and self.repeats is None:
            raise invalid(("carried",), "no carried pass (an endless repeat carries its epoch in its source)", state["carried"], stage=self.tag)
        epoch = check_count(state["epoch"], "epoch", stage=self.tag)
        if self.repeats is None:
            repetition = check_count(state["repetition"], "repetition", stage=self.tag)
        else:
            repetition = check_count(state["repetition"], "repetition", stage=self.tag, high=self.passes, high_reason=f"epochs of one pass with repeats={self.repeats}")
        in_partial = self.repeats is not None and self.full_epochs <= repetition < self.passes
        if in_partial and not carried:  # the final, partial epoch yields at most partial_items
            taken = check_count(state["taken"], "taken", stage=self.tag, high=self.partial_items, high_reason="items of the final, partial epoch")
        else:
            taken = check_count(state["taken"], "taken", stage=self.tag)
        with nested("source"):
            self.source.reset(state["source"])
        self._epoch, self._repetition, self._taken, self._carried_pass = epoch, repetition, taken, carried
