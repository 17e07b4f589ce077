"""A state restored into a dataset that changed since the save: a shard rewritten with another
count or removed must be refused, naming what changed, at restore_state_* time, instead of
repeating and losing samples silently (26 repeated, 25 lost); shards appended after the saved
ones resume exactly: the running epoch finishes on the saved shards, the new ones join from the
next epoch (loader/grown.py)."""

from __future__ import annotations

import copy
import itertools
import logging
from collections import defaultdict
from pathlib import Path

import pytest
from energon_lite_dev.synthetic import prepare_text as prepare
from energon_lite_dev.synthetic import write_text_shard as shard

from megatron_energon_lite import StateError, WorkerConfig, get_savable_loader, get_train_dataset


def loader(root: Path, workers: int = 2, world_size: int = 1, shuffle: int | None = 8, rank: int = 0):
    config = WorkerConfig(rank=rank, world_size=world_size, num_workers=workers)
    return get_savable_loader(get_train_dataset(root, worker_config=config, batch_size=4, shuffle_buffer_size=shuffle, max_samples_per_sequence=4))


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


def _first_epoch(keys: list[str]) -> int:
    """The length of the longest prefix without a repeat: one epoch of a worker's share (the
    next epoch reads the same samples again)."""
    seen: set[str] = set()
    for key in keys:
        if key in seen:
            break
        seen.add(key)
    return len(seen)


def _per_worker(run, batches: int) -> dict[int, list[str]]:
    found = defaultdict(list)
    for batch in itertools.islice(run, batches):
        found[run.last_worker_id] += batch.__key__
    return found


@pytest.mark.parametrize(("workers", "world_size"), [(0, 1), (2, 1), (1, 2)])
def test_appended_shards_resume_the_running_epoch_exactly(tmp_path: Path, caplog: pytest.LogCaptureFixture, workers: int, world_size: int) -> None:
    """Per worker, the run before the save and the run after it deliver what the uninterrupted
    run over the old shards delivers, for the whole running epoch; the new shard's samples come
    in the next epoch."""
    root = tmp_path / "ds"
    for k in range(4):
        shard(root, f"data-{k}", 100 * k, 25)
    prepare(root)
    uninterrupted = _per_worker(loader(root, workers, world_size, shuffle=None), 60)
    running = loader(root, workers, world_size, shuffle=None)
    before = _per_worker(running, 5)
    state = running.save_state_rank()
    shard(root, "data-4", 400, 25)
    prepare(root)
    restored = loader(root, workers, world_size, shuffle=None)
    with caplog.at_level(logging.INFO, logger="megatron_energon_lite.loader"):
        restored.restore_state_rank(state)
    assert "parts/data-4.tar" not in caplog.text and "1 shard(s) appended (25 samples)" in caplog.text
    after = _per_worker(restored, 60)
    for worker, keys in uninterrupted.items():
        epoch = _first_epoch(keys)
        stream = before[worker] + after[worker]
        assert stream[:epoch] == keys[:epoch], worker
        assert len(set(stream[:epoch])) == epoch
    # The next epoch reads the grown data's slices: on one rank, the new shard too (with two
    # ranks this rank's half of the grown data, which holds samples the old half did not).
    news = {worker: set(before[worker] + after[worker]) - set(keys) for worker, keys in uninterrupted.items()}
    assert any(news.values())
    if world_size == 1:
        assert any(key >= "00400" for keys in news.values() for key in keys), "the appended shard's samples never came"


def test_appended_shards_with_a_shuffle_buffer_lose_and_repeat_nothing(saved) -> None:
    """The samples waiting in the shuffle buffers are the saved shards' (re-read by key); over
    the rest of the epoch nothing of the first 100 samples is lost or repeated before all came."""
    root, state = saved
    before = [k for batch in itertools.islice(loader(root), 5) for k in batch.__key__]
    shard(root, "data-4", 400, 25)
    prepare(root)
    restored = loader(root)
    restored.restore_state_rank(state)
    after = [k for batch in itertools.islice(restored, 40) for k in batch.__key__]
    old = [k for k in before + after if k < "00400"]
    assert sorted(set(old)) == sorted(f"{i:05d}" for k in range(4) for i in range(100 * k, 100 * k + 25))


def test_a_shard_inserted_before_the_saved_ones_is_named_at_restore(saved) -> None:
    root, state = saved
    shard(root, "data-0a", 50, 25)  # sorts between data-0 and data-1: the saved shards move
    prepare(root)
    with pytest.raises(StateError, match=r"(?s)data changed since the state was saved.*shard parts/data-0a\.tar new \(25 samples\).*4 shards, 100 samples.*now 5 shards, 125 samples.*shards appended after the saved ones are fine"):
        loader(root).restore_state_rank(state)


def test_a_resized_and_a_removed_shard_are_named(saved) -> None:
    root, state = saved
    shard(root, "data-1", 100, 20)
    (root / "parts/data-3.tar").unlink()
    prepare(root)
    with pytest.raises(StateError) as info:
        loader(root).restore_state_rank(state)
    message = str(info.value)
    assert "shard parts/data-1.tar: 25 samples then, 20 now" in message and "shard parts/data-3.tar gone (25 samples)" in message, message


def test_restore_state_global_on_another_topology_checks_too(saved) -> None:
    root, state = saved
    shard(root, "data-1", 100, 20)
    prepare(root)
    with pytest.raises(StateError, match=r"(?s)rank 0's state.*shard parts/data-1\.tar: 25 samples then, 20 now"):
        loader(root, workers=1).restore_state_global([state])


def test_appended_shards_with_an_elastic_restore(saved) -> None:
    """Saved on 1 rank x 2 workers, restored on 1 rank without workers after a shard was
    appended: the rest of the running epoch (on the saved shards) comes first."""
    root, state = saved
    before = [k for batch in itertools.islice(loader(root), 5) for k in batch.__key__]
    shard(root, "data-4", 400, 25)
    prepare(root)
    restored = loader(root, workers=0)
    restored.restore_state_global([state])
    after = [k for batch in itertools.islice(restored, 60) for k in batch.__key__]
    old = [k for k in before + after if k < "00400"]
    assert sorted(set(old)) == sorted(f"{i:05d}" for k in range(4) for i in range(100 * k, 100 * k + 25))


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


def test_appended_shards_in_a_blend_keep_every_datasets_running_epoch(tmp_path: Path) -> None:
    """The slices of a blend's later datasets depend on the earlier ones' sizes (remainders
    rotate): when the first dataset grows, the second's running epoch still finishes as saved."""
    grows, stays = tmp_path / "grows", tmp_path / "stays"
    for k in range(3):
        shard(grows, f"data-{k}", 100 * k, 13)
        shard(stays, f"data-{k}", 1000 + 100 * k, 11)
    prepare(grows)
    prepare(stays)
    yaml = tmp_path / "blend.yaml"
    yaml.write_text("__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n      - {weight: 1, path: grows}\n      - {weight: 1, path: stays}\n")

    def per_source(run, batches: int) -> dict[tuple[int, bool], list[str]]:
        found = defaultdict(list)
        for batch in itertools.islice(run, batches):
            for key in batch.__key__:
                found[run.last_worker_id, key >= "01000"] += [key]
        return found

    uninterrupted = per_source(loader(yaml, 2, shuffle=None), 50)
    running = loader(yaml, 2, shuffle=None)
    before = per_source(running, 5)
    state = running.save_state_rank()
    shard(grows, "data-3", 300, 13)
    prepare(grows)
    restored = loader(yaml, 2, shuffle=None)
    restored.restore_state_rank(state)
    after = per_source(restored, 50)
    for where, keys in uninterrupted.items():
        epoch = _first_epoch(keys)
        assert (before[where] + after[where])[:epoch] == keys[:epoch], where
    assert any(key >= "00300" and key < "01000" for keys in after.values() for key in keys), "the appended shard's samples never came"
