"""Golden behaviour: iteration order and checkpoint shape are unchanged by refactors; regenerate
only for a deliberate, announced change: python tests/data/make_golden_pipeline.py

``data/golden_pipeline.json`` records, for each configuration of ``golden_pipeline.CONFIGS``
(plain text with a shuffle buffer, a two-dataset blend in exact and in random mode, text
packing, length grouping, and a val dataset through ``get_loader``) with 0 and 2 workers: the
first 12 batches (keys, restore key, content digest), the states saved after steps 0, 3 and 8,
and the 4 batches a fresh loader restored from the step-3 state reads. This test makes the same
data in tmp_path and checks that today's code does exactly that.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from golden_pipeline import (
    CONFIGS,
    GOLDEN,
    RESTORE_FROM,
    RESTORE_STEPS,
    WORKERS,
    data_digests,
    make_data,
    run_config,
)

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

RECORD = json.loads(GOLDEN.read_text())
REGENERATE = "python tests/data/make_golden_pipeline.py (only for a deliberate, announced change)"


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return make_data(tmp_path_factory.mktemp("golden"))


def test_the_synthetic_data_is_the_recorded_data(data: Path) -> None:
    """If this fails, the data generator changed (energon_lite_dev.synthetic or make_data), not
    the loader: the other failures then say nothing about the loader."""
    assert data_digests(data) == RECORD["data"]


def test_every_configuration_is_recorded() -> None:
    assert sorted(RECORD["configs"]) == sorted(f"{name}/{workers}" for name in CONFIGS for workers in WORKERS), REGENERATE


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_batches_and_states_are_the_recorded_ones(data: Path, name: str, workers: int) -> None:
    want = RECORD["configs"][f"{name}/{workers}"]
    got = run_config(name, workers, data)
    for step, (got_batch, want_batch) in enumerate(zip(got["batches"], want["batches"])):
        assert got_batch == want_batch, f"batch {step} changed; {REGENERATE}"
    assert len(got["batches"]) == len(want["batches"])
    assert sorted(got["states"]) == sorted(want["states"])
    for step, state in want["states"].items():
        assert got["states"][step] == state, f"the state saved after step {step} changed; {REGENERATE}"
    restored = got[f"restored_from_{RESTORE_FROM}"]
    assert restored == want["batches"][RESTORE_FROM + 1 : RESTORE_FROM + 1 + RESTORE_STEPS], "a restored loader does not continue where it was saved"
    assert restored == want[f"restored_from_{RESTORE_FROM}"]
    assert got == want
