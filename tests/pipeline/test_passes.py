"""PassNode: virtual epochs (passes continue the stream), limits (passes restart it), plain passes,
and a state saved after a pass ended."""

from __future__ import annotations

import pytest
from resume import END, ListSource, check_resume_at_every_step, run

from megatron_energon_lite.errors import ConfigError
from megatron_energon_lite.pipeline.passes import (
    PassNode,
    on_top,
    upgrade_v1_worker_state,
)
from megatron_energon_lite.pipeline.repeat import RepeatNode

VALUES = list(range(7))


def passes(events: list, pick=lambda event: event[1]["value"]) -> list[list]:
    """Splits a stream at END markers into each pass's items (their values, or what ``pick`` takes)."""
    result: list[list] = [[]]
    for event in events:
        if event is END:
            result.append([])
        else:
            result[-1].append(pick(event))
    return result


def endless() -> list:
    """The values an endless Repeat over the ListSource yields (epoch e rotated left by e)."""
    return [VALUES[(p + e) % len(VALUES)] for e in range(10) for p in range(len(VALUES))]


@pytest.mark.parametrize("length", [1, 3, 5, 7, 10])
def test_each_pass_yields_length_items_and_continues_the_source(length: int) -> None:
    node = PassNode(RepeatNode(ListSource(VALUES)), length)
    events = run(node, 4 * (length + 1))
    assert passes(events)[:4] == [endless()[i * length : (i + 1) * length] for i in range(4)]
    assert [i for i, e in enumerate(events) if e is END] == [length + i * (length + 1) for i in range(4)]


def test_source_shorter_than_a_pass_ends_the_pass_and_restarts() -> None:
    node = PassNode(ListSource(VALUES), 5)
    assert passes(run(node, 15)) == [VALUES[:5], VALUES[5:], VALUES[:5], []]


def test_zero_length_and_empty_source() -> None:
    assert run(PassNode(ListSource(VALUES), 0), 2) == [END, END]
    assert run(PassNode(ListSource([]), 3), 2) == [END, END]


@pytest.mark.parametrize("length", [-1, 2.5, True])
def test_invalid_length(length: object) -> None:
    with pytest.raises(ConfigError):
        PassNode(ListSource(VALUES), length)  # type: ignore[arg-type]


def test_state_at_the_end_of_a_pass_ends_that_pass_first() -> None:
    node = PassNode(RepeatNode(ListSource(VALUES)), 3)
    run(node, 3)
    state = node.get_state()
    assert state["offset"] == 3
    fresh = PassNode(RepeatNode(ListSource(VALUES)), 3)
    fresh.reset(state)
    assert passes(run(fresh, 4)) == [[], endless()[3:6]]


@pytest.mark.parametrize("length", [3, 7])
def test_resume_at_every_step(length: int) -> None:
    check_resume_at_every_step(lambda: PassNode(RepeatNode(ListSource(VALUES)), length), steps=30)


def test_resume_over_a_finite_source() -> None:
    check_resume_at_every_step(lambda: PassNode(ListSource(VALUES), 4), steps=20)


# --- limits: passes that restart the source --------------------------------------------------------
LIMITED = list(range(100, 109))  # 9 items


def keys_of_passes(events: list) -> list[list]:
    return passes(events, pick=lambda event: event[0])


@pytest.mark.parametrize("length", [1, 4, 9])
def test_a_restarting_limit_yields_the_same_first_items_every_pass(length: int) -> None:
    events = run(PassNode(ListSource(LIMITED), length, restart=True), 3 * (length + 1))
    assert keys_of_passes(events)[:3] == [[("List", i) for i in range(length)]] * 3


def test_a_source_shorter_than_the_limit_ends_the_pass() -> None:
    events = run(PassNode(ListSource(LIMITED), 20, restart=True), 2 * (len(LIMITED) + 1))
    assert keys_of_passes(events)[:2] == [[("List", i) for i in range(len(LIMITED))]] * 2


def test_a_continuing_limit_goes_on_and_starts_over_when_the_source_ends() -> None:
    """Behaviour change (was: every later pass empty once the source ended): the source is reset,
    as Energon 7.4's LimitDataset does after every pass."""
    node = PassNode(ListSource(LIMITED), 4)
    assert keys_of_passes(run(node, 15)) == [
        [("List", i) for i in range(4)],
        [("List", i) for i in range(4, 8)],
        [("List", 8)],
        [("List", i) for i in range(3)],
    ]


@pytest.mark.parametrize("restart", [True, False])
def test_resume_a_limit_at_every_step(restart: bool) -> None:
    check_resume_at_every_step(lambda: PassNode(ListSource(LIMITED), 4, restart=restart), steps=16)


def test_resume_a_limit_over_a_repeating_source() -> None:
    check_resume_at_every_step(lambda: PassNode(RepeatNode(ListSource(LIMITED)), 12, restart=True), steps=30)


# --- plain passes: the node the loader puts on top ---------------------------------------------------
def test_a_plain_pass_ends_with_the_source_and_the_next_one_starts_it_over() -> None:
    node = PassNode(ListSource(VALUES), restart=True)
    assert passes(run(node, 2 * (len(VALUES) + 1))) == [VALUES, VALUES, []]


def test_without_restart_a_plain_pass_leaves_the_source_alone() -> None:
    """Below it a stage owns the passes (an epochized stream inside a batch): it is not reset."""
    node = PassNode(PassNode(RepeatNode(ListSource(VALUES)), 3))
    assert passes(run(node, 9)) == [endless()[:3], endless()[3:6], endless()[6:7]]


def test_on_top_keeps_a_pipeline_that_ends_with_a_pass() -> None:
    inner = PassNode(ListSource(VALUES), 3)
    assert on_top(inner, restart=True) is inner
    wrapped = on_top(ListSource(VALUES), restart=True)
    assert isinstance(wrapped, PassNode) and wrapped.restart and wrapped.length is None


@pytest.mark.parametrize("restart", [True, False])
def test_resume_a_plain_pass_at_every_step(restart: bool) -> None:
    check_resume_at_every_step(lambda: PassNode(ListSource(VALUES), restart=restart), steps=20)


# --- a state saved after the loop over the loader ended ----------------------------------------------
@pytest.mark.parametrize(("make", "length"), [(lambda: PassNode(ListSource(VALUES), restart=True), len(VALUES)), (lambda: PassNode(RepeatNode(ListSource(VALUES)), 3), 3)])
def test_pass_was_over_goes_on_with_the_next_pass(make, length: int) -> None:
    """Restored from the state after the last item of a pass: with ``pass_was_over`` the next pass
    comes at once (the uninterrupted run raised the end already); without, the pass ends first."""
    node = make()
    run(node, length)
    state = node.get_state()
    expected = run(node, 2 * (length + 1))
    assert expected[0] is END
    ended = make()
    ended.reset(state)
    ended.pass_was_over()
    assert run(ended, 2 * length + 1) == expected[1:]
    not_ended = make()
    not_ended.reset(state)
    assert run(not_ended, 2 * (length + 1)) == expected


def test_pass_was_over_is_forgotten_by_reset() -> None:
    node = PassNode(ListSource(VALUES), restart=True)
    run(node, len(VALUES))
    state = node.get_state()
    node.reset(state)
    node.pass_was_over()
    node.reset(state)
    assert run(node, 1) == [END]


# --- loader states of version 1 ------------------------------------------------------------------------
def test_version_1_states_take_the_pass_shape() -> None:
    source_state = {"stage": "Batch", "index": 3, "source": {"stage": "Limit", "offset": 2, "source": {"stage": "List", "epoch": 0, "position": 5}}}
    assert upgrade_v1_worker_state(source_state) == {
        "stage": "Pass",
        "offset": 0,
        "source": {"stage": "Batch", "index": 3, "source": {"stage": "Pass", "offset": 2, "source": {"stage": "List", "epoch": 0, "position": 5}}},
    }
    epochized = {"stage": "Epochize", "offset": 1, "source": {"stage": "List", "epoch": 2, "position": 0}}
    assert upgrade_v1_worker_state(epochized) == {"stage": "Pass", "offset": 1, "source": {"stage": "List", "epoch": 2, "position": 0}}

