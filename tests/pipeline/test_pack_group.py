from __future__ import annotations

import pytest
from resume import END, ListSource, check_resume_at_every_step, run

from megatron_energon_lite.errors import ConfigError
from megatron_energon_lite.pipeline.group import GroupBatchNode
from megatron_energon_lite.pipeline.pack import PackNode
from megatron_energon_lite.pipeline.repeat import RepeatNode

WORDS = ["a", "bb", "ccc", "dddd", "e", "ff", "ggggg", "h", "iii", "jj", "k"]


def first_fit(items: list, index: int, budget: int = 6) -> list[list]:
    """Greedy first-fit by value length: a deterministic selection like users write."""
    groups: list[list] = []
    for item in items:
        for group in groups:
            if sum(len(m["value"]) for m in group) + len(item["value"]) <= budget:
                group.append(item)
                break
        else:
            groups.append([item])
    return groups


def join(members: list, index: int) -> dict:
    return {"value": "|".join(m["value"] for m in members), "index": index}


def values(events: list) -> list:
    return [e[1]["value"] for e in events if e is not END]


def test_every_item_lands_in_exactly_one_pack() -> None:
    node = PackNode(ListSource(WORDS), 4, first_fit, join)
    packs = values(run(node, 12))
    assert sorted(v for p in packs for v in p.split("|")) == sorted(WORDS)
    assert all(sum(len(v) for v in p.split("|")) <= 6 for p in packs)


@pytest.mark.parametrize("buffer_size", [1, 3, 5, 20])
def test_pack_resume_at_every_step(buffer_size: int) -> None:
    check_resume_at_every_step(lambda: PackNode(RepeatNode(ListSource(WORDS)), buffer_size, first_fit, join), steps=30)


def test_generator_packs_and_postencode_resume_at_every_step() -> None:
    def split_pack(members, index):
        for member in members:  # one output per member: a generator pack
            yield {"value": member["value"].upper(), "index": index}

    def post(member, index):
        return {**member, "value": member["value"] + "!"}

    events = check_resume_at_every_step(lambda: PackNode(RepeatNode(ListSource(WORDS)), 4, first_fit, split_pack, postencode=post), steps=30)
    assert values(events)[:4] == ["A!", "BB!", "CCC!", "DDDD!"]
    assert events[1][0][:3] == ("Pack", 0, 1)  # sub-index of a generator output


def test_selection_that_repeats_items_or_invents_them_names_them() -> None:
    with pytest.raises(ConfigError, match="more than one pack"):
        run(PackNode(ListSource(WORDS), 4, lambda items, i: [items, items[:1]], join), 1)
    with pytest.raises(ConfigError, match="not in the buffer"):
        run(PackNode(ListSource(WORDS), 4, lambda items, i: [[dict(items[0])]], join), 1)


def pop_sorted(items: list, index: int, budget: int = 6) -> list[list]:
    """Energon's documented PackingCaptioningTaskEncoder pattern: sort the argument, pop from it."""
    items.sort(key=lambda m: len(m["value"]))
    groups = []
    while items:
        group, used = [], 0
        while items and used + len(items[0]["value"]) <= budget:
            used += len(items[0]["value"])
            group.append(items.pop(0))
        if not group:  # longer than the budget alone
            group.append(items.pop(0))
        groups.append(group)
    return groups


def test_a_selection_that_sorts_and_pops_its_argument_works() -> None:
    packs = values(run(PackNode(ListSource(WORDS), 4, pop_sorted, join), 12))
    assert sorted(v for p in packs for v in p.split("|")) == sorted(WORDS)
    assert packs[0] == "a|bb|ccc"  # the first buffer (a, bb, ccc, dddd) sorted by length
    check_resume_at_every_step(lambda: PackNode(RepeatNode(ListSource(WORDS)), 4, pop_sorted, join), steps=30)


def every_other(items: list, index: int) -> list[list]:
    """Leaves out every second sample of the buffer (Energon drops such samples)."""
    return [[item] for item in items[::2]]


def test_left_out_samples_are_dropped_with_a_counting_warning(caplog) -> None:
    caplog.set_level("DEBUG", logger="megatron_energon_lite.pipeline.pack")
    node = PackNode(ListSource(WORDS), 4, every_other, join)
    events = run(node, 7)
    assert values(events) == ["a", "ccc", "e", "ggggg", "iii", "k"] and events[-1] == END
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    # Buffers leave out 2, 2 and 1 samples: running counts 2, 4, 5 -> warned at 2 and 4 (powers of two).
    assert len(warnings) == 2 and "left 2 of 4 samples" in warnings[0] and "2 dropped so far" in warnings[0]
    assert "4 dropped so far" in warnings[1] and "'k1'" in warnings[0]
    assert node.get_state()["left_out"] == 5
    caplog.clear()
    quiet = PackNode(ListSource(WORDS), 4, every_other, join, allow_drop=True)
    assert values(run(quiet, 6)) == ["a", "ccc", "e", "ggggg", "iii", "k"]
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_left_out_counts_resume_exactly() -> None:
    check_resume_at_every_step(lambda: PackNode(RepeatNode(ListSource(WORDS)), 4, every_other, join), steps=30)
    node = PackNode(ListSource(WORDS), 4, every_other, join)
    run(node, 3)  # inside the second buffer: 2 left out before it
    state = node.get_state()
    assert state["open"] and state["left_out"] == 2
    fresh = PackNode(ListSource(WORDS), 4, every_other, join)
    fresh.reset(state)
    assert fresh.get_state() == state
    run(fresh, 10)
    assert fresh.get_state()["left_out"] == 5
    old = {k: v for k, v in state.items() if k != "left_out"}  # a state written before the count existed
    fresh.reset(old)
    assert fresh.get_state()["left_out"] == 0  # counted from 0 before this buffer


def by_length(item, index):
    return len(item["value"]), None


def as_list(items, index):
    return {"value": [m["value"] for m in items], "index": index}


def test_groups_hold_one_length_and_flush_at_the_end() -> None:
    node = GroupBatchNode(ListSource(WORDS), by_length, as_list, batch_size=2)
    batches = values(run(node, 10))
    assert sorted(v for b in batches for v in b) == sorted(WORDS)
    assert all(len({len(v) for v in b}) == 1 for b in batches)
    # Full buckets leave as soon as they fill; the rest flush oldest bucket first.
    assert batches == [["a", "e"], ["bb", "ff"], ["ccc", "iii"], ["h", "k"], ["dddd"], ["ggggg"], ["jj"]]
    dropped = values(run(GroupBatchNode(ListSource(WORDS), by_length, as_list, batch_size=2, drop_last=True), 10))
    assert all(len(b) == 2 for b in dropped)


def test_per_group_batch_sizes_and_a_bounded_buffer() -> None:
    node = GroupBatchNode(ListSource(WORDS), lambda item, i: (len(item["value"]) % 3, 1 + len(item["value"]) % 3), as_list, batch_size=None)
    batches = values(run(node, 12))
    assert all(len(b) <= 1 + len(b[0]) % 3 for b in batches)
    bounded = GroupBatchNode(ListSource(WORDS * 3), lambda item, i: (item["value"], 10), as_list, batch_size=None, max_buffered=5)
    emitted = 0
    for event in run(bounded, 40):
        if event is END:
            break
        emitted += len(event[1]["value"])
        assert sum(len(b[2]) for b in bounded.get_state()["buckets"]) <= 5
    assert emitted == 33


@pytest.mark.parametrize("max_buffered", [None, 4])
def test_group_resume_at_every_step(max_buffered) -> None:
    check_resume_at_every_step(lambda: GroupBatchNode(RepeatNode(ListSource(WORDS)), by_length, as_list, batch_size=2, max_buffered=max_buffered), steps=30)


@pytest.mark.parametrize(
    ("criterion", "message"),
    [
        (lambda item, i: ({"x": 1}, 2), "cannot be saved"),
        (lambda item, i: (object(), 2), "cannot be saved"),
        (lambda item, i: ("k", len(item["value"])), "two batch sizes"),
        (lambda item, i: "k", r"\(group key, batch size"),
        (lambda item, i: ("k", None), "no valid batch size"),
    ],
)
def test_bad_group_criteria(criterion, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        run(GroupBatchNode(ListSource(WORDS), criterion, as_list, batch_size=None), 5)
