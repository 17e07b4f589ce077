from __future__ import annotations

import pytest
from resume import END, ListSource, check_resume_at_every_step, list_item, run

from megatron_energon_lite.errors import FatalSampleError, SkipSample, StateError
from megatron_energon_lite.pipeline.guard import SampleGuard
from megatron_energon_lite.pipeline.map import MapNode
from megatron_energon_lite.pipeline.node import as_key, key_to_json
from megatron_energon_lite.pipeline.passes import PassNode

VALUES = [3, 0, 2, 5, 1, 0, 4]


def scale(item: dict, index: int) -> dict:
    return {**item, "value": item["value"] * 10, "index": index}


def repeat_value(item: dict, index: int):
    """Yields ``value`` outputs (0..n) per input."""
    for j in range(item["value"]):
        yield {"__key__": f"{item['__key__']}/{j}", "value": (item["value"], j), "index": index}


def silent_guard(**kwargs) -> SampleGuard:
    return SampleGuard(lambda exc, item, sources: None, **kwargs)


def values_of(events: list) -> list:
    return [event[1]["value"] for event in events if event is not END]


def test_plain_map_outputs_keys_and_index() -> None:
    events = run(MapNode(ListSource(VALUES), scale), len(VALUES) + 1)
    expected = []
    for i, v in enumerate(VALUES):
        key = ("Map", i, "List", i)
        expected.append((key, {"__key__": f"k{i}", "__restore_key__": key, "value": 10 * v, "index": i}))
    assert events == expected + [END]


def test_generator_map_yields_zero_to_n_outputs_per_input() -> None:
    events = run(MapNode(ListSource(VALUES), repeat_value), sum(VALUES) + 1)
    expected_keys = [("Map", i, j, "List", i) for i, v in enumerate(VALUES) for j in range(v)]
    assert [event[0] for event in events[:-1]] == expected_keys
    assert values_of(events) == [(v, j) for v in VALUES for j in range(v)]
    assert [event[1]["index"] for event in events[:-1]] == [key[1] for key in expected_keys]
    assert events[-1] is END


def test_skip_sample_drops_the_item_and_the_index_keeps_counting() -> None:
    def skip_zero(item: dict, index: int) -> dict:
        if item["value"] == 0:
            raise SkipSample()
        return scale(item, index)

    handled = []
    node = MapNode(ListSource(VALUES), skip_zero, guard=SampleGuard(lambda *a: handled.append(a), tolerance=1))
    events = run(node, len(VALUES))
    kept = [i for i, v in enumerate(VALUES) if v != 0]
    assert [event[0] for event in events[: len(kept)]] == [("Map", i, "List", i) for i in kept]
    assert [event[1]["index"] for event in events[: len(kept)]] == kept
    assert handled == []  # a skip is not a failure, even with tolerance 1


def test_failures_are_handled_and_dropped() -> None:
    handled = []

    def fail_on_zero(item: dict, index: int) -> dict:
        if item["value"] == 0:
            raise ValueError(f"zero at {item['__key__']}")
        return scale(item, index)

    node = MapNode(ListSource(VALUES), fail_on_zero, guard=SampleGuard(lambda e, s, src: handled.append((str(e), s["__key__"]))))
    assert values_of(run(node, len(VALUES))) == [10 * v for v in VALUES if v]
    assert handled == [(f"zero at k{i}", f"k{i}") for i, v in enumerate(VALUES) if v == 0]


def test_tolerance_reached_names_the_failing_keys() -> None:
    def fail_from_two(item: dict, index: int) -> dict:
        if index >= 2:
            raise RuntimeError("decoder exploded")
        return item

    node = MapNode(ListSource(list(range(10))), fail_from_two, guard=silent_guard(tolerance=4, stage="encode_sample"))
    assert len(run(node, 2)) == 2
    with pytest.raises(FatalSampleError) as info:
        node.next()
    message = str(info.value)
    assert "encode_sample" in message and "decoder exploded" in message
    assert all(f"'k{i}'" in message for i in range(2, 6)) and "'k6'" not in message
    assert node.get_state()["index"] == 6


def test_failure_counter_survives_a_restore() -> None:
    # values: item 0 fails, item 1 passes, items 2 and 3 fail: each pass ends with 2 failures in a
    # row, and the next pass starts with a third one.
    def fail_on_odd(item: dict, index: int) -> dict:
        if item["value"] % 2:
            raise ValueError("odd")
        return item

    def make() -> MapNode:
        return MapNode(PassNode(ListSource([1, 2, 3, 5]), 4, restart=True), fail_on_odd, guard=silent_guard(tolerance=3))

    node = make()
    assert run(node, 2) == [(("Map", 1, "List", 1), {**list_item([1, 2, 3, 5], 1), "__restore_key__": ("Map", 1, "List", 1)}), END]
    state = node.get_state()
    assert state["failures"] == 2
    with pytest.raises(FatalSampleError):
        node.next()
    restored = make()
    restored.reset(state)
    with pytest.raises(FatalSampleError):
        restored.next()
    control = make()  # the same state without the counter does not stop: the counter matters
    control.reset({**state, "failures": 0})
    assert control.next()["value"] == 2


def test_generator_that_fails_midway_keeps_its_earlier_outputs() -> None:
    handled = []

    def two_then_fail(item: dict, index: int):
        yield {"value": (index, 0)}
        yield {"value": (index, 1)}
        if index == 1:
            raise ValueError("third output broken")
        yield {"value": (index, 2)}

    node = MapNode(ListSource([0, 0, 0]), two_then_fail, guard=SampleGuard(lambda *a: handled.append(a)))
    assert values_of(run(node, 10)) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1), (2, 2)]
    assert len(handled) == 1 and handled[0][1]["__key__"] == "k1"


def test_generator_that_always_fails_reaches_the_tolerance() -> None:
    def broken(item: dict, index: int):
        raise ValueError("no outputs")
        yield item  # pragma: no cover

    node = MapNode(ListSource(list(range(10))), broken, guard=silent_guard(tolerance=5))
    with pytest.raises(FatalSampleError, match="5 samples in a row"):
        node.next()


def test_hook_leaking_stop_iteration_is_fatal() -> None:
    def leaky(item: dict, index: int) -> dict:
        return next(iter([]))

    with pytest.raises(FatalSampleError, match="StopIteration"):
        MapNode(ListSource([1]), leaky).next()


@pytest.mark.parametrize("fn", [scale, repeat_value], ids=["plain", "generator"])
def test_resume_at_every_step(fn) -> None:
    check_resume_at_every_step(lambda: MapNode(ListSource(VALUES), fn), steps=30)


def test_resume_at_every_step_with_skips_and_failures() -> None:
    def messy(item: dict, index: int):
        if item["value"] == 0:
            raise SkipSample()
        if item["value"] == 2:
            raise ValueError("two")
        yield from repeat_value(item, index)

    check_resume_at_every_step(lambda: MapNode(ListSource(VALUES), messy, guard=silent_guard()), steps=30)


def test_stacked_generator_maps_resume() -> None:
    def halves(item: dict, index: int):
        yield {"value": (item["value"], "a"), "index": index}
        yield {"value": (item["value"], "b"), "index": index}

    def make() -> MapNode:
        return MapNode(MapNode(ListSource(VALUES), repeat_value, tag="Inner"), halves, tag="Outer")

    events = check_resume_at_every_step(make, steps=50)
    assert events[0][0] == ("Outer", 0, 0, "Inner", 0, 0, "List", 0)


def test_state_mid_generator_records_the_input() -> None:
    node = MapNode(ListSource(VALUES), repeat_value)
    node.next()
    state = node.get_state()
    assert (state["index"], state["emitted"], state["input_key"]) == (1, 1, ["List", 0])
    for _ in range(2):
        node.next()
    state = node.get_state()
    assert (state["index"], state["emitted"], state["input_key"]) == (1, 3, ["List", 0])
    node.next()  # input 1 has value 0: no outputs, the next output is the first of input 2
    state = node.get_state()
    assert (state["index"], state["emitted"], state["input_key"]) == (3, 1, ["List", 2])


def test_nondeterministic_generator_cannot_resume() -> None:
    calls = []

    def shrinking(item: dict, index: int):
        calls.append(index)
        yield from range(3 if len(calls) == 1 else 1)

    node = MapNode(ListSource([0]), shrinking)
    node.next(), node.next()
    state = node.get_state()
    with pytest.raises(StateError, match="deterministic"):
        MapNode(ListSource([0]), shrinking).reset(state)


def test_restore_checks_the_key() -> None:
    node = MapNode(ListSource(VALUES), scale)
    with pytest.raises(StateError, match="Map"):
        node.restore(("Batch", 0, "List", 0))
    with pytest.raises(StateError):
        node.restore(("Map", 0, 1, "List", 0))  # a sub-index, but fn is not a generator
    with pytest.raises(StateError, match="ended before output 9"):
        MapNode(ListSource(VALUES), repeat_value).restore(("Map", 0, 9, "List", 0))


def test_tag_names_state_and_keys() -> None:
    node = MapNode(ListSource(VALUES), scale, tag="Encode")
    assert node.next()["__restore_key__"] == ("Encode", 0, "List", 0)
    assert node.get_state()["stage"] == "Encode"
    with pytest.raises(StateError, match="Encode"):
        node.reset(MapNode(ListSource(VALUES), scale).get_state())


def test_key_json_round_trip() -> None:
    key = ("Batch", 1, ("Map", 0, "List", 0), ("Map", 1, 2, "List", 1))
    assert as_key(key_to_json(key)) == key
    assert key_to_json(key) == ["Batch", 1, ["Map", 0, "List", 0], ["Map", 1, 2, "List", 1]]
