"""LimitNode: Energon's val ``limit``, at most ``length`` items per pass."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError, format_message
from .node import Node, State
from .state_check import check_count, nested

__all__ = ["LimitNode"]


class LimitNode(Node[Any]):
    """Yields at most ``length`` items per pass, then raises ``StopIteration`` once.

    With ``reset_after_epoch`` (the default, as Energon's val loader uses it) the source is reset at
    the end of each pass, so every pass yields the same first ``length`` items; without it the next
    pass continues the source.  ``length`` is this worker's share, computed by the caller.  A pass
    also ends when the source ends.  A state taken right after the last item of a pass has
    ``offset == length``: restored, the node first ends that pass, like the uninterrupted run.
    Items and restore keys pass through unchanged, so ``restore`` is the source's.

    State keys:
        ``stage``: ``"Limit"``.
        ``offset``: items yielded in the current pass (0..length).
        ``source``: the source's state.
    """

    tag = "Limit"

    def __init__(self, source: Node[Any], length: int, reset_after_epoch: bool = True) -> None:
        if not isinstance(length, int) or isinstance(length, bool) or length < 0:
            raise ConfigError(format_message("invalid limit", expected="an integer >= 0", found=repr(length)))
        self.source = source
        self.length = length
        self.reset_after_epoch = reset_after_epoch
        self._offset = 0

    def next(self) -> Any:
        if self._offset < self.length:
            try:
                item = self.source.next()
            except StopIteration:
                pass
            else:
                self._offset += 1
                return item
        self._offset = 0
        if self.reset_after_epoch:
            self.source.reset(None)
        raise StopIteration

    def get_state(self) -> State:
        return {"stage": self.tag, "offset": self._offset, "source": self.source.get_state()}

    def reset(self, state: State | None = None) -> None:
        if state is None:
            self.source.reset(None)
            self._offset = 0
            return
        self.check_state(state, "offset", "source")
        offset = check_count(state["offset"], "offset", stage=self.tag, high=self.length, high_reason="the limit of items per pass on this worker")
        with nested("source"):
            self.source.reset(state["source"])
        self._offset = offset

    def restore(self, restore_key: tuple) -> Any:
        return self.source.restore(restore_key)
