from __future__ import annotations

import pytest
from resume import END, ListSource, check_resume_at_every_step, list_item, run

from megatron_energon_lite.errors import ConfigError, StateError
from megatron_energon_lite.pipeline.concat import ConcatNode

PARTS = [[1, 2, 3], [], [4], [5, 6]]


def make() -> ConcatNode:
    return ConcatNode([ListSource(values) for values in PARTS])


def test_sources_in_order_with_prefixed_keys() -> None:
    expected = []
    for s, values in enumerate(PARTS):
        for i in range(len(values)):
            key = ("Concat", s, "List", i)
            expected.append((key, {**list_item(values, i), "__restore_key__": key}))
    assert run(make(), len(expected) + 2) == expected + [END, END]


def test_restore_asks_the_right_source() -> None:
    item = make().restore(("Concat", 3, "List", 1))
    assert item["value"] == 6 and item["__restore_key__"] == ("Concat", 3, "List", 1)
    with pytest.raises(StateError, match="Concat"):
        make().restore(("Concat", 4, "List", 0))


def test_state_keys_and_mismatch() -> None:
    node = make()
    run(node, 4)
    state = node.get_state()
    assert state["current"] == 2 and len(state["sources"]) == len(PARTS)
    with pytest.raises(StateError, match="number of sources"):
        ConcatNode([ListSource([1])]).reset(state)


def test_needs_a_source() -> None:
    with pytest.raises(ConfigError):
        ConcatNode([])


def test_resume_at_every_step() -> None:
    check_resume_at_every_step(make, steps=12)
