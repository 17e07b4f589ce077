from __future__ import annotations

import pytest
from resume import END, ListSource, check_resume_at_every_step, run

from megatron_energon_lite.errors import ConfigError, StateError
from megatron_energon_lite.pipeline.concat import ConcatNode
from megatron_energon_lite.pipeline.filter import FilterNode
from megatron_energon_lite.pipeline.map import MapNode
from megatron_energon_lite.pipeline.node import starts_epochs
from megatron_energon_lite.pipeline.repeat import RepeatNode

VALUES = ["a", "b", "c", "d"]


def epoch_order(epoch: int) -> list[str]:
    """The ListSource's documented order for an epoch: rotated left by the epoch."""
    return VALUES[epoch % len(VALUES) :] + VALUES[: epoch % len(VALUES)]


def values(events: list) -> list:
    return [event[1]["value"] for event in events if event is not END]


def test_finite_repeats_start_new_epochs_then_stop() -> None:
    node = RepeatNode(ListSource(VALUES), repeats=3)
    events = run(node, 3 * len(VALUES) + 2)
    assert values(events) == epoch_order(0) + epoch_order(1) + epoch_order(2)
    assert events[-2:] == [END, END]
    state = node.get_state()
    assert (state["epoch"], state["repetition"]) == (2, 3)


def test_forever() -> None:
    node = RepeatNode(ListSource(VALUES))
    assert values(run(node, 22)) == [v for e in range(6) for v in epoch_order(e)][:22]
    assert node.get_state()["epoch"] == 5


def test_zero_repeats_and_empty_sources_end() -> None:
    assert run(RepeatNode(ListSource(VALUES), repeats=0), 2) == [END, END]
    assert run(RepeatNode(ListSource([])), 3) == [END, END, END]


def test_a_source_without_epochs_starts_over_in_the_same_order() -> None:
    assert starts_epochs(ListSource(VALUES))
    assert not starts_epochs(ConcatNode([ListSource(VALUES)]))
    assert not starts_epochs(MapNode(ConcatNode([ListSource(VALUES)]), lambda item, index: item))

    def make() -> RepeatNode:
        return RepeatNode(ConcatNode([ListSource(VALUES)]), repeats=3)

    events = check_resume_at_every_step(make, steps=3 * len(VALUES) + 1)
    assert values(events) == epoch_order(0) * 3


def test_maps_and_filters_pass_epochs_through() -> None:
    def make() -> RepeatNode:
        kept = FilterNode(ListSource(VALUES), lambda item, index: item["value"] != "b")
        return RepeatNode(MapNode(kept, lambda item, index: {**item, "index": index}), repeats=3)

    events = check_resume_at_every_step(make, steps=20)
    expected = [v for e in range(3) for v in epoch_order(e) if v != "b"]
    assert values(events) == expected
    # the map's index counts its inputs across epochs: it is not reset by a new epoch
    assert [event[1]["index"] for event in events if event is not END] == list(range(len(expected)))


def test_a_map_over_a_source_without_epochs_starts_over_too() -> None:
    node = RepeatNode(MapNode(ConcatNode([ListSource(VALUES)]), lambda item, index: item), repeats=2)
    assert values(run(node, 3 * len(VALUES))) == VALUES * 2


@pytest.mark.parametrize("repeats", [-1, float("inf"), "2", True])
def test_invalid_repeats(repeats: object) -> None:
    with pytest.raises(ConfigError, match="repeats"):
        RepeatNode(ListSource(VALUES), repeats)  # type: ignore[arg-type]


def test_fractional_repeats_need_the_worker_length() -> None:
    with pytest.raises(ConfigError, match="worker_samples"):
        RepeatNode(ListSource(VALUES), 1.5)


@pytest.mark.parametrize(("repeats", "expected_items"), [(0.5, 2), (1.5, 6), (2.75, 11), (0.2, 0), (2.0, 8)])
def test_fractional_repeats_end_with_a_partial_epoch(repeats: float, expected_items: int) -> None:
    """Energon's rule: the last, partial epoch yields floor(worker_samples * fraction) items."""
    node = RepeatNode(ListSource(VALUES), repeats, worker_samples=len(VALUES))
    got = values(run(node, 20))
    full = [v for e in range(int(repeats)) for v in epoch_order(e)]
    assert len(got) == expected_items
    assert got[: len(full)] == full
    assert got[len(full) :] == epoch_order(int(repeats))[: expected_items - len(full)]


def test_start_epoch_runs_another_pass_on_new_source_epochs() -> None:
    node = RepeatNode(ListSource(VALUES), 1.5, worker_samples=len(VALUES))
    first = values(run(node, 7))
    node.start_epoch(1)
    second = values(run(node, 7))
    assert first == epoch_order(0) + epoch_order(1)[:2]
    assert second == epoch_order(2) + epoch_order(3)[:2]  # the source's epochs keep counting


@pytest.mark.parametrize("repeats", [0.5, 1.5, 2.75])
def test_resume_fractional_at_every_step(repeats: float) -> None:
    check_resume_at_every_step(lambda: RepeatNode(ListSource(VALUES), repeats, worker_samples=len(VALUES)), steps=14)


def test_reset_none_starts_at_epoch_zero() -> None:
    node = RepeatNode(ListSource(VALUES))
    run(node, 9)
    node.reset(None)
    assert values(run(node, 4)) == epoch_order(0)


@pytest.mark.parametrize("repeats", [None, 2])
def test_resume_at_every_step(repeats: int | None) -> None:
    check_resume_at_every_step(lambda: RepeatNode(ListSource(VALUES), repeats), steps=14)


def test_start_epoch_on_a_chain_that_cannot_names_the_stage_that_stops_it() -> None:
    chain = MapNode(ConcatNode([ListSource(VALUES)]), lambda item, index: item)
    with pytest.raises(ConfigError, match="Map stage cannot start a new epoch") as raised:
        chain.start_epoch(1)
    assert "Map <- Concat" in str(raised.value)


def test_the_carried_flag_in_a_saved_state_is_checked() -> None:
    """``carried`` (a pass carried in by an elastic restore) is a bool, and only a repeat of a
    fixed number of epochs has one."""
    counted = RepeatNode(ListSource(VALUES), repeats=2)
    state = counted.get_state()
    with pytest.raises(StateError, match="true or false"):
        RepeatNode(ListSource(VALUES), repeats=2).reset({**state, "carried": "yes"})
    with pytest.raises(StateError, match="no carried pass"):
        RepeatNode(ListSource(VALUES)).reset({**state, "carried": True})
