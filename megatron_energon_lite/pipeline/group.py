"""GroupBatchNode: batches of items that share a group key (length or aspect-ratio buckets).

``criterion(item, index)`` returns ``(key, batch_size)``; ``batch_size`` None means the default.
Each key has a bucket; a bucket that reaches its batch size is emitted as one batch
(``batcher(items, batch_index)``).  The buckets together hold at most ``max_buffered`` items: when
one more item would exceed that, the fullest bucket is emitted early as a smaller batch (so
memory stays bounded even with many rare keys).  When the source ends, the remaining buckets
are emitted, oldest first, as partial batches, or dropped with ``drop_last`` (for validation:
every sample of a pass reaches some batch unless ``drop_last``).

A key must be hashable and JSON-serialisable (it is saved in the state) and must always come
with the same batch size.

Bad samples: ``criterion`` runs through ``criterion_guard`` (by default a sibling of ``guard``:
same handler and tolerance, its own consecutive-failure count, as Energon's separate
``ErrorContext`` for ``batch_group_criterion`` with ``batch``'s tolerance).  A sample whose
criterion raises is reported to the handler and dropped: it joins no bucket; ``SkipSample``
drops it silently.  It still counts as an input (``index``), so the indexes the criterion sees
do not depend on failures.  (Energon 7.4.1 means the same but, after handling the error, puts the
sample into the previous sample's bucket, or fails with ``UnboundLocalError`` on a worker's
first sample: group_batch_dataset.py, ``__iter__``; that is not copied, in Energon mode either.)

State: the buckets' restore keys (never samples), re-read by random access when their batch is
emitted, as the shuffle buffer does.

Restore keys: ``("Group", batch_index, *member_keys)``.

State keys:
    ``stage``: ``"Group"``.
    ``buckets``: ``[[key, batch_size, [member restore keys]], ...]`` in bucket creation order.
    ``index``: batches attempted so far.  ``inputs``: items taken from the source so far.
    ``failures``: the guard's consecutive-failure count.  ``source``: the source's state.
    ``criterion_failures``: the criterion guard's count (optional when restoring: 0).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Hashable

from ..errors import ConfigError, StateError, format_message
from .guard import DROPPED, SampleGuard, describe_item
from .load import waiting_samples
from .node import (
    ForwardsElastic,
    Node,
    OneSourceNode,
    Remainder,
    State,
    as_key,
    get_restore_key,
    key_to_json,
    set_restore_key,
)
from .state_check import check_count, check_list, check_stage, invalid, nested

__all__ = ["GroupBatchNode"]


class _Pending:
    __slots__ = ("key",)

    def __init__(self, key: tuple) -> None:
        self.key = key


def _group_key(value: Any) -> Hashable:
    """The dict key of a group: JSON lists become tuples so that restored keys match."""
    return tuple(_group_key(v) for v in value) if isinstance(value, list) else value


class GroupBatchNode(OneSourceNode[Any], ForwardsElastic):
    tag = "Group"

    def __init__(
        self,
        source: Node[Any],
        criterion: Callable[[Any, int], tuple[Any, int | None]],
        batcher: Callable[[list[Any], int], Any],
        *,
        batch_size: int | None,
        drop_last: bool = False,
        max_buffered: int | None = None,
        guard: SampleGuard | None = None,
        criterion_guard: SampleGuard | None = None,
    ) -> None:
        super().__init__(source)
        self.criterion = criterion
        self.batcher = batcher
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.max_buffered = max_buffered
        self.guard = guard if guard is not None else SampleGuard(stage="batch")
        self.criterion_guard = criterion_guard if criterion_guard is not None else self.guard.sibling("batch_group_criterion")
        self.reset()

    # --- state ---------------------------------------------------------------------------------
    def reset(self, state: State | None = None) -> None:
        # bucket key -> [json key, batch size, items, restore keys (JSON)]
        self._buckets: dict[Hashable, list] = {}
        self._source_done = False
        if state is None:
            self.source.reset(None)
            self.guard.reset()
            self.criterion_guard.reset()
            self._index = self._inputs = 0
            return
        check_stage(state, self.tag, "buckets", "index", "inputs", "failures", "source")
        index = check_count(state["index"], "index", stage=self.tag)
        inputs = check_count(state["inputs"], "inputs", stage=self.tag)
        failures = check_count(state["failures"], "failures", stage=self.tag)
        criterion_failures = check_count(state.get("criterion_failures", 0), "criterion_failures", stage=self.tag)
        buckets: dict[Hashable, list] = {}
        for i, bucket in enumerate(check_list(state["buckets"], "buckets", stage=self.tag)):
            key, size, members = check_list(bucket, "buckets", i, stage=self.tag, length=3, of="entries: [group key, batch size, member restore keys]")
            try:
                bucket_id = _group_key(key)
                hash(bucket_id)
            except TypeError:
                raise invalid(("buckets", i, 0), "a group key: a string, number, boolean, null or a list of them", key, stage=self.tag) from None
            if bucket_id in buckets:
                raise invalid(("buckets", i, 0), "a group key that no other bucket has", key, stage=self.tag)
            check_count(size, "buckets", i, 1, stage=self.tag)
            if size < 1:
                raise invalid(("buckets", i, 1), "a batch size >= 1", size, stage=self.tag)
            members = check_list(members, "buckets", i, 2, stage=self.tag)
            if len(members) >= size:  # a full bucket is emitted at once, never saved
                raise invalid(("buckets", i, 2), f"fewer than {size} member keys (the bucket's batch size)", members, stage=self.tag)
            keys = [list(check_list(m, "buckets", i, 2, j, stage=self.tag, of="restore key parts")) for j, m in enumerate(members)]
            buckets[bucket_id] = [key, size, [_Pending(as_key(m)) for m in keys], keys]
        with nested("source"):
            self.source.reset(state["source"])
        self.guard.reset(failures)
        self.criterion_guard.reset(criterion_failures)
        self._index, self._inputs = index, inputs
        self._buckets = buckets

    def undelivered(self) -> Remainder:
        """The source's remainder and the samples waiting in the buckets (redistributed)."""
        waiting = [sample for _, _, _, keys in self._buckets.values() for sample in waiting_samples(keys, self.tag)]
        return self.source.undelivered().with_waiting(waiting)

    def get_state(self) -> State:
        return {
            "stage": self.tag,
            "buckets": [[key, size, list(keys)] for key, size, _, keys in self._buckets.values()],
            "index": self._index,
            "inputs": self._inputs,
            "failures": self.guard.failures,
            "criterion_failures": self.criterion_guard.failures,
            "source": self.source.get_state(),
        }

    # --- iteration -----------------------------------------------------------------------------
    def _classify(self, item: Any, index: int) -> tuple[Any, int]:
        result = self.criterion(item, index)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise ConfigError(format_message("batch_group_criterion must return (group key, batch size or None)", where=f"sample {describe_item(item)}", found=repr(result)[:120]))
        key, size = result
        size = self.batch_size if size is None else size
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ConfigError(format_message("batch_group_criterion gave no valid batch size", where=f"sample {describe_item(item)}, group {key!r}", expected="a positive integer, or None with get_*_dataset(batch_size=...) set", found=repr(size)))
        try:
            text = json.dumps(key)
            hash(key)
        except (TypeError, ValueError):
            raise ConfigError(format_message("batch_group_criterion returned a group key that cannot be saved", where=f"sample {describe_item(item)}", expected="a hashable, JSON-serialisable key: str, int, float, bool, None or a tuple of them", found=repr(key)[:120])) from None
        return json.loads(text), size

    def _add(self, item: Any) -> list | None:
        """Buckets ``item``; returns a bucket that must be emitted now, if any."""
        index = self._inputs
        self._inputs += 1  # also when the criterion fails: the next sample keeps its index
        classified = self.criterion_guard.call(item, self._classify, item, index)
        if classified is DROPPED:  # reported and counted by the guard (or skipped on purpose)
            return None
        self.criterion_guard.passed()
        key, size = classified
        bucket_id = _group_key(key)
        bucket = self._buckets.get(bucket_id)
        if bucket is None:
            bucket = self._buckets[bucket_id] = [key, size, [], []]
        elif bucket[1] != size:
            raise ConfigError(format_message("batch_group_criterion gave one group two batch sizes", where=f"group {key!r}, sample {describe_item(item)}", found=f"{bucket[1]} and {size}", fix="return the same batch size for every sample of a group"))
        bucket[2].append(item)
        bucket[3].append(key_to_json(get_restore_key(item)))
        if len(bucket[2]) >= size:
            return self._take(bucket_id)
        if self.max_buffered is not None and sum(len(b[2]) for b in self._buckets.values()) >= self.max_buffered:
            fullest = max(self._buckets, key=lambda k: len(self._buckets[k][2]) / self._buckets[k][1])
            return self._take(fullest)
        return None

    def _take(self, bucket_id: Hashable) -> list:
        return self._buckets.pop(bucket_id)[2]

    def _emit(self, items: list[Any]) -> Any:
        items = [self.source.restore(item.key) if isinstance(item, _Pending) else item for item in items]
        index = self._index
        self._index += 1
        batch = self.guard.call(items, self.batcher, items, index)
        if batch is DROPPED:
            return DROPPED
        self.guard.passed()
        return set_restore_key(batch, (self.tag, index, *(get_restore_key(item) for item in items)))

    def next(self) -> Any:
        while True:
            if self._source_done:
                if not self._buckets or self.drop_last:
                    self._buckets.clear()
                    raise StopIteration
                ready = self._take(next(iter(self._buckets)))  # oldest bucket first
            else:
                try:
                    item = self.source.next()
                except StopIteration:
                    self._source_done = True
                    continue
                ready = self._add(item)
                if ready is None:
                    continue
            batch = self._emit(ready)
            if batch is not DROPPED:
                return batch

    def restore(self, restore_key: tuple) -> Any:
        key = as_key(restore_key)
        if len(key) < 3 or key[0] != self.tag or not isinstance(key[1], int):
            raise StateError(format_message("restore key does not belong to a Group stage", expected="('Group', batch_index, *member_keys)", found=repr(key)[:200]))
        items = [self.source.restore(member) for member in key[2:]]
        return set_restore_key(self.batcher(items, key[1]), key)
