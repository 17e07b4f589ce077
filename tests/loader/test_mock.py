"""Mock data (``mock=True`` / ``mock: true``): the real first batch of each worker, again and again,
with no reads after it; the real length, passes and save/restore (megatron_energon_lite/loader/mock.py)."""

from __future__ import annotations

import dataclasses
import itertools
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from energon_lite_dev.synthetic import generate_captioning_dataset

from megatron_energon_lite import (
    ConfigError,
    DefaultTaskEncoder,
    EmptyDatasetError,
    StateError,
    WorkerConfig,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
)
from megatron_energon_lite.energon.wrappers import MapDataset
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.loader.mock import MockDataset
from megatron_energon_lite.storage import LocalFilePool

pytestmark = [pytest.mark.filterwarnings("ignore:.*pin_memory.*:UserWarning")]

CAPTION_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: CaptioningSample\nfield_map:\n  image: jpg\n  caption: txt\n"
HEADER = "__module__: megatron.energon\n__class__: MetadatasetV2\n"


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """30 image-caption samples in 3 shards, split 20 train / 10 val."""
    root = tmp_path_factory.mktemp("mock") / "images"
    generate_captioning_dataset(root, num_shards=3, samples_per_shard=10, image_size=(20, 12))
    prepare_dataset(root, split_ratio=(2, 1, 0), progress=False, num_workers=1, dataset_yaml=CAPTION_YAML)
    return root


def config(workers: int) -> WorkerConfig:
    return WorkerConfig(rank=0, world_size=1, num_workers=workers)


def train(path, workers: int = 0, **kwargs):
    settings = dict(worker_config=config(workers), batch_size=4, shuffle_buffer_size=None, max_samples_per_sequence=None)
    return get_train_dataset(path, **{**settings, **kwargs})


def fields(batch) -> dict:
    """A batch's fields: a dict's items or a dataclass's fields."""
    if isinstance(batch, dict):
        return dict(batch)
    return {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}


def assert_same_batch(mock, real) -> None:
    """Same type, keys, shapes, dtypes and values (and the same sample keys)."""
    assert type(mock) is type(real)
    mine, theirs = fields(mock), fields(real)
    assert mine.keys() == theirs.keys()
    for name, value in theirs.items():
        if name == "__restore_key__":
            continue
        if isinstance(value, torch.Tensor):
            assert isinstance(mine[name], torch.Tensor), name
            assert mine[name].shape == value.shape and mine[name].dtype == value.dtype, name
            assert torch.equal(mine[name], value), name
        else:
            assert mine[name] == value, name


def first_batches(dataset, workers: int) -> dict[int, object]:
    """The real first batch of each worker, by logical worker id."""
    loader = get_savable_loader(dataset)
    found: dict[int, object] = {}
    for batch in loader:
        found.setdefault(loader.last_worker_id, batch)
        if len(found) == max(workers, 1):
            return found
    raise AssertionError("a worker yielded nothing")


class DictEncoder(DefaultTaskEncoder):
    """Batches as plain dicts with a numpy array (converted to a tensor by the loader)."""

    def encode_batch(self, batch):
        return {"image": batch.image, "lengths": np.array([len(c) for c in batch.caption], dtype=np.int32), "keys": list(batch.__key__)}


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("encoder", [None, DictEncoder], ids=["samples", "dicts"])
def test_mock_batches_are_the_real_first_batch(images: Path, workers: int, encoder) -> None:
    te = {} if encoder is None else {"task_encoder": encoder()}
    real = first_batches(train(images, workers, **te), workers)
    mock = train(images, workers, mock=True, **te)
    assert isinstance(mock, MockDataset)
    loader = get_savable_loader(mock)
    seen = {w: 0 for w in real}
    for i, batch in enumerate(loader):
        assert_same_batch(batch, real[loader.last_worker_id])
        seen[loader.last_worker_id] += 1
        if i == 40:
            break
    assert all(n > 15 for n in seen.values()), seen
    if encoder is not None:
        assert batch["lengths"].dtype == torch.int32  # converted as the loader converts real batches


class Reads:
    """Counts LocalFilePool.read calls, also in forked workers (one byte per call, appended to a file)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
        self.path = path
        path.write_bytes(b"")
        original = LocalFilePool.read

        def read(pool, *args, **kwargs):
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
            try:
                os.write(fd, b".")
            finally:
                os.close(fd)
            return original(pool, *args, **kwargs)

        monkeypatch.setattr(LocalFilePool, "read", read)

    def __int__(self) -> int:
        return self.path.stat().st_size


@pytest.mark.parametrize("workers", [0, 2])
def test_no_reads_after_the_first_batch(images: Path, workers: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    reads = Reads(monkeypatch, tmp_path / "reads")
    real = iter(get_savable_loader(train(images, workers)))
    for _ in range(max(workers, 1)):
        next(real)
    before = int(reads)
    for _ in range(6):
        next(real)
    assert int(reads) > before  # the counter sees the real loader read (in the workers too)
    del real

    reads.path.write_bytes(b"")
    loader = get_savable_loader(train(images, workers, mock=True))
    stream = iter(loader)
    for _ in range(max(workers, 1)):  # each worker's first batch: real reads
        next(stream)
    first = int(reads)
    assert first > 0
    for _ in range(60):
        next(stream)
    assert int(reads) == first


def test_iterates_on_after_the_shards_are_gone(images: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(images, copy)
    loader = get_savable_loader(train(copy, 0, mock=True))
    stream = iter(loader)
    first = next(stream)
    shutil.rmtree(copy / "shards")
    for _ in range(20):
        assert_same_batch(next(stream), first)


def test_length_and_passes_are_the_real_ones(images: Path) -> None:
    for workers in (0, 2):
        real = get_val_dataset(images, worker_config=config(workers), batch_size=3)
        mock = get_val_dataset(images, worker_config=config(workers), batch_size=3, mock=True)
        assert len(mock) == len(real) == 4  # 10 val samples in batches of 3
        real_loader, mock_loader = get_savable_loader(real), get_savable_loader(mock)
        for _ in range(2):  # two passes, each ends where the real one does
            order = [real_loader.last_worker_id for _ in real_loader]
            assert [mock_loader.last_worker_id for _ in mock_loader] == order
            assert len(order) == 4
    assert len(train(images, 0, mock=True)) == len(train(images, 0)) == 5


def test_same_object_or_copies(images: Path) -> None:
    stream = iter(get_savable_loader(train(images, 2, mock=True)))
    a, b, c = next(stream), next(stream), next(stream)
    assert a is c and a is not b  # the same object per worker (workers alternate)

    stream = iter(get_savable_loader(train(images, 2, mock="copy")))
    a, b, c = next(stream), next(stream), next(stream)
    assert a is not c
    assert_same_batch(a, c)
    a.image.zero_()  # a training loop writing into its batch does not change later ones
    _, d = next(stream), next(stream)
    assert_same_batch(d, c) and not torch.equal(d.image, a.image)


@pytest.mark.parametrize("workers", [0, 2])
def test_save_and_restore(images: Path, workers: int) -> None:
    # A pass that ends (val): the restored loader ends it where the uninterrupted one does.
    def val():
        return get_val_dataset(images, worker_config=config(workers), batch_size=2, mock=True)

    loader = get_savable_loader(val())
    order, states = [], []
    for _ in loader:
        order.append(loader.last_worker_id)
        states.append(loader.save_state_rank())
    assert len(order) == len(val()) == len(get_val_dataset(images, worker_config=config(workers), batch_size=2)) > 3
    for k in range(len(order)):
        restored = get_savable_loader(val())
        restored.restore_state_rank(states[k])
        assert [restored.last_worker_id for _ in restored] == order[k + 1 :]

    # An endless training stream: the counts go on from the saved ones.
    loader = get_savable_loader(train(images, workers, mock=True))
    stream = iter(loader)
    first = next(stream)
    for _ in range(6):
        next(stream)
    state = loader.save_state_rank()
    restored = get_savable_loader(train(images, workers, mock=True))
    restored.restore_state_rank(state)
    batch = next(iter(restored))
    assert_same_batch(batch, first) if workers == 0 else None
    offsets = [s["source"]["offset"] for s in restored.save_state_rank()["worker_states"] if s is not None]
    assert sum(offsets) == 8


def test_states_of_real_and_mock_loaders_do_not_mix(images: Path) -> None:
    real = get_savable_loader(train(images, 0))
    next(iter(real))
    mock = get_savable_loader(train(images, 0, mock=True))
    with pytest.raises(StateError, match="mock"):
        mock.restore_state_rank(real.save_state_rank())

    next(iter(mock))
    state = mock.save_state_rank()
    state["worker_states"][0]["source"]["offset"] = -1
    with pytest.raises(StateError, match=r"offset"):  # checked when the pipeline is rebuilt
        restored = get_savable_loader(train(images, 0, mock=True))
        restored.restore_state_rank(state)
        next(iter(restored))
    state["worker_states"][0]["source"]["offset"] = 1
    state["worker_states"][0]["source"]["version"] = 7
    with pytest.raises(StateError, match="version"):
        restored = get_savable_loader(train(images, 0, mock=True))
        restored.restore_state_rank(state)
        next(iter(restored))


def test_mock_flag_in_the_yaml(images: Path, tmp_path: Path) -> None:
    body = f"splits:\n  train:\n    path: {images}\n  val:\n    path: {images}\n"
    (tmp_path / "mock.yaml").write_text(HEADER + "mock: true\n" + body)
    (tmp_path / "copy.yaml").write_text(HEADER + "mock: copy\n" + body)
    (tmp_path / "real.yaml").write_text(HEADER + body)
    (tmp_path / "bad.yaml").write_text(HEADER + "mock: 3\n" + body)

    real = first_batches(train(tmp_path / "real.yaml", 0), 0)[0]
    dataset = train(tmp_path / "mock.yaml", 0)
    assert isinstance(dataset, MockDataset) and dataset.mode == "same"
    stream = iter(get_savable_loader(dataset))
    for _ in range(5):
        assert_same_batch(next(stream), real)
    assert train(tmp_path / "copy.yaml", 0).mode == "copy"
    assert isinstance(get_val_dataset(tmp_path / "mock.yaml", worker_config=config(0), batch_size=2), MockDataset)
    assert not isinstance(train(tmp_path / "real.yaml", 0), MockDataset)
    assert not isinstance(train(tmp_path / "mock.yaml", 0, mock=False), MockDataset)  # the argument wins
    assert isinstance(train(tmp_path / "real.yaml", 0, mock=True), MockDataset)
    with pytest.raises(ConfigError, match=r"bad.yaml: mock"):
        train(tmp_path / "bad.yaml", 0)


def test_bad_input(images: Path) -> None:
    with pytest.raises(ConfigError, match="invalid mock"):
        train(images, 0, mock="yes")
    with pytest.raises(EmptyDatasetError) as info:
        get_val_dataset(images, worker_config=config(0), batch_size=2, mock=True, subset={"range": (0.0, 0.0)})
    assert "mock data needs one real item" in str(info.value) and str(images) in str(info.value)
    with pytest.raises(EmptyDatasetError, match=str(images)):
        train(images, 0, mock=True, subset={"range": (0.0, 0.0)})


def _same(sample):
    return sample


class ComposedEncoder(DefaultTaskEncoder):
    """A composition of its own (one more map after encode_sample): its training stream is
    endless like the default one's."""

    def build_encode_sample(self, dataset, *, worker_config):
        return MapDataset(super().build_encode_sample(dataset, worker_config=worker_config), _same, worker_config=worker_config)


def test_mock_data_of_a_composed_pipeline_is_as_endless_as_the_real_stream(images: Path) -> None:
    real = get_savable_loader(train(images, 0, task_encoder=ComposedEncoder()))
    mock = get_savable_loader(train(images, 0, task_encoder=ComposedEncoder(), mock=True))
    steps = 3 * len(real)  # several of its passes, in one loop
    assert len(list(itertools.islice(real, steps))) == steps
    assert len(list(itertools.islice(mock, steps))) == steps
