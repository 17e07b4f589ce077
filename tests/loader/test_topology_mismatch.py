"""A dataset built for one worker topology and read under another says which, instead of reading
some workers' shares twice or never (Energon asserts in both cases)."""

from pathlib import Path

import pytest
import torch
from energon_lite_dev.synthetic import generate_text_dataset

from megatron_energon_lite import ConfigError, WorkerConfig, get_loader, get_val_dataset
from megatron_energon_lite.format.prepare import prepare_dataset

TEXT_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("topology") / "text"
    generate_text_dataset(root, num_shards=4, samples_per_shard=6, seed=1)
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=TEXT_YAML)
    return root


def _val(path: Path, workers: int):
    return get_val_dataset(path, split_part="train", batch_size=2, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers))


def test_a_plan_for_two_workers_iterated_in_the_main_process_is_refused(dataset: Path) -> None:
    with pytest.raises(ConfigError) as raised:
        next(iter(_val(dataset, 2)))
    message = str(raised.value)
    assert "built for 2 workers per rank" in message and "worker 0's share" in message and "get_loader" in message


def test_a_plan_for_two_workers_in_a_dataloader_with_one_is_refused(dataset: Path) -> None:
    """The one worker would read worker 0's share only."""
    loader = torch.utils.data.DataLoader(_val(dataset, 2), batch_size=None, num_workers=1)
    with pytest.raises(ConfigError) as raised:
        next(iter(loader))
    message = str(raised.value)
    assert "num_workers=2" in message and "a DataLoader with 1 worker(s)" in message


def test_a_plan_for_one_process_in_a_dataloader_with_two_workers_is_refused(dataset: Path) -> None:
    """Each worker would read every sample: the epoch would come twice."""
    loader = torch.utils.data.DataLoader(_val(dataset, 0), batch_size=None, num_workers=2)
    with pytest.raises(ConfigError, match=r"a DataLoader with 2 worker\(s\)"):
        next(iter(loader))


@pytest.mark.parametrize("workers", [0, 2])
def test_the_matching_topology_reads_every_sample_once(dataset: Path, workers: int) -> None:
    keys = [key for batch in get_loader(_val(dataset, workers)) for key in batch.__key__]
    assert len(keys) == 24 and len(set(keys)) == 24
    if workers == 0:
        assert [key for batch in _val(dataset, 0) for key in batch.__key__] == keys


def test_a_training_rank_without_samples_is_an_error_naming_the_topology(dataset: Path) -> None:
    """24 samples over 32 ranks: rank 31 would stream nothing forever (Energon asserts when
    iterating; here the dataset says so when it is made)."""
    from megatron_energon_lite import EmptyDatasetError, get_train_dataset

    with pytest.raises(EmptyDatasetError, match="rank 31 of 32 gets nothing to train on") as raised:
        get_train_dataset(dataset, batch_size=1, worker_config=WorkerConfig(rank=31, world_size=32, num_workers=0))
    assert "24 samples shared by 32 rank(s) x 1 worker(s)" in str(raised.value) and "fewer ranks" in str(raised.value)
    # Validation and a rank that has samples are fine.
    assert len(get_val_dataset(dataset, split_part="train", batch_size=1, worker_config=WorkerConfig(rank=31, world_size=32, num_workers=0))) == 0
    assert len(get_train_dataset(dataset, batch_size=1, worker_config=WorkerConfig(rank=0, world_size=32, num_workers=0))) > 0
