"""RepeatNode: runs its source for several epochs (or forever) through the ``Epochal`` protocol."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from ..errors import ConfigError, format_message
from .node import Node, State

__all__ = ["Epochal", "RepeatNode"]


@runtime_checkable
class Epochal(Protocol):
    """A source that can start another epoch (for example a new slice order) in place.

    ``start_epoch(epoch)`` is called after the source raised ``StopIteration`` at the end of epoch
    ``epoch - 1``; afterwards ``next()`` yields epoch ``epoch`` and ``get_state()`` describes it.
    ``MapNode`` and ``FilterNode`` forward it to their own source.
    """

    def start_epoch(self, epoch: int) -> None: ...


class RepeatNode(Node[Any]):
    """Repeats ``source`` for ``repeats`` epochs, or forever when ``repeats`` is ``None``.

    At the end of each epoch it calls ``source.start_epoch(epoch + 1)``.  After the last epoch it
    raises ``StopIteration`` on every call until ``reset``.  An epoch that yields nothing ends the
    stream too (an empty source cannot be repeated forever).  Items and restore keys pass through
    unchanged, so ``restore`` is the source's.

    State keys:
        ``stage``: ``"Repeat"``.
        ``epoch``: the epoch the source is in (``repeats`` once all epochs are done).
        ``source``: the source's state.
    """

    tag = "Repeat"

    def __init__(self, source: Node[Any], repeats: int | None = None) -> None:
        if not isinstance(source, Epochal):
            raise ConfigError(
                format_message(
                    "RepeatNode needs a source that can start a new epoch",
                    expected="a source with start_epoch(epoch): the dataset source node, or a map/filter over it",
                    found=type(source).__name__,
                    fix="put the Repeat stage directly above the source (or above maps and filters over it)",
                )
            )
        if repeats is not None and (not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 0):
            raise ConfigError(format_message("invalid repeats", expected="None (forever) or an integer >= 0", found=repr(repeats)))
        self.source = source
        self.repeats = repeats
        self._epoch = 0

    def next(self) -> Any:
        if self.repeats is not None and self._epoch >= self.repeats:
            raise StopIteration
        try:
            return self.source.next()
        except StopIteration:
            pass
        if self.repeats is not None and self._epoch + 1 >= self.repeats:
            self._epoch = self.repeats
            raise StopIteration
        self._epoch += 1
        self.source.start_epoch(self._epoch)
        return self.source.next()  # StopIteration here: the new epoch is empty, the stream ends

    def get_state(self) -> State:
        return {"stage": self.tag, "epoch": self._epoch, "source": self.source.get_state()}

    def reset(self, state: State | None = None) -> None:
        if state is None:
            self.source.reset(None)
            self._epoch = 0
            return
        self.check_state(state, "epoch", "source")
        self.source.reset(state["source"])
        self._epoch = state["epoch"]

    def restore(self, restore_key: tuple) -> Any:
        return self.source.restore(restore_key)
