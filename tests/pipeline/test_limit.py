from __future__ import annotations

import pytest
from resume import END, ListSource, check_resume_at_every_step, run

from megatron_energon_lite.errors import ConfigError
from megatron_energon_lite.pipeline.limit import LimitNode
from megatron_energon_lite.pipeline.repeat import RepeatNode

VALUES = list(range(100, 109))  # 9 items


def passes(events: list) -> list[list]:
    result: list[list] = [[]]
    for event in events:
        if event is END:
            result.append([])
        else:
            result[-1].append(event[0])
    return result


@pytest.mark.parametrize("length", [1, 4, 9])
def test_every_pass_yields_the_same_first_items(length: int) -> None:
    events = run(LimitNode(ListSource(VALUES), length), 3 * (length + 1))
    assert passes(events)[:3] == [[("List", i) for i in range(length)]] * 3


def test_source_shorter_than_the_limit() -> None:
    events = run(LimitNode(ListSource(VALUES), 20), 2 * (len(VALUES) + 1))
    assert passes(events)[:2] == [[("List", i) for i in range(len(VALUES))]] * 2


def test_without_reset_the_next_pass_continues() -> None:
    node = LimitNode(ListSource(VALUES), 4, reset_after_epoch=False)
    assert passes(run(node, 12)) == [[("List", i) for i in range(4)], [("List", i) for i in range(4, 8)], [("List", 8)], []]


def test_zero_limit() -> None:
    assert run(LimitNode(ListSource(VALUES), 0), 2) == [END, END]


@pytest.mark.parametrize("length", [-3, 1.0, None])
def test_invalid_length(length: object) -> None:
    with pytest.raises(ConfigError, match="limit"):
        LimitNode(ListSource(VALUES), length)  # type: ignore[arg-type]


@pytest.mark.parametrize("reset_after_epoch", [True, False])
def test_resume_at_every_step(reset_after_epoch: bool) -> None:
    check_resume_at_every_step(lambda: LimitNode(ListSource(VALUES), 4, reset_after_epoch), steps=16)


def test_resume_over_a_repeating_source() -> None:
    check_resume_at_every_step(lambda: LimitNode(RepeatNode(ListSource(VALUES)), 12), steps=30)
