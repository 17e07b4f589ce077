from __future__ import annotations

import pytest
from resume import END, ListSource, check_resume_at_every_step, run

from megatron_energon_lite.errors import ConfigError
from megatron_energon_lite.pipeline.epochize import EpochizeNode
from megatron_energon_lite.pipeline.repeat import RepeatNode

VALUES = list(range(7))


def passes(events: list) -> list[list]:
    """Splits a stream at END markers into the values of each pass."""
    result: list[list] = [[]]
    for event in events:
        if event is END:
            result.append([])
        else:
            result[-1].append(event[1]["value"])
    return result


def endless() -> list:
    """The values an endless Repeat over the ListSource yields (epoch e rotated left by e)."""
    return [VALUES[(p + e) % len(VALUES)] for e in range(10) for p in range(len(VALUES))]


@pytest.mark.parametrize("length", [1, 3, 5, 7, 10])
def test_each_pass_yields_length_items_and_continues_the_source(length: int) -> None:
    node = EpochizeNode(RepeatNode(ListSource(VALUES)), length)
    events = run(node, 4 * (length + 1))
    assert passes(events)[:4] == [endless()[i * length : (i + 1) * length] for i in range(4)]
    assert [i for i, e in enumerate(events) if e is END] == [length + i * (length + 1) for i in range(4)]


def test_source_shorter_than_a_pass_ends_the_pass_and_restarts() -> None:
    node = EpochizeNode(ListSource(VALUES), 5)
    assert passes(run(node, 15)) == [VALUES[:5], VALUES[5:], VALUES[:5], []]


def test_zero_length_and_empty_source() -> None:
    assert run(EpochizeNode(ListSource(VALUES), 0), 2) == [END, END]
    assert run(EpochizeNode(ListSource([]), 3), 2) == [END, END]


@pytest.mark.parametrize("length", [-1, 2.5, None])
def test_invalid_length(length: object) -> None:
    with pytest.raises(ConfigError):
        EpochizeNode(ListSource(VALUES), length)  # type: ignore[arg-type]


def test_state_at_the_end_of_a_pass_ends_that_pass_first() -> None:
    node = EpochizeNode(RepeatNode(ListSource(VALUES)), 3)
    run(node, 3)
    state = node.get_state()
    assert state["offset"] == 3
    fresh = EpochizeNode(RepeatNode(ListSource(VALUES)), 3)
    fresh.reset(state)
    assert passes(run(fresh, 4)) == [[], endless()[3:6]]


@pytest.mark.parametrize("length", [3, 7])
def test_resume_at_every_step(length: int) -> None:
    check_resume_at_every_step(lambda: EpochizeNode(RepeatNode(ListSource(VALUES)), length), steps=30)


def test_resume_over_a_finite_source() -> None:
    check_resume_at_every_step(lambda: EpochizeNode(ListSource(VALUES), 4), steps=20)
