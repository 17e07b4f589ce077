from __future__ import annotations

import pytest
from resume import END, ListSource, check_resume_at_every_step, run

from megatron_energon_lite.errors import (
    ConfigError,
    FatalSampleError,
    SkipSample,
    StateError,
)
from megatron_energon_lite.pipeline.batch import BatchNode
from megatron_energon_lite.pipeline.guard import SampleGuard
from megatron_energon_lite.pipeline.map import MapNode
from megatron_energon_lite.pipeline.node import get_restore_key

VALUES = list(range(10, 21))  # 11 items


def collate(items: list, index: int) -> dict:
    return {"values": [item["value"] for item in items], "index": index}


def explode(item: dict, index: int):
    for j in range(item["value"] % 3):
        yield {"__key__": f"{item['__key__']}/{j}", "value": (item["value"], j)}


@pytest.mark.parametrize("batch_size", [1, 3, 4, 11, 12])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batches_in_order_with_partial_last_batch(batch_size: int, drop_last: bool) -> None:
    node = BatchNode(ListSource(VALUES), batch_size, collate, drop_last=drop_last)
    chunks = [VALUES[i : i + batch_size] for i in range(0, len(VALUES), batch_size)]
    if drop_last and len(chunks[-1]) < batch_size:
        chunks.pop()
    events = run(node, len(chunks) + 2)
    assert [event[1]["values"] for event in events[: len(chunks)]] == chunks
    assert [event[1]["index"] for event in events[: len(chunks)]] == list(range(len(chunks)))
    assert events[len(chunks) :] == [END, END]


def test_restore_key_lists_the_members() -> None:
    batch = BatchNode(ListSource(VALUES), 3, collate).next()
    assert get_restore_key(batch) == ("Batch", 0, ("List", 0), ("List", 1), ("List", 2))


def test_a_dict_batch_without_a_restore_key_gets_none_added() -> None:
    """Energon only updates a dict's __restore_key__ where it has one: model(**batch) must work."""

    def model(values, index):
        return sum(values) + index

    node = BatchNode(ListSource(VALUES), 3, collate)
    batch = node.next()
    assert "__restore_key__" not in batch and set(batch) == {"values", "index"}
    assert isinstance(batch, dict) and model(**batch) == 33
    assert batch.__restore_key__ == ("Batch", 0, ("List", 0), ("List", 1), ("List", 2))
    rebuilt = BatchNode(ListSource(VALUES), 3, collate).restore(batch.__restore_key__)
    assert rebuilt == batch and "__restore_key__" not in rebuilt
    # A dict that has the key keeps it, updated in place (Energon's behaviour).
    keyed = BatchNode(ListSource(VALUES), 3, lambda items, i: {"__restore_key__": (), "n": len(items)}).next()
    assert keyed["__restore_key__"] == ("Batch", 0, ("List", 0), ("List", 1), ("List", 2))
    check_resume_at_every_step(lambda: BatchNode(ListSource(VALUES), 3, collate), steps=6)


def test_failing_batcher_drops_the_whole_batch() -> None:
    handled = []

    def fussy(items: list, index: int) -> dict:
        if index == 1:
            raise ValueError("bad batch")
        if index == 2:
            raise SkipSample()
        return collate(items, index)

    node = BatchNode(ListSource(VALUES), 2, fussy, guard=SampleGuard(lambda e, s, src: handled.append([i["__key__"] for i in s])))
    events = run(node, 5)
    assert [event[1]["values"] for event in events[:4]] == [[10, 11], [16, 17], [18, 19], [20]]
    assert [event[0][1] for event in events[:4]] == [0, 3, 4, 5]
    assert handled == [["k2", "k3"]]


def test_batcher_tolerance_names_member_keys() -> None:
    guard = SampleGuard(lambda *a: None, tolerance=2, stage="batch")
    node = BatchNode(ListSource(VALUES), 2, lambda items, index: 1 / 0, guard=guard)
    with pytest.raises(FatalSampleError) as info:
        node.next()
    assert all(f"'k{i}'" in str(info.value) for i in range(4))


@pytest.mark.parametrize("batch_size", [0, -1, 2.0, True])
def test_invalid_batch_size(batch_size: object) -> None:
    with pytest.raises(ConfigError, match="batch_size"):
        BatchNode(ListSource(VALUES), batch_size, collate)  # type: ignore[arg-type]


@pytest.mark.parametrize("drop_last", [False, True])
def test_resume_at_every_step(drop_last: bool) -> None:
    check_resume_at_every_step(lambda: BatchNode(ListSource(VALUES), 4, collate, drop_last=drop_last), steps=10)


def test_resume_over_a_generator_map() -> None:
    """Batches end in the middle of a generator's outputs: the Map state must replay it."""

    def make() -> BatchNode:
        return BatchNode(MapNode(ListSource(VALUES), explode), 3, collate)

    events = check_resume_at_every_step(make, steps=20)
    members = [key for event in events if event is not END for key in event[0][2:]]
    assert members == [("Map", i, j, "List", i) for i, v in enumerate(VALUES) for j in range(v % 3)]


def test_restore_checks_the_key() -> None:
    with pytest.raises(StateError, match="Batch"):
        BatchNode(ListSource(VALUES), 3, collate).restore(("Map", 0, ("List", 0)))
