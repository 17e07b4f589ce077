"""A state restored into a dataset that changed since the save (a shard added and prepare run
again, a shard rewritten with another count): the restore must say what changed, at
restore_state_* time, instead of repeating and losing samples silently (26 repeated, 25 lost)."""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import pytest
from energon_lite_dev.synthetic import write_tar

from megatron_energon_lite import StateError, WorkerConfig, get_savable_loader, get_train_dataset
from megatron_energon_lite.format.prepare import prepare_dataset

TEXT_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"


def shard(root: Path, name: str, first: int, count: int) -> None:
    write_tar(root / f"parts/{name}.tar", [(f"{i:05d}", {"txt": str(i).encode()}) for i in range(first, first + count)])


def prepare(root: Path) -> None:
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=TEXT_YAML, force_overwrite=True)


def loader(root: Path, workers: int = 2, world_size: int = 1):
    config = WorkerConfig(rank=0, world_size=world_size, num_workers=workers)
    return get_savable_loader(get_train_dataset(root, worker_config=config, batch_size=4, shuffle_buffer_size=8, max_samples_per_sequence=4))


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, dict]:
    root = tmp_path / "ds"
    for k in range(4):
        shard(root, f"data-{k}", 100 * k, 25)
    prepare(root)
    running = loader(root)
    for _, _batch in zip(range(5), running):
        pass
    return root, running.save_state_rank()


def test_an_unchanged_dataset_restores(saved) -> None:
    root, state = saved
    loader(root).restore_state_rank(state)


def test_a_shard_added_and_prepared_again_is_named_at_restore(saved) -> None:
    root, state = saved
    shard(root, "data-4", 400, 25)
    prepare(root)
    with pytest.raises(StateError, match=r"(?s)data changed since the state was saved.*shard parts/data-4\.tar added \(25 samples\).*4 shards, 100 samples.*now 5 shards, 125 samples"):
        loader(root).restore_state_rank(state)


def test_a_resized_and_a_removed_shard_are_named(saved) -> None:
    root, state = saved
    shard(root, "data-1", 100, 20)
    (root / "parts/data-3.tar").unlink()
    prepare(root)
    with pytest.raises(StateError) as info:
        loader(root).restore_state_rank(state)
    message = str(info.value)
    assert "shard parts/data-1.tar resized: 25 -> 20 samples" in message and "shard parts/data-3.tar removed (25 samples)" in message, message


def test_restore_state_global_on_another_topology_checks_too(saved) -> None:
    root, state = saved
    shard(root, "data-4", 400, 25)
    prepare(root)
    with pytest.raises(StateError, match=r"(?s)rank 0's state.*shard parts/data-4\.tar added"):
        loader(root, workers=1).restore_state_global([state])


def test_a_state_of_an_older_version_restores_with_a_note(saved, caplog: pytest.LogCaptureFixture) -> None:
    root, state = saved
    old = copy.deepcopy(state)
    old.pop("data")
    old["version"] = 2
    with caplog.at_level(logging.WARNING, logger="megatron_energon_lite.loader"):
        loader(root).restore_state_rank(old)
    assert "did not record its data (state version 2)" in caplog.text and "cannot be checked" in caplog.text


def test_a_tampered_data_record_is_refused(saved) -> None:
    root, state = saved
    bad = {**state, "data": "x"}
    with pytest.raises(StateError, match=r"\$\.data"):
        loader(root).restore_state_rank(bad)
