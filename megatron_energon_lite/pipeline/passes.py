"""PassNode: where a worker's pass ends and how the next one begins, in one place.

A pass is what one loop over the loader reads from a worker.  It ends when the worker's pipeline
raises ``StopIteration``: after ``length`` items (Energon's virtual epochs, ``EpochizeDataset``, and
val ``limit`` / ``LimitDataset``), or when the source ends.  Between passes the source either goes
on where it stopped (virtual epochs: a stream cut into passes) or starts over (a plain pass, a val
limit).  The loader puts a ``PassNode`` on top of every worker pipeline that does not end with one,
so the rule lives here and nowhere else; the loader only relays ``StopIteration``.

A state saved right after the last item of a pass restores to a pipeline with nothing left in that
pass (one ``StopIteration``, then the next pass), as in Energon.  A state saved after the loop over
the loader ended (the loader's ``pass_ended``) restores through :meth:`PassNode.pass_was_over`: the
restored loader goes on with the next pass, like the uninterrupted one.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError, format_message
from .node import ForwardsElastic, Node, PassThroughNode, State
from .state_check import check_count, check_stage, nested
from .watchdog import WatchdogNode

__all__ = ["PassNode", "ending_pass", "on_top", "upgrade_v1_worker_state"]


class PassNode(PassThroughNode[Any], ForwardsElastic):
    """Yields at most ``length`` items per pass (``None``: until the source ends), then raises
    ``StopIteration`` once; the next call begins the next pass.

    ``restart``: reset the source between passes (every pass reads the same stream from its start);
    otherwise the next pass continues the source.  A source that ends before ``length`` items ends
    the pass early and is reset, so the next pass starts it over (with ``length=None`` and no
    ``restart`` the source is never reset here: a stage below owns its passes).  ``length`` is this
    worker's share, computed by the caller.  Items and restore keys pass through unchanged.

    State keys:
        ``stage``: ``"Pass"``.
        ``offset``: items yielded in the current pass (0..length).
        ``source``: the source's state.
    """

    tag = "Pass"

    def __init__(self, source: Node[Any], length: int | None = None, *, restart: bool = False, what: str = "items per pass") -> None:
        if length is not None and (not isinstance(length, int) or isinstance(length, bool) or length < 0):
            raise ConfigError(format_message(f"invalid {what}", expected="an integer >= 0", found=repr(length)))
        super().__init__(source)
        self.length = length
        self.restart = restart
        self.what = what
        self._offset = 0
        # Restored from a state saved after the loader's loop ended: the first end of a pass met
        # is that old pass's, already seen by the user, so it is not raised again.
        self._old_pass_over = False

    def next(self) -> Any:
        if self.length is not None and self._offset >= self.length:
            self._end_pass(source_ended=False)
            if self._consume_old_end():
                return self.next()
            raise StopIteration
        try:
            item = self.source.next()
        except StopIteration:
            self._end_pass(source_ended=True)
            if self._consume_old_end():
                return self.next()
            raise
        self._old_pass_over = False
        self._offset += 1
        return item

    def _end_pass(self, *, source_ended: bool) -> None:
        self._offset = 0
        if self.restart or (source_ended and self.length is not None):
            self.source.reset(None)

    def _consume_old_end(self) -> bool:
        if not self._old_pass_over:
            return False
        self._old_pass_over = False
        return True

    def pass_was_over(self) -> None:
        """The state just restored was saved after the loop over the loader ended: the pass it is
        in is over, and the next ``next()`` begins the next one (the end of the old pass is not
        raised again)."""
        self._old_pass_over = True

    def get_state(self) -> State:
        return {"stage": self.tag, "offset": self._offset, "source": self.source.get_state()}

    def reset(self, state: State | None = None) -> None:
        self._old_pass_over = False
        if state is None:
            self.source.reset(None)
            self._offset = 0
            return
        check_stage(state, self.tag, "offset", "source")
        if self.length is None:
            offset = check_count(state["offset"], "offset", stage=self.tag)
        else:
            offset = check_count(state["offset"], "offset", stage=self.tag, high=self.length, high_reason=f"{self.what} on this worker")
        with nested("source"):
            self.source.reset(state["source"])
        self._offset = offset


def on_top(pipeline: Node[Any], *, restart: bool) -> Node[Any]:
    """``pipeline`` with a :class:`PassNode` on top (itself when it already ends with one):
    ``restart`` between passes unless the dataset's passes continue a stream
    (``recipe.passes_continue``)."""
    return pipeline if ending_pass(pipeline) is not None else PassNode(pipeline, restart=restart)


def ending_pass(pipeline: Node[Any]) -> PassNode | None:
    """The :class:`PassNode` that ends ``pipeline``'s passes: the pipeline itself, or below a
    watchdog on top (which only watches: its state and passes are its source's); None if there is
    none (:func:`on_top` puts one there)."""
    while isinstance(pipeline, WatchdogNode):
        pipeline = pipeline.source
    return pipeline if isinstance(pipeline, PassNode) else None


#: Stage tags that loader states of version 1 used for what is now a PassNode.
_V1_PASS_TAGS = ("Epochize", "Limit")


def upgrade_v1_worker_state(state: State) -> State:
    """A worker's pipeline state as version 1 saved it, in this version's shape: Epochize and Limit
    stages are Pass stages (same keys), and a pipeline that did not end with one gets the Pass
    stage the loader now puts on top (at offset 0: it has no length to count against)."""
    upgraded = _retag(state)
    if isinstance(state, dict) and state.get("stage") in _V1_PASS_TAGS:
        return upgraded
    return {"stage": PassNode.tag, "offset": 0, "source": upgraded}


def _retag(value: Any) -> Any:
    if isinstance(value, list):
        return [_retag(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {k: _retag(v) if k in ("source", "sources") else v for k, v in value.items()}
    if out.get("stage") in _V1_PASS_TAGS:
        out["stage"] = PassNode.tag
    return out
