"""Replay with skips (issue 41): the stage that drops the samples a skip list names.

It sits where samples enter batching or packing (below the first ``Batch``, ``GroupBatch`` or
``Pack`` stage; at the top of a pipeline without one) and is built only when the loader has a
skip list (``Runtime.sample_skips``), so a pipeline without one is unchanged.  It keeps no state
of its own: its state is its source's, and a batch or pack stage above it that replays its
buffer on restore pulls the same filtered samples again.  Everything below it (the blend's
draws, the shuffle buffer, each dataset's order) runs as in the run without skips.

A sample is named by its identity ``(dataset, split index)``: the index after the first blend
(or concatenation) tag of its restore key (0 without one), and the split index after its last
``Webdataset`` tag (:func:`sample_identity`).
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

from ..errors import SkipRecord
from .load import BLEND_TAG, RESTORE_TAG
from .node import ForwardsElastic, ForwardsEpochs, Node, PassThroughNode, State, find_stage, get_restore_key
from .runtime import Runtime

__all__ = ["REPLAY_SKIP_STAGE", "SkipNamedNode", "sample_identity", "skipping"]

#: The stage a replay skip is reported under (``SkipRecord.stage``): the loader logs these at
#: INFO and counts them apart from failures.
REPLAY_SKIP_STAGE = "skip list"
_DATASET_TAGS = (BLEND_TAG, "Concat")
# The loader's logger: a skip is the loader's news (as the default error handler's).
logger = logging.getLogger("megatron_energon_lite.loader")


def sample_identity(restore_key: tuple) -> tuple[int, int] | None:
    """``(dataset, split index)`` of the one raw sample a flat restore key names, else None (a
    batch's or a pack's key, an item of the user's own dataset)."""
    position = None
    for i in range(len(restore_key) - 2, -1, -1):
        if restore_key[i] == RESTORE_TAG:
            position = i
            break
    if position is None or any(isinstance(part, tuple) for part in restore_key):
        return None
    index = restore_key[position + 1]
    if not isinstance(index, int) or isinstance(index, bool):
        return None
    dataset = 0
    for i in range(position):
        if restore_key[i] in _DATASET_TAGS and isinstance(restore_key[i + 1], int):
            dataset = restore_key[i + 1]
            break
    return dataset, index


class SkipNamedNode(PassThroughNode[Any], ForwardsEpochs, ForwardsElastic):
    """Passes on the items of ``source`` except the samples named in ``skips`` (identity ->
    description for the report); each one dropped is reported to ``runtime``'s skip sink (the
    loader's main process logs it with the step) or, without one, logged here.

    State: its source's, unchanged (no keys of its own)."""

    tag = "SkipNamed"

    def __init__(self, source: Node[Any], skips: Mapping[tuple[int, int], str], runtime: Runtime | None) -> None:
        super().__init__(source)
        self.skips = skips
        self.runtime = runtime

    def next(self) -> Any:
        while True:
            item = self.source.next()
            identity = sample_identity(get_restore_key(item))
            if identity is None or identity not in self.skips:
                return item
            self._report(item, identity)

    def _report(self, item: Any, identity: tuple[int, int]) -> None:
        key = item.get("__key__") if isinstance(item, dict) else getattr(item, "__key__", None)
        where = self.skips[identity]
        named = f", key {key!r}" if key is not None and f"key {key!r}" not in where else ""
        message = f"skipped sample {where}{named}: named in the loader's skip list"
        record = SkipRecord(key, 1, f"dataset {identity[0]}", None, REPLAY_SKIP_STAGE, "named in the skip list", message)
        sink = self.runtime.skips if self.runtime is not None else None
        if sink is not None:
            sink.add(record)
        else:
            logger.info("%s", message)

    def get_state(self) -> State:
        return self.source.get_state()

    def reset(self, state: State | None = None) -> None:
        self.source.reset(state)


def skipping(node: Node[Any], runtime: Runtime | None) -> Node[Any]:
    """``node`` below a :class:`SkipNamedNode` when ``runtime`` carries a skip list and no stage
    at or below ``node`` drops them already; else ``node`` itself."""
    skips = runtime.sample_skips if runtime is not None else None
    if not skips or find_stage(node, SkipNamedNode) is not None:
        return node
    return SkipNamedNode(node, skips, runtime)
