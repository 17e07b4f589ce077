"""BatchNode: groups ``batch_size`` consecutive items and calls ``batcher(items, batch_index)``."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager

from ..errors import ConfigError, StateError, format_message
from .guard import DROPPED, SampleGuard
from .node import (
    ForwardsElastic,
    Node,
    OneSourceNode,
    State,
    as_key,
    get_restore_key,
    set_restore_key,
)
from .state_check import check_count, check_stage, nested

__all__ = ["BatchNode"]


# Elastic as its source: a batch is made in one call, nothing waits here between calls.
class BatchNode(OneSourceNode[Any], ForwardsElastic):
    """Pulls ``batch_size`` items from ``source`` and returns ``batcher(items, batch_index)``.

    The last partial batch is emitted unless ``drop_last``.  A batcher that fails drops the whole
    batch through ``guard`` (``SkipSample`` drops it silently) and the next batch is pulled.

    ``next()`` pulls all members of a batch synchronously, so no buffer lives between two calls: the
    state is the source's state after the last member plus the batch counter, and nothing has to be
    replayed on restore.

    Restore keys: ``("Batch", batch_index, *member_keys)``; ``restore`` re-reads every member with
    ``source.restore`` and calls the batcher again (it must be deterministic).

    State keys:
        ``stage``: ``"Batch"``.
        ``index``: batches attempted so far (emitted or dropped); the next batch gets this index.
        ``failures``: the guard's consecutive-failure count.
        ``source``: the source's state.
    """

    tag = "Batch"

    def __init__(
        self,
        source: Node[Any],
        batch_size: int,
        batcher: Callable[[list[Any], int], Any],
        *,
        drop_last: bool = False,
        guard: SampleGuard | None = None,
        member_context: Callable[[int], ContextManager[Any]] | None = None,
    ) -> None:
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ConfigError(format_message("invalid batch_size", expected="an integer >= 1", found=repr(batch_size)))
        super().__init__(source)
        self.batch_size = batch_size
        self.batcher = batcher
        self.drop_last = drop_last
        self.guard = guard if guard is not None else SampleGuard(stage=f"Batch({getattr(batcher, '__qualname__', batcher)})")
        #: ``member_context(batch index)`` is entered while the batch's members are pulled, so that
        #: hooks below (``encode_sample``) see the index of the batch they will be part of.
        self.member_context = member_context
        self._index = 0

    def next(self) -> Any:
        while True:
            items = []
            try:
                with self.member_context(self._index) if self.member_context is not None else contextlib.nullcontext():
                    while len(items) < self.batch_size:
                        items.append(self.source.next())
            except StopIteration:
                if not items or self.drop_last:
                    raise
            index = self._index
            self._index += 1
            batch = self.guard.call(items, self.batcher, items, index)
            if batch is DROPPED:
                continue
            self.guard.passed()
            return set_restore_key(batch, (self.tag, index, *(get_restore_key(item) for item in items)))

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
        # A generator hook below resumes here; its pending outputs go into the next batch.
        with self.member_context(index) if self.member_context is not None else contextlib.nullcontext(), nested("source"):
            self.source.reset(state["source"])
        self._index = index
        self.guard.reset(failures)

    def restore(self, restore_key: tuple) -> Any:
        key = as_key(restore_key)
        if len(key) < 3 or key[0] != self.tag or not isinstance(key[1], int):
            raise StateError(
                format_message(
                    "restore key does not belong to a Batch stage",
                    expected="('Batch', batch_index, *member_keys) with at least one member",
                    found=repr(key)[:200],
                )
            )
        with self.member_context(key[1]) if self.member_context is not None else contextlib.nullcontext():
            items = [self.source.restore(member) for member in key[2:]]
        return set_restore_key(self.batcher(items, key[1]), key)
