"""End to end: get_train_dataset / get_val_dataset / get_savable_loader on a real prepared dataset."""

from collections import Counter
from pathlib import Path

import pytest
import torch
from energon_lite_dev.prepared import PREPARED_CAPTIONING
from energon_lite_dev.resume import END, check_loader_resume

from megatron_energon_lite import (
    CaptioningSample,
    ConfigError,
    DefaultTaskEncoder,
    EmptyDatasetError,
    StateError,
    WorkerConfig,
    get_loader,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
)
from megatron_energon_lite.synthetic import prepared_text_dataset

PER_SHARD = PREPARED_CAPTIONING["samples_per_shard"]  # 9 per shard: 4 train shards, 2 val


@pytest.fixture(scope="module")
def dataset(prepared_captioning: Path) -> Path:
    """The shared prepared captioning dataset (tests/conftest.py): read-only."""
    return prepared_captioning


def _train(path: Path, workers: int, **kwargs):
    settings = dict(worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers), batch_size=4, shuffle_buffer_size=6, max_samples_per_sequence=3)
    settings.update(kwargs)
    return get_train_dataset(path, **settings)


def _keys(batch) -> list[str]:
    return list(batch.__key__)


def test_batches_are_typed_and_stacked(dataset: Path) -> None:
    loader = get_savable_loader(_train(dataset, 0))
    batch = next(iter(loader))
    assert isinstance(batch, CaptioningSample)
    assert isinstance(batch.image, torch.Tensor) and batch.image.shape == (4, 3, 6, 8)
    assert len(batch.caption) == 4 and all(isinstance(c, str) for c in batch.caption)


@pytest.mark.parametrize("workers", [0, 2])
def test_one_epoch_reads_every_sample_once(dataset: Path, workers: int) -> None:
    loader = get_loader(_train(dataset, workers, repeat=False, batch_size=None, shuffle_buffer_size=None))
    keys = [sample.__key__ for sample in loader]
    assert len(keys) == 4 * PER_SHARD and len(set(keys)) == len(keys)


@pytest.mark.parametrize("workers", [0, 2])
def test_save_and_restore_at_every_step(dataset: Path, workers: int) -> None:
    # 14 batches: more than one epoch of 36 train samples in batches of 4 per worker
    check_loader_resume(lambda: get_savable_loader(_train(dataset, workers)), 14, at=None if workers == 0 else (0, 1, 5, 9, 13))


def test_restore_twice_in_a_row(dataset: Path) -> None:
    loader = get_savable_loader(_train(dataset, 0))
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.save_state_rank()
    expected = [_keys(next(it)) for _ in range(4)]
    first = get_savable_loader(_train(dataset, 0))
    first.restore_state_rank(state)
    it2 = iter(first)
    next(it2)
    second = get_savable_loader(_train(dataset, 0))
    second.restore_state_rank(first.save_state_rank())
    assert [_keys(b) for _, b in zip(range(3), second)] == expected[1:]


def test_state_is_plain_json(dataset: Path) -> None:
    import json

    loader = get_savable_loader(_train(dataset, 0))
    next(iter(loader))
    state = loader.save_state_rank()
    assert json.loads(json.dumps(state)) == json.loads(json.dumps(state, sort_keys=True))


def test_restore_into_another_config_names_both_values(dataset: Path) -> None:
    loader = get_savable_loader(_train(dataset, 0))
    next(iter(loader))
    state = loader.save_state_rank()
    other = get_savable_loader(_train(dataset, 0, batch_size=8))
    with pytest.raises(StateError, match=r"batch_size: saved 4, now 8"):
        other.restore_state_rank(state)
    with pytest.raises(StateError, match="version"):
        other.restore_state_rank({"version": 999})


@pytest.mark.parametrize("workers", [0, 2])
def test_val_is_sequential_and_complete(dataset: Path, workers: int) -> None:
    ds = get_val_dataset(dataset, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers), batch_size=4)
    loader = get_loader(ds)
    first = [k for b in loader for k in _keys(b)]
    second = [k for b in loader for k in _keys(b)]
    assert first == second and len(first) == 2 * PER_SHARD == len(set(first))
    assert len(loader) == sum(1 for _ in loader)


def test_val_limit_repeats_the_same_batches(dataset: Path) -> None:
    ds = get_val_dataset(dataset, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), batch_size=2, limit=3)
    loader = get_loader(ds)
    first = [_keys(b) for b in loader]
    assert len(first) == 3 and [_keys(b) for b in loader] == first


def test_virtual_epochs(dataset: Path) -> None:
    loader = get_loader(_train(dataset, 0, virtual_epoch_length=5))
    assert len(loader) == 5
    passes = [[_keys(b) for b in loader] for _ in range(3)]
    assert [len(p) for p in passes] == [5, 5, 5]
    continuous = get_loader(_train(dataset, 0))
    assert sum(passes, []) == [_keys(b) for _, b in zip(range(15), continuous)]


def test_ranks_are_disjoint(dataset: Path) -> None:
    seen = []
    for rank in range(2):
        ds = get_train_dataset(dataset, worker_config=WorkerConfig(rank=rank, world_size=2, num_workers=0), batch_size=None, shuffle_buffer_size=None, max_samples_per_sequence=None, repeat=False)
        seen.append({s.__key__ for s in get_loader(ds)})
    assert not seen[0] & seen[1] and len(seen[0] | seen[1]) == 4 * PER_SHARD


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(batch_size=0), ConfigError, "batch_size"),
        (dict(max_samples_per_sequence=0), ConfigError, "max_samples_per_sequence"),
        (dict(split_part="nope"), ConfigError, "'nope' does not exist"),
        (dict(split_part="test"), EmptyDatasetError, "no samples"),
        (dict(unknown_option=1), ConfigError, "unknown_option"),
    ],
)
def test_bad_arguments(dataset: Path, kwargs, error, message) -> None:
    with pytest.raises(error, match=message):
        _train(dataset, 0, **kwargs)


def test_a_hook_that_always_fails_stops_with_the_keys(dataset: Path) -> None:
    from megatron_energon_lite import FatalSampleError, stateless

    class Broken(DefaultTaskEncoder):
        __default_failure_tolerance__ = 5

        @stateless
        def encode_sample(self, sample):
            raise ValueError("always")

    loader = get_loader(_train(dataset, 0, task_encoder=Broken(), batch_size=None))
    with pytest.raises(FatalSampleError, match="encode_sample") as info:
        next(iter(loader))
    assert "restore key" in str(info.value)


@pytest.mark.parametrize("workers", [0, 2])
def test_restore_at_the_end_of_a_virtual_epoch(dataset: Path, workers: int) -> None:
    """Two passes of 4 batches, each ending (END); resumed also from just before and just after the first end."""
    stream = check_loader_resume(lambda: get_savable_loader(_train(dataset, workers, virtual_epoch_length=4)), 10, at=None if workers == 0 else (3, 4, 5, 7))
    assert [k for k, event in enumerate(stream) if event == END] == [4, 9]


def test_unpicklable_batch_is_a_clear_error_not_a_hang(dataset: Path) -> None:
    import threading

    from megatron_energon_lite import DatasetError, stateless

    class Unpicklable(DefaultTaskEncoder):
        @stateless
        def encode_sample(self, sample):
            sample.caption = threading.Lock()
            return sample

    loader = get_loader(_train(dataset, 1, task_encoder=Unpicklable(), batch_size=None))
    with pytest.raises(DatasetError, match="cannot be pickled") as info:
        next(iter(loader))
    assert "__key__" in str(info.value)


def test_a_dying_worker_raises_in_the_main_process(dataset: Path) -> None:
    import os

    from megatron_energon_lite import stateless

    class Dies(DefaultTaskEncoder):
        @stateless
        def encode_sample(self, sample):
            os._exit(3)

    loader = get_loader(_train(dataset, 1, task_encoder=Dies(), batch_size=None))
    with pytest.raises(RuntimeError, match="worker"):
        next(iter(loader))


def test_restore_sample_rebuilds_a_batch(dataset: Path) -> None:
    loader = get_savable_loader(_train(dataset, 0))
    it = iter(loader)
    next(it)
    batch = next(it)
    again = loader.restore_sample(batch.__restore_key__)
    assert list(again.__key__) == list(batch.__key__) and torch.equal(again.image, batch.image)


def test_restore_sample_from_the_second_worker(dataset: Path) -> None:
    loader = get_savable_loader(_train(dataset, 2))
    batches = [b for _, b in zip(range(4), loader)]
    assert [b.__restore_key__[:2] for b in batches] == [("Worker", 0), ("Worker", 1), ("Worker", 0), ("Worker", 1)]
    again = loader.restore_sample(batches[3].__restore_key__)
    assert list(again.__key__) == list(batches[3].__key__) and torch.equal(again.image, batches[3].image)


def test_a_hook_returning_none_stops_with_a_clear_error(dataset: Path) -> None:
    from megatron_energon_lite import stateless

    class ForgotReturn(DefaultTaskEncoder):
        @stateless
        def encode_sample(self, sample):
            sample.caption = sample.caption.upper()

    loader = get_loader(_train(dataset, 0, task_encoder=ForgotReturn()))
    with pytest.raises(ConfigError, match="encode_sample returned None"):
        next(iter(loader))


def test_state_from_another_world_size_is_refused(dataset: Path) -> None:
    loader = get_savable_loader(_train(dataset, 0))
    next(iter(loader))
    state = loader.save_state_rank()
    other = get_savable_loader(_train(dataset, 0, worker_config=WorkerConfig(rank=0, world_size=2, num_workers=0)))
    with pytest.raises(StateError, match=r"worker_config.world_size: saved 1, now 2"):
        other.restore_state_rank(state)


def test_energon_loader_arguments_are_accepted_unknown_ones_refused(dataset: Path) -> None:
    get_savable_loader(_train(dataset, 0), checkpoint_every_sec=30, n_checkpoints=4, gc_collect_every_n_steps=10)
    with pytest.raises(ConfigError, match="checkpoint_evry_sec"):
        get_savable_loader(_train(dataset, 0), checkpoint_evry_sec=30)


def test_get_val_datasets_has_one_entry_per_dataset(dataset: Path) -> None:
    from megatron_energon_lite.loader import get_val_datasets  # the core's: a plain description

    entries = get_val_datasets(dataset, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), batch_size=4)
    assert len(entries) == 1
    ds, description = entries[0]
    assert (description["path"], description["split_part"], description["subflavors"]) == (str(dataset), "val", {})
    assert len(ds) == -(-2 * PER_SHARD // 4)


@pytest.mark.parametrize("workers", [0, 2])
def test_hooks_see_unique_sample_and_batch_indices(dataset: Path, workers: int) -> None:
    from megatron_energon_lite import stateless

    class Indexed(DefaultTaskEncoder):
        @stateless
        def encode_sample(self, sample):
            sample.caption = self.current_sample_index
            return sample

        @stateless
        def encode_batch(self, batch):
            batch.__subflavors__ = [self.current_batch_index]
            return batch

    loader = get_loader(_train(dataset, workers, task_encoder=Indexed()))
    batches = [b for _, b in zip(range(8), loader)]
    sample_indices = [int(i) for b in batches for i in b.caption]
    assert len(set(sample_indices)) == len(sample_indices) == 32
    assert sorted(b.__subflavors__[0] for b in batches) == list(range(8))


class DictBatches(DefaultTaskEncoder):
    """encode_batch returns a plain dict of two tensors, for model(**batch) (NeMo's data modules)."""

    def encode_batch(self, batch):
        return {"images": batch.image, "lengths": torch.tensor([len(caption) for caption in batch.caption])}


@pytest.mark.parametrize("workers", [0, 2])
def test_a_dict_batch_is_handed_out_as_the_plain_dict_the_hook_returned(dataset: Path, workers: int) -> None:
    from torch.utils import _pytree

    loader = get_savable_loader(_train(dataset, workers, task_encoder=DictBatches()))
    it = iter(loader)
    batches, keys = [], []
    for _ in range(3):
        batches.append(next(it))
        keys.append(loader.last_restore_key)
    for batch in batches:
        assert type(batch) is dict and "__restore_key__" not in batch and not hasattr(batch, "__restore_key__")
        leaves, _ = _pytree.tree_flatten(batch)  # a container of two tensors, not one opaque leaf
        assert len(leaves) == 2 and all(isinstance(leaf, torch.Tensor) for leaf in leaves)
    # Restoring by key still works: the loader remembers the key of what it handed out.
    assert len(set(keys)) == 3
    for batch, key in zip(batches, keys):
        rebuilt = loader.restore_sample(key)
        assert type(rebuilt) is dict and torch.equal(rebuilt["images"], batch["images"]) and torch.equal(rebuilt["lengths"], batch["lengths"])


def test_iterating_the_dataset_itself_gives_plain_dicts_too(dataset: Path) -> None:
    """Without get_loader (a plain torch DataLoader over the dataset, or a for loop)."""
    batch = next(iter(_train(dataset, 0, task_encoder=DictBatches())))
    assert type(batch) is dict and set(batch) == {"images", "lengths"}


@pytest.mark.filterwarnings("ignore:This DataLoader will create 6 worker processes:UserWarning")
def test_a_worker_with_fewer_samples_than_a_batch_is_warned_about(tmp_path: Path, caplog) -> None:
    """4 samples on 6 workers, batch 4: four workers read one sample each, so each of their
    batches is that sample 4 times (a training stream repeats, as Energon's does): said once."""
    root = prepared_text_dataset(tmp_path / "tiny", num_shards=1, samples_per_shard=4, key_pattern="k{index}")
    with caplog.at_level("WARNING"):
        dataset = get_train_dataset(root, batch_size=4, shuffle_buffer_size=None, max_samples_per_sequence=None, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=6))
    warned = [r.getMessage() for r in caplog.records if "fewer than batch_size 4" in r.getMessage()]
    assert len(warned) == 1 and "worker 0 reads 1" in warned[0] and "num_workers=6" in warned[0]
    batch = next(iter(get_loader(dataset)))
    assert len(set(batch.__key__)) < len(batch.__key__)  # what the warning is about
    caplog.clear()
    with caplog.at_level("WARNING"):
        get_train_dataset(root, batch_size=4, shuffle_buffer_size=None, max_samples_per_sequence=None, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=1))
    assert "fewer than batch_size" not in caplog.text
