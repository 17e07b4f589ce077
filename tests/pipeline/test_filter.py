from __future__ import annotations

import pytest
from resume import END, ListSource, check_resume_at_every_step, list_item, run

from megatron_energon_lite.errors import FatalSampleError, SkipSample
from megatron_energon_lite.pipeline.filter import FilterNode
from megatron_energon_lite.pipeline.guard import SampleGuard

VALUES = [4, 7, 1, 8, 8, 3, 0, 6, 5]


def is_even(item: dict, index: int) -> bool:
    return item["value"] % 2 == 0


def test_keeps_matching_items_unchanged() -> None:
    events = run(FilterNode(ListSource(VALUES), is_even), len(VALUES))
    kept = [i for i, v in enumerate(VALUES) if v % 2 == 0]
    assert events[: len(kept)] == [(("List", i), list_item(VALUES, i)) for i in kept]
    assert events[len(kept)] is END


def test_predicate_gets_the_input_index() -> None:
    seen = []
    node = FilterNode(ListSource(VALUES), lambda item, index: seen.append((index, item["__key__"])) or index % 3 == 0)
    assert [event[0] for event in run(node, 4)[:3]] == [("List", 0), ("List", 3), ("List", 6)]
    assert seen == [(i, f"k{i}") for i in range(len(VALUES))]


def test_failing_or_skipping_predicate_drops_the_item() -> None:
    handled = []

    def picky(item: dict, index: int) -> bool:
        if item["value"] == 8:
            raise ValueError("eight")
        if item["value"] == 0:
            raise SkipSample()
        return True

    node = FilterNode(ListSource(VALUES), picky, guard=SampleGuard(lambda e, s, src: handled.append(s["__key__"])))
    assert [event[1]["value"] for event in run(node, len(VALUES)) if event is not END] == [v for v in VALUES if v not in (0, 8)]
    assert handled == ["k3", "k4"]


def test_tolerance() -> None:
    guard = SampleGuard(lambda *a: None, tolerance=3, stage="filter_hook")
    node = FilterNode(ListSource(VALUES), lambda item, index: 1 / 0, guard=guard)
    with pytest.raises(FatalSampleError, match="filter_hook") as info:
        node.next()
    assert "'k2'" in str(info.value) and "ZeroDivisionError" in str(info.value)


def test_resume_at_every_step() -> None:
    check_resume_at_every_step(lambda: FilterNode(ListSource(VALUES), is_even), steps=20)


def test_resume_with_a_long_filtered_run() -> None:
    values = [1] * 20 + [2, 1, 2]
    check_resume_at_every_step(lambda: FilterNode(ListSource(values), is_even), steps=10)


def test_resume_with_an_index_dependent_predicate() -> None:
    check_resume_at_every_step(lambda: FilterNode(ListSource(VALUES), lambda item, index: index % 3 != 1), steps=12)
