"""EpochizeNode: Energon's virtual epochs, a fixed number of items per pass over a longer stream."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError, format_message
from .node import Node, State
from .state_check import check_count, nested

__all__ = ["EpochizeNode"]


class EpochizeNode(Node[Any]):
    """Yields ``length`` items per pass, then raises ``StopIteration`` once; the next call starts the
    next pass where the source stopped (the source is not reset between passes).

    ``length`` is this worker's share, computed by the caller.  If the source ends in the middle of a
    pass, the pass ends early and the source is reset, so the next pass starts it over.  A state taken
    right after the last item of a pass has ``offset == length``: restored, the node first ends that
    pass (one ``StopIteration``), exactly like the uninterrupted run.  Items and restore keys pass
    through unchanged, so ``restore`` is the source's.

    State keys:
        ``stage``: ``"Epochize"``.
        ``offset``: items yielded in the current pass (0..length).
        ``source``: the source's state.
    """

    tag = "Epochize"

    def __init__(self, source: Node[Any], length: int) -> None:
        if not isinstance(length, int) or isinstance(length, bool) or length < 0:
            raise ConfigError(format_message("invalid virtual epoch length", expected="an integer >= 0", found=repr(length)))
        self.source = source
        self.length = length
        self._offset = 0

    def next(self) -> Any:
        if self._offset >= self.length:
            self._offset = 0
            raise StopIteration
        try:
            item = self.source.next()
        except StopIteration:
            self._offset = 0
            self.source.reset(None)
            raise
        self._offset += 1
        return item

    def get_state(self) -> State:
        return {"stage": self.tag, "offset": self._offset, "source": self.source.get_state()}

    def reset(self, state: State | None = None) -> None:
        if state is None:
            self.source.reset(None)
            self._offset = 0
            return
        self.check_state(state, "offset", "source")
        offset = check_count(state["offset"], "offset", stage=self.tag, high=self.length, high_reason="items per virtual epoch on this worker")
        with nested("source"):
            self.source.reset(state["source"])
        self._offset = offset

    def restore(self, restore_key: tuple) -> Any:
        return self.source.restore(restore_key)
