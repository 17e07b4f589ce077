"""Tampered shuffle-buffer entries in a saved state: each must be refused at restore with a
StateError naming the entry's JSON path, never a bare IndexError / ValueError at the first draw,
and a duplicated entry must not deliver its sample twice."""

from __future__ import annotations

import copy
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from energon_lite_dev.synthetic import write_numbered_shards

from megatron_energon_lite import WorkerConfig, get_savable_loader, get_train_dataset
from megatron_energon_lite.errors import StateError
from megatron_energon_lite.format.prepare import prepare_dataset

CRUDE_TEXT = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"
SAMPLES = 24
SHUFFLE = "$.worker_states[0].source.source"  # Pass > Batch > Shuffle


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("buffer") / "ds"
    write_numbered_shards(root, shards=4, per_shard=SAMPLES // 4)
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=CRUDE_TEXT)
    return root


def _loader(root: Path):
    config = WorkerConfig(rank=0, world_size=1, num_workers=0)
    return get_savable_loader(get_train_dataset(root, worker_config=config, batch_size=2, shuffle_buffer_size=4, max_samples_per_sequence=3))


@pytest.fixture(scope="module")
def saved(dataset: Path) -> dict:
    loader = _loader(dataset)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.save_state_rank()
    shuffle = state["worker_states"][0]["source"]["source"]
    assert shuffle["stage"] == "Shuffle" and len(shuffle["buffer"]) >= 3, state
    return state


def _with_buffer(state: dict, change) -> dict:
    state = copy.deepcopy(state)
    buffer = state["worker_states"][0]["source"]["source"]["buffer"]
    change(buffer)
    return state


def _set(i: int, value: Any):
    def change(buffer: list) -> None:
        buffer[i] = value

    return change


@pytest.mark.parametrize(
    ("change", "entry"),
    [
        (_set(1, ["Webdataset", 10**6]), 1),  # past the dataset: was a bare IndexError at the draw
        (_set(2, ["Webdataset", "7"]), 2),  # a string index: was a bare ValueError
        (_set(0, ["Webdataset", -1]), 0),  # negative: was read from the end, silently
        (_set(2, ["Webdataset", 1.5]), 2),
        (_set(0, ["Blend", 0, "Webdataset", 1]), 0),  # no blend here
        (_set(1, []), 1),
    ],
)
def test_an_impossible_buffer_entry_is_refused_with_its_path(dataset: Path, saved: dict, change, entry: int) -> None:
    loader = _loader(dataset)
    loader.restore_state_rank(_with_buffer(saved, change))
    with pytest.raises(StateError, match=rf"(?s){re.escape(SHUFFLE)}\.buffer\[{entry}\].*expected: a restore key.*Webdataset"):
        for _ in zip(range(20), loader):  # a training loader never ends: bounded
            pass


def test_a_duplicated_buffer_entry_is_refused_not_delivered_twice(dataset: Path, saved: dict) -> None:
    def duplicate(buffer: list) -> None:
        buffer[1] = list(buffer[0])

    # The unchanged state delivers every key once in the rest of the epoch.
    intact = _loader(dataset)
    intact.restore_state_rank(saved)
    keys = [k for _, batch in zip(range(5), intact) for k in batch.__key__]
    assert max(Counter(keys).values()) == 1

    loader = _loader(dataset)
    loader.restore_state_rank(_with_buffer(saved, duplicate))
    with pytest.raises(StateError, match=r"(?s)\.buffer\[1\].*at most once per epoch begun \(1\).*held 2 times"):
        next(iter(loader))
