"""The shared resume check must catch broken stages (else every other test could pass vacuously)."""

from __future__ import annotations

import pytest
from resume import END, ListSource, check_resume_at_every_step, run


class ForgetfulSource(ListSource):
    """Forgets its position in the state: resuming restarts the list."""

    def get_state(self) -> dict:
        return {"stage": self.tag, "epoch": self.epoch, "position": 0}


class TupleStateSource(ListSource):
    def get_state(self) -> dict:
        return {**super().get_state(), "cursor": (self.position,)}


class AliasingSource(ListSource):
    """Returns the same dict every time and mutates it later."""

    def __init__(self, values: list) -> None:
        super().__init__(values)
        self._state: dict = {}

    def get_state(self) -> dict:
        self._state.update(super().get_state())
        return self._state


class WrongRestoreSource(ListSource):
    def restore(self, restore_key: tuple) -> dict:
        item = super().restore(restore_key)
        item["value"] = None
        return item


class NondeterministicSource(ListSource):
    runs = 0

    def __init__(self, values: list) -> None:
        NondeterministicSource.runs += 1
        super().__init__([v + NondeterministicSource.runs for v in values])


def test_list_source_resumes_and_restores() -> None:
    events = check_resume_at_every_step(lambda: ListSource([3, 1, 4]), steps=10)
    assert [e[1]["value"] for e in events if e is not END] == [3, 1, 4]
    assert events[3:] == [END, END]


@pytest.mark.parametrize(
    ("source_cls", "message"),
    [
        (ForgetfulSource, "resuming from the state after step 1"),
        (TupleStateSource, "not plain JSON"),
        (AliasingSource, "changed after it was returned"),
        (WrongRestoreSource, "rebuilt another item"),
        (NondeterministicSource, "not deterministic"),
    ],
)
def test_helper_catches_broken_stages(source_cls: type, message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        check_resume_at_every_step(lambda: source_cls([5, 6, 7]), steps=5)


def test_run_records_end_of_pass() -> None:
    assert run(ListSource([]), 2) == [END, END]
