"""Shared helpers of the pipeline tests: a tiny list source and the resume-at-every-step check.

Every stage's tests go through :func:`check_resume_at_every_step`: run a fresh pipeline, save its
state after every step, restore each state into a fresh pipeline and compare the rest of the
stream (restore keys and values) with the uninterrupted run.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from megatron_energon_lite.errors import StateError
from megatron_energon_lite.pipeline.node import Node, OwnsEpochs, get_restore_key
from megatron_energon_lite.pipeline.state_check import check_stage

#: Recorded in a stream where ``next()`` raised ``StopIteration`` (the end of a pass).
END = "<END>"


def list_item(values: list[Any], index: int) -> dict[str, Any]:
    """Item ``index`` of a :class:`ListSource` over ``values`` (a fresh dict every time)."""
    return {"__key__": f"k{index}", "__restore_key__": ("List", index), "value": values[index]}


class ListSource(Node[dict], OwnsEpochs):
    """Yields ``list_item(values, i)``; epoch ``e`` visits the indexes rotated left by ``e``.

    State keys: ``stage`` ("List"), ``epoch``, ``position`` (items of this epoch yielded so far).
    """

    tag = "List"

    def __init__(self, values: list[Any]) -> None:
        self.values = list(values)
        self.epoch = 0
        self.position = 0

    def _index(self, position: int) -> int:
        return (position + self.epoch) % len(self.values)

    def next(self) -> dict:
        if self.position >= len(self.values):
            raise StopIteration
        item = list_item(self.values, self._index(self.position))
        self.position += 1
        return item

    def start_epoch(self, epoch: int) -> None:
        self.epoch, self.position = epoch, 0

    def get_state(self) -> dict:
        return {"stage": self.tag, "epoch": self.epoch, "position": self.position}

    def reset(self, state: dict | None = None) -> None:
        state = state or {"stage": self.tag, "epoch": 0, "position": 0}
        check_stage(state, self.tag, "epoch", "position")
        self.epoch, self.position = state["epoch"], state["position"]

    def restore(self, restore_key: tuple) -> dict:
        if len(restore_key) != 2 or restore_key[0] != self.tag:
            raise StateError(f"not a List restore key: {restore_key!r}")
        return list_item(self.values, restore_key[1])


def _event(node: Node) -> Any:
    try:
        item = node.next()
    except StopIteration:
        return END
    return (get_restore_key(item), item)


def _shape(state: Any) -> Any:
    """The nesting of a state's dict keys (values and their types may change, keys may not)."""
    if isinstance(state, dict):
        return {key: _shape(value) for key, value in state.items()}
    if isinstance(state, list) and state and all(isinstance(value, dict) for value in state):
        return [_shape(value) for value in state]
    return None


def _roundtrip(state: Any) -> Any:
    text = json.dumps(state, allow_nan=False)
    loaded = json.loads(text)
    assert loaded == state, f"state is not plain JSON (tuples, non-str keys, ...): {state!r}"
    return loaded


def run(node: Node, calls: int) -> list[Any]:
    """The next ``calls`` events of ``node``: ``(restore_key, item)`` or :data:`END`."""
    return [_event(node) for _ in range(calls)]


def check_resume_at_every_step(
    make_pipeline: Callable[[], Node],
    *,
    steps: int,
    check_restore: bool = True,
) -> list[Any]:
    """Checks exact resume from the state after every one of ``steps`` calls of ``next()``.

    ``StopIteration`` is recorded as :data:`END` and the run goes on (a pass may be followed by
    another); it stops early after two ENDs in a row.  Returns the uninterrupted events.

    Checks: every state round-trips through JSON, keeps the same keys and does not change after it
    was returned; from every state a fresh pipeline yields exactly the rest of the stream, also
    after first restoring another state and reading from it; ``reset(None)`` starts over; with
    ``check_restore``, ``restore(restore_key)`` rebuilds every item.
    """
    node = make_pipeline()
    raw_states = [node.get_state()]
    texts = [json.dumps(raw_states[0], allow_nan=False)]
    events: list[Any] = []
    while len(events) < steps and events[-2:] != [END, END]:
        events.append(_event(node))
        raw_states.append(node.get_state())
        texts.append(json.dumps(raw_states[-1], allow_nan=False))
    states = [_roundtrip(state) for state in raw_states]
    for k, (state, text) in enumerate(zip(raw_states, texts)):
        assert json.dumps(state, allow_nan=False) == text, f"state {k} changed after it was returned (aliasing)"
        assert _shape(state) == _shape(states[0]), f"state {k} has other keys than the initial state:\n{state}\n{states[0]}"
    n = len(events)

    assert run(make_pipeline(), n) == events, "two fresh pipelines disagree: the pipeline is not deterministic"
    node.reset(None)
    assert run(node, n) == events, "reset(None) did not start the stream over"

    for k, state in enumerate(states):
        fresh = make_pipeline()
        fresh.reset(state)
        assert run(fresh, n - k) == events[k:], f"resuming from the state after step {k} diverged"
        # Restore twice in a row: a state restored over a used pipeline leaves nothing behind.
        other = states[(k * 7 + 3) % len(states)]
        fresh.reset(other)
        run(fresh, 2)
        fresh.reset(state)
        assert run(fresh, n - k) == events[k:], f"resuming twice from step {k} diverged"

    if check_restore:
        fresh = make_pipeline()
        for event in events:
            if event is END:
                continue
            key, item = event
            rebuilt = fresh.restore(key)
            assert (get_restore_key(rebuilt), rebuilt) == (key, item), f"restore({key!r}) rebuilt another item"
            assert fresh.restore(json.loads(json.dumps(key))) == item, f"restore of the JSON form of {key!r} failed"
    return events
