"""Loader states of version 1 (megatron-energon-lite 0.1, before the Pass stage) restore into this
version and continue exactly as 0.1 did; this version saves version 2.

``data/v1_states.json`` holds states and the batches 0.1 read around them, written by 0.1 itself
(``data/make_v1_states.py`` says how); the same helpers run here against this version.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
from pathlib import Path

import pytest

from megatron_energon_lite import (
    DefaultTaskEncoder,
    StateError,
    WorkerConfig,
    energon_mode,
    get_savable_loader,
    get_val_dataset,
)
from megatron_energon_lite.loader.rank_state import STATE_VERSION

DATA = Path(__file__).parent.parent / "data"
_spec = importlib.util.spec_from_file_location("make_v1_states", DATA / "make_v1_states.py")
v1 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(v1)
FIXTURE = json.loads((DATA / "v1_states.json").read_text())
FIXTURE_ROOT = "/tmp/v1_data"  # where 0.1 made the dataset (its path is in the saved config)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return v1.make_dataset(tmp_path_factory.mktemp("v1") / "text")


@pytest.mark.parametrize("name", sorted(FIXTURE["scenarios"]))
def test_a_version_1_state_resumes_as_0_1_did(dataset: Path, name: str) -> None:
    case = FIXTURE["scenarios"][name]

    def loader():
        return v1.make_loader(dataset, case["train"], case["options"], case["workers"])

    # Iteration order is unchanged: this version reads what 0.1 read, before and after the save.
    uninterrupted = loader()
    before, it = v1.read(uninterrupted, case["passes"], case["batches"], case["loop_ended"])
    assert before == case["before"]
    assert uninterrupted.save_state_rank()["version"] == STATE_VERSION
    assert v1.continuation(uninterrupted, it) == case["after"]

    restored = loader()
    state = json.loads(json.dumps(case["state"]).replace(FIXTURE_ROOT, str(dataset)))
    assert state["config"] == restored.config()  # the configuration fingerprint did not change
    restored.restore_state_rank(state)
    assert v1.continuation(restored, None) == case["after"]


def test_a_version_2_state_resumes_exactly_after_a_pass_ended(dataset: Path) -> None:
    """Saved after the loop ended (pass_ended), restored: the next pass, as the uninterrupted run."""
    make = lambda: v1.make_loader(dataset, False, {}, 2)  # noqa: E731
    loader = make()
    list(loader)
    state = loader.save_state_rank()
    assert state["version"] == STATE_VERSION and state["pass_ended"] is True
    assert all(worker["stage"] == "Pass" for worker in state["worker_states"])
    expected = v1.continuation(loader, None)
    restored = make()
    restored.restore_state_rank(json.loads(json.dumps(state)))
    assert v1.continuation(restored, None) == expected


def test_an_unknown_state_version_is_refused(dataset: Path) -> None:
    loader = v1.make_loader(dataset, False, {}, 0)
    state = loader.save_state_rank()
    with pytest.raises(StateError, match="version 1 or 2 or 3") as raised:
        loader.restore_state_rank({**state, "version": 4})
    assert "found: version 4" in str(raised.value)


class SameText(DefaultTaskEncoder):
    def encode_sample(self, sample):
        return sample


class UpperText(DefaultTaskEncoder):
    def encode_sample(self, sample):
        return dataclasses.replace(sample, text=sample.text.upper())


def test_another_task_encoder_is_refused_unless_running_as_energon(dataset: Path, caplog: pytest.LogCaptureFixture) -> None:
    def loader(encoder):
        config = WorkerConfig(rank=0, world_size=1, num_workers=0)
        return get_savable_loader(get_val_dataset(dataset, split_part="train", batch_size=3, worker_config=config, task_encoder=encoder))

    saving = loader(SameText())
    it = iter(saving)
    next(it)
    state = saving.save_state_rank()
    expected = [list(batch.__key__) for batch in it]
    with pytest.raises(StateError, match="task_encoder: saved 'SameText', now 'UpperText'"):
        loader(UpperText()).restore_state_rank(state)
    energon_mode.enable()
    try:
        restored = loader(UpperText())
        with caplog.at_level(logging.WARNING):
            restored.restore_state_rank(state)
        batches = list(restored)
    finally:
        energon_mode.disable()
    assert "restoring a state saved with another task_encoder" in caplog.text
    assert [list(batch.__key__) for batch in batches] == expected
    assert all(text == text.upper() for batch in batches for text in batch.text)


def test_as_energon_restores_into_a_smaller_micro_batch_size_only(dataset: Path) -> None:
    """Energon 7.4.1: a smaller micro batch size that divides the saved one resumes where the state
    stood; a larger one (or one that does not divide it) is refused.  The plain import refuses both."""

    def loader(batch_size: int):
        config = WorkerConfig(rank=0, world_size=1, num_workers=0)
        return get_savable_loader(get_val_dataset(dataset, split_part="train", batch_size=batch_size, worker_config=config))

    saving = loader(8)
    it = iter(saving)
    next(it)
    state = saving.save_state_rank()
    rest = [key for batch in it for key in batch.__key__]
    with pytest.raises(StateError, match="batch_size: saved 8, now 4"):
        loader(4).restore_state_rank(state)
    energon_mode.enable()
    try:
        smaller = loader(4)
        smaller.restore_state_rank(state)
        batches = list(smaller)
        with pytest.raises(StateError, match="Resuming with larger micro batch size is not allowed: 16 > 8"):
            loader(16).restore_state_rank(state)
        with pytest.raises(StateError, match="multiple of the new one: 3 < 8"):
            loader(3).restore_state_rank(state)
    finally:
        energon_mode.disable()
    assert all(len(batch.__key__) <= 4 for batch in batches)
    assert [key for batch in batches for key in batch.__key__] == rest
