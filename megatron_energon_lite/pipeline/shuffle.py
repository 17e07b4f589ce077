"""Shuffle buffer that saves the restore keys of what it holds, never the samples.

The buffer fills to ``size`` from its source, then each step yields a uniformly chosen entry
(draw ``n`` of an epoch-free counter) and refills; when the source ends, the rest drains in random
order.  After a restore the buffered entries are only keys: each is re-read by random access when
it is drawn, so restoring costs nothing up front (Energon re-reads the whole buffer first, en#18).

State keys: ``buffer`` (restore keys, in buffer order), ``draws`` (draw counter), ``source``.
"""

from __future__ import annotations

import json
from typing import Any

from ..rng import UniformStream
from .load import waiting_samples
from .node import (
    ForwardsElastic,
    Node,
    PassThroughNode,
    Remainder,
    State,
    as_key,
    draws_with_replacement,
    get_restore_key,
    key_problem_of,
    key_to_json,
)
from .state_check import check_count, check_list, check_stage, invalid, nested


def epochs_begun(state: Any) -> int:
    """How many epochs the stages of a (checked) state have begun: one more than the largest
    ``epoch`` counter below it (a blend's sources each count their own)."""
    largest, stack = 0, [state]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            epoch = node.get("epoch")
            if isinstance(epoch, int) and not isinstance(epoch, bool):
                largest = max(largest, epoch)
            stack.append(node.get("source"))
            sources = node.get("sources")
            stack.extend(sources if isinstance(sources, list) else ())
    return largest + 1


class _Pending:
    """A buffered entry known only by its restore key (after a restore)."""

    __slots__ = ("key",)

    def __init__(self, key: tuple) -> None:
        self.key = key


class ShuffleBufferNode(PassThroughNode, ForwardsElastic):
    tag = "Shuffle"

    def __init__(self, source: Node, size: int, *, seed: int) -> None:
        super().__init__(source)
        self.size = size
        self.seed = seed
        self._stream = UniformStream(seed, "shuffle")
        self.reset()

    def reset(self, state: State | None = None) -> None:
        if state is None:
            self.source.reset(None)
            self._items: list[Any] = []
            self._keys: list[list] = []
            self._draws = 0
        else:
            check_stage(state, self.tag, "buffer", "draws", "source")
            buffer = check_list(state["buffer"], "buffer", stage=self.tag)
            if len(buffer) > self.size:
                raise invalid(("buffer",), f"at most {self.size} restore keys (the shuffle buffer size)", buffer, stage=self.tag)
            keys = [list(check_list(k, "buffer", i, stage=self.tag, of="restore key parts")) for i, k in enumerate(buffer)]
            draws = check_count(state["draws"], "draws", stage=self.tag)
            with nested("source"):
                self.source.reset(state["source"])
            self._check_buffer(keys, None if draws_with_replacement(self.source) else epochs_begun(state["source"]))
            self._keys = keys
            self._items = [_Pending(as_key(k)) for k in self._keys]
            self._draws = draws
        self._source_done = False

    def _check_buffer(self, keys: list[list], epochs: int | None) -> None:
        """Every entry must be a key the source can restore, and no sample may wait more often
        than the epochs begun so far allow (one copy per epoch; ``epochs`` None: no bound, slices
        are drawn with replacement): a repeated entry would deliver its sample twice."""
        seen: dict[str, int] = {}
        for i, key in enumerate(keys):
            problem = key_problem_of(self.source, as_key(key))
            if problem is not None:
                raise invalid(("buffer", i), f"a restore key of the stage below: {problem}", key, stage=self.tag)
            text = json.dumps(key)
            seen[text] = seen.get(text, 0) + 1
            if epochs is not None and seen[text] > epochs:
                raise invalid(
                    ("buffer", i),
                    f"each sample at most once per epoch begun ({epochs}) in the buffer; this one is held {seen[text]} times",
                    key,
                    stage=self.tag,
                )

    def get_state(self) -> State:
        return {"stage": self.tag, "buffer": list(self._keys), "draws": self._draws, "source": self.source.get_state()}

    def undelivered(self) -> Remainder:
        """The source's remainder and the samples waiting in the buffer (redistributed, not lost)."""
        return self.source.undelivered().with_waiting(waiting_samples(self._keys, self.tag))

    def _fill(self) -> None:
        while not self._source_done and len(self._items) < self.size:
            try:
                item = next(self.source)
            except StopIteration:
                self._source_done = True
                return
            self._items.append(item)
            self._keys.append(key_to_json(get_restore_key(item)))  # states hold JSON forms

    def next(self):
        self._fill()
        if not self._items:
            raise StopIteration
        position = int(self._stream.at(self._draws) * len(self._items))
        self._draws += 1
        # Swap-remove keeps both lists aligned in O(1).
        item, self._items[position] = self._items[position], self._items[-1]
        self._keys[position] = self._keys[-1]
        self._items.pop()
        self._keys.pop()
        if isinstance(item, _Pending):
            item = self.source.restore(item.key)
        return item

