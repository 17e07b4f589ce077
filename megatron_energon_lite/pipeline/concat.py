"""ConcatNode: the items of several sources one after the other (Energon's val ``ConcatDataset``)."""

from __future__ import annotations

from typing import Any, Sequence

from ..errors import ConfigError, StateError, format_message
from .node import Node, State, as_key, get_restore_key, set_restore_key, tagged_key_problem
from .state_check import check_count, check_stage, nested

__all__ = ["ConcatNode"]


class ConcatNode(Node[Any]):
    """Yields every item of ``sources[0]``, then of ``sources[1]``, and so on.

    Restore keys: ``("Concat", source_index)`` prepended to the item's key; ``restore`` asks that
    source.

    State keys:
        ``stage``: ``"Concat"``.
        ``current``: the index of the source being read (``len(sources)`` once all are done).
        ``sources``: the states of all sources, in order.
    """

    tag = "Concat"

    def __init__(self, sources: Sequence[Node[Any]]) -> None:
        self.sources = list(sources)
        if not self.sources:
            raise ConfigError(format_message("ConcatNode needs at least one source", found="an empty list"))
        self._current = 0

    def inputs(self) -> Sequence[Node[Any]]:
        return tuple(self.sources)

    def next(self) -> Any:
        while self._current < len(self.sources):
            try:
                item = self.sources[self._current].next()
            except StopIteration:
                self._current += 1
                continue
            return set_restore_key(item, (self.tag, self._current) + get_restore_key(item))
        raise StopIteration

    def get_state(self) -> State:
        return {"stage": self.tag, "current": self._current, "sources": [source.get_state() for source in self.sources]}

    def reset(self, state: State | None = None) -> None:
        if state is None:
            for source in self.sources:
                source.reset(None)
            self._current = 0
            return
        check_stage(state, self.tag, "current", "sources")
        if not isinstance(state["sources"], list) or len(state["sources"]) != len(self.sources):
            raise StateError(
                format_message(
                    "saved Concat state has a different number of sources",
                    expected=f"{len(self.sources)} source states",
                    found=repr(state["sources"])[:200],
                    fix="restore a state saved by a loader over the same datasets",
                )
            )
        current = check_count(state["current"], "current", stage=self.tag, high=len(self.sources), high_reason=f"{len(self.sources)} sources; {len(self.sources)} once all are done")
        for i, (source, source_state) in enumerate(zip(self.sources, state["sources"])):
            with nested("sources", i):
                source.reset(source_state)
        self._current = current

    def restore_key_problem(self, key: tuple) -> str | None:
        return tagged_key_problem(key, self.tag, self.sources)

    def restore(self, restore_key: tuple) -> Any:
        key = as_key(restore_key)
        if len(key) < 2 or key[0] != self.tag or not isinstance(key[1], int) or not 0 <= key[1] < len(self.sources):
            raise StateError(
                format_message(
                    "restore key does not belong to this Concat stage",
                    expected=f"('Concat', source_index < {len(self.sources)}, *item_key)",
                    found=repr(key)[:200],
                )
            )
        return set_restore_key(self.sources[key[1]].restore(key[2:]), key)
