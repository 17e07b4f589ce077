from collections import Counter

from resume import ListSource, check_resume_at_every_step

from megatron_energon_lite.pipeline.repeat import RepeatNode
from megatron_energon_lite.pipeline.shuffle import ShuffleBufferNode


def test_shuffles_and_keeps_every_item() -> None:
    out = [item["value"] for item in ShuffleBufferNode(ListSource(list(range(50))), 8, seed=3)]
    assert Counter(out) == Counter(range(50)) and out != list(range(50))
    # An item cannot come out before the buffer pulled it: at most 7 places early with 8 slots.
    assert all(position >= value - 7 for position, value in enumerate(out))


def test_seed_changes_the_order() -> None:
    a = [item["value"] for item in ShuffleBufferNode(ListSource(list(range(30))), 10, seed=1)]
    b = [item["value"] for item in ShuffleBufferNode(ListSource(list(range(30))), 10, seed=2)]
    assert a != b


def test_state_holds_keys_not_samples_and_resumes_at_every_step() -> None:
    node = ShuffleBufferNode(ListSource(list(range(20))), 5, seed=4)
    next(node)
    state = node.get_state()
    assert len(state["buffer"]) == 4 and all(key[0] == "List" for key in state["buffer"])
    check_resume_at_every_step(lambda: ShuffleBufferNode(RepeatNode(ListSource(list(range(12)))), 5, seed=7), steps=40)
