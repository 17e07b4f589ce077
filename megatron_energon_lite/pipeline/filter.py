"""FilterNode: keeps the items for which ``predicate(item, index)`` is true."""

from __future__ import annotations

from typing import Any, Callable

from .guard import DROPPED, SampleGuard
from .node import ForwardsElastic, ForwardsEpochs, Node, PassThroughNode, State
from .state_check import check_count, check_stage, nested

__all__ = ["FilterNode"]


class FilterNode(PassThroughNode[Any], ForwardsEpochs, ForwardsElastic):
    """Passes on the items of ``source`` for which ``predicate(item, index)`` is true.

    ``index`` counts this stage's inputs (kept and dropped).  A predicate that raises goes through
    ``guard``: the item is dropped (``SkipSample``) or handled as a failure.  Items and their restore
    keys pass through unchanged, so ``restore`` is the source's.  ``start_epoch`` is forwarded to the
    source (the index keeps counting across epochs), so a ``RepeatNode`` may sit above a filter.

    State keys:
        ``stage``: ``"Filter"``.
        ``index``: inputs pulled from the source so far.
        ``failures``: the guard's consecutive-failure count.
        ``source``: the source's state.
    """

    tag = "Filter"

    def __init__(self, source: Node[Any], predicate: Callable[[Any, int], bool], *, guard: SampleGuard | None = None) -> None:
        super().__init__(source)
        self.predicate = predicate
        self.guard = guard if guard is not None else SampleGuard(stage=f"Filter({getattr(predicate, '__qualname__', predicate)})")
        self._index = 0

    def next(self) -> Any:
        while True:
            item = self.source.next()
            index = self._index
            self._index += 1
            keep = self.guard.call(item, self.predicate, item, index)
            if keep is DROPPED:
                continue
            self.guard.passed()
            if keep:
                return item

    def get_state(self) -> State:
        return {"stage": self.tag, "index": self._index, "failures": self.guard.failures, "source": self.source.get_state()}

    def reset(self, state: State | None = None) -> None:
        if state is None:
            self.source.reset(None)
            self._index = 0
            self.guard.reset()
            return
        check_stage(state, self.tag, "index", "failures", "source")
        index = check_count(state["index"], "index", stage=self.tag)
        failures = check_count(state["failures"], "failures", stage=self.tag)
        with nested("source"):
            self.source.reset(state["source"])
        self._index = index
        self.guard.reset(failures)
