"""Our loader against Energon 7.4.1 on the same prepared dataset: validation order, len(), and
which samples each rank and worker reads in a training epoch."""

from __future__ import annotations

from pathlib import Path

import pytest

energon = pytest.importorskip("megatron.energon")

from energon_lite_dev.synthetic import write_tar  # noqa: E402

import megatron_energon_lite as lite  # noqa: E402
from megatron_energon_lite.format.prepare import prepare_dataset  # noqa: E402

pytestmark = [
    pytest.mark.energon,
    pytest.mark.filterwarnings("ignore:.*pin_memory.*:UserWarning"),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),  # 4 workers on 2 cores
]

SHARD_SIZES = [2, 2, 3, 4, 10, 10, 10, 10, 4]  # Energon's documented example, 55 samples


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("loader_compat") / "text"
    index = 0
    for shard, size in enumerate(SHARD_SIZES):
        samples = []
        for _ in range(size):
            samples.append((f"{index:04d}", {"txt": f"sample {index}".encode()}))
            index += 1
        write_tar(root / f"parts/data-{shard}.tar", samples)
    prepare_dataset(root, split_parts=[("train", "parts/.*"), ("val", "parts/.*")], progress=False, num_workers=1)
    (root / ".nv-meta/dataset.yaml").write_text("sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n")
    return root


def _val_keys(module, root: Path, *, rank: int, world_size: int, workers: int, batch_size: int):
    config = module.WorkerConfig(rank=rank, world_size=world_size, num_workers=workers)
    ds = module.get_val_dataset(root, worker_config=config, batch_size=batch_size)
    loader = module.get_loader(ds)
    return len(loader), [list(batch.__key__) for batch in loader]


@pytest.mark.parametrize(
    ("world_size", "workers", "batch_size"),
    [(1, 0, 4), (1, 2, 1), (1, 2, 4), (2, 2, 4), (1, 4, 11), (3, 0, 5), (2, 3, 2)],
)
def test_val_batches_equal_energons(dataset: Path, world_size: int, workers: int, batch_size: int) -> None:
    for rank in range(world_size):
        ours = _val_keys(lite, dataset, rank=rank, world_size=world_size, workers=workers, batch_size=batch_size)
        theirs = _val_keys(energon, dataset, rank=rank, world_size=world_size, workers=workers, batch_size=batch_size)
        assert ours == theirs, f"rank {rank}"


@pytest.mark.parametrize(("world_size", "workers", "msps"), [(1, 2, None), (2, 2, 3), (3, 0, 4)])
def test_train_epoch_reads_the_same_samples_per_rank(dataset: Path, world_size: int, workers: int, msps) -> None:
    """The shuffled order differs (other random draws), the set of samples per rank must not."""
    for rank in range(world_size):
        sets, lengths = [], []
        for module in (lite, energon):
            config = module.WorkerConfig(rank=rank, world_size=world_size, num_workers=workers)
            ds = module.get_train_dataset(dataset, worker_config=config, batch_size=1, shuffle_buffer_size=None, max_samples_per_sequence=msps, repeat=False)
            sets.append(sorted(key for batch in module.get_loader(ds) for key in batch.__key__))
            lengths.append(len(ds))
        assert sets[0] == sets[1], f"rank {rank}"
        assert lengths[0] == lengths[1], f"rank {rank}"


@pytest.mark.parametrize(("world_size", "workers", "batch_size", "drop_last", "virtual"), [(1, 2, 4, False, 0), (2, 3, 5, True, 0), (2, 2, 4, False, 7)])
def test_train_len_equals_energons(dataset: Path, world_size, workers, batch_size, drop_last, virtual) -> None:
    for rank in range(world_size):
        lengths = []
        for module in (lite, energon):
            config = module.WorkerConfig(rank=rank, world_size=world_size, num_workers=workers)
            ds = module.get_train_dataset(dataset, worker_config=config, batch_size=batch_size, batch_drop_last=drop_last, shuffle_buffer_size=10, max_samples_per_sequence=4, virtual_epoch_length=virtual)
            lengths.append(len(ds))
        assert lengths[0] == lengths[1], f"rank {rank}"
