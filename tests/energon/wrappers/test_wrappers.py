"""Energon's dataset wrappers and build_* overrides: composed pipelines iterate and resume exactly."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from energon_lite_dev.resume import batch_identity, check_loader_resume
from energon_lite_dev.synthetic import generate_captioning_dataset

from megatron_energon_lite import DefaultTaskEncoder, WorkerConfig, generic_batch, get_loader, get_savable_loader, get_train_dataset, get_val_dataset
from megatron_energon_lite.errors import ConfigError
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.energon.wrappers import (
    BatchDataset,
    BlendDataset,
    FilterDataset,
    IterMapDataset,
    LimitDataset,
    MapDataset,
    MixBatchDataset,
    RepeatDataset,
    ShuffleBufferDataset,
)

NUM_SHARDS, PER_SHARD = 4, 6  # 24 samples: 16 train, 8 val


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("wrappers") / "captions"
    generate_captioning_dataset(root, num_shards=NUM_SHARDS, samples_per_shard=PER_SHARD, image_size=(8, 6), seed=5)
    prepare_dataset(root, split_ratio=(2, 1, 0), progress=False, num_workers=1)
    (root / ".nv-meta/dataset.yaml").write_text(
        "sample_type:\n  __module__: megatron.energon\n  __class__: CaptioningSample\nfield_map:\n  image: jpg\n  caption: txt\n"
    )
    return root


def wc(workers: int = 0) -> WorkerConfig:
    return WorkerConfig(rank=0, world_size=1, num_workers=workers)


def keys(item) -> list[str]:
    key = item.__key__
    return list(key) if isinstance(key, list) else [key]


def val(path: Path, workers: int = 0, **kwargs):
    return get_val_dataset(path, split_part="val", worker_config=wc(workers), batch_size=None, **kwargs)


def test_map_and_batch_over_a_val_dataset(dataset: Path) -> None:
    inner = val(dataset)
    mapped = MapDataset(inner, lambda s: s.__class__(**{**vars_of(s), "caption": s.caption.upper()}), worker_config=wc())
    batched = BatchDataset(mapped, batch_size=3, batcher=generic_batch, worker_config=wc())
    n = len(inner)
    assert n > 3 and len(mapped) == n and len(batched) == -(-n // 3)
    batches = list(get_loader(batched))
    assert [len(b.caption) for b in batches] == [3] * (n // 3) + ([n % 3] if n % 3 else [])
    assert all(c == c.upper() for b in batches for c in b.caption)
    assert sorted(k for b in batches for k in keys(b)) == sorted(k for s in get_loader(inner) for k in keys(s))


def vars_of(sample) -> dict:
    import dataclasses

    return {f.name: getattr(sample, f.name) for f in dataclasses.fields(sample) if f.init}


def test_limit_of_repeat_as_megatron_lm_composes_val(dataset: Path) -> None:
    # examples/multimodal/dataloader_provider.py: LimitDataset(RepeatDataset(val_ds), length=..., reset_after_epoch=True)
    n = len(val(dataset))
    ds = LimitDataset(RepeatDataset(val(dataset), worker_config=wc()), length=n + 3, reset_after_epoch=True, worker_config=wc())
    loader = get_loader(ds)
    first, second = [k for s in loader for k in keys(s)], [k for s in loader for k in keys(s)]
    assert len(first) == n + 3 and first == second  # repeats past the val samples, same items each pass
    assert first[n:] == first[:3] and len(set(first[:n])) == n


def test_blend_of_two_train_datasets_follows_the_weights(dataset: Path) -> None:
    def train(batch_size: int):
        return get_train_dataset(dataset, batch_size=batch_size, worker_config=wc(), shuffle_buffer_size=None, max_samples_per_sequence=None)

    loader = get_loader(BlendDataset((train(2), 1), (train(4), 3), worker_config=wc()))
    sizes = Counter(len(batch.caption) for _, batch in zip(range(400), loader))
    assert 60 <= sizes[2] <= 140 and 260 <= sizes[4] <= 340


def test_mix_batch_dataset_mixes_batches(dataset: Path) -> None:
    def train():
        return get_train_dataset(dataset, batch_size=1, worker_config=wc(), shuffle_buffer_size=None, max_samples_per_sequence=None)

    loader = get_loader(MixBatchDataset((train(), 1), (train(), 1), batch_size=5, worker_config=wc()))
    first = next(iter(loader))
    assert isinstance(first, list) and len(first) == 5


@pytest.mark.parametrize("workers", [0, 2])
def test_composed_pipeline_saves_and_restores_exactly(dataset: Path, workers: int) -> None:
    def make():
        inner = get_train_dataset(dataset, batch_size=None, worker_config=wc(workers), shuffle_buffer_size=None, max_samples_per_sequence=2)
        kept = FilterDataset(inner, filter_fn=lambda s: not s.__key__.endswith("3"), worker_config=wc(workers))
        shuffled = ShuffleBufferDataset(kept, 4, worker_config=wc(workers))
        return BatchDataset(shuffled, 3, generic_batch, worker_config=wc(workers))

    stream = check_loader_resume(lambda: get_savable_loader(make()), 9, at=(0, 4, 7), identity=lambda b: (batch_identity(b), keys(b)))
    assert not any(k.endswith("3") for _, b in stream for k in b)


class OwnPipeline(DefaultTaskEncoder):
    """Overrides build_train_datasets and composes the wrappers itself (with a map of its own)."""

    def build_train_datasets(self, *, datasets, worker_config, batch_size, **kwargs):
        loaded = self._load_dataset(datasets[0], 0, worker_config)
        tagged = MapDataset(RepeatDataset(loaded, worker_config=worker_config), self.tag, worker_config=worker_config)
        return BatchDataset(tagged, batch_size, self.batch, worker_config=worker_config)

    def tag(self, sample):
        sample.caption = "tagged " + sample.caption
        return sample


class OwnBatch(DefaultTaskEncoder):
    """Overrides only build_batch: the default build_train_datasets calls it."""

    def build_batch(self, dataset, *, batch_size, worker_config, **kwargs):
        return BatchDataset(dataset, batch_size + 1, generic_batch, worker_config=worker_config)


@pytest.mark.parametrize("workers", [0, 2])
def test_build_train_datasets_override_runs_and_resumes(dataset: Path, workers: int) -> None:
    def make():
        return get_train_dataset(dataset, batch_size=2, worker_config=wc(workers), shuffle_buffer_size=None, max_samples_per_sequence=None, task_encoder=OwnPipeline())

    def tagged(batch):
        assert all(c.startswith("tagged ") for c in batch.caption)  # restore_sample's batches too
        return batch_identity(batch)

    # 12 batches: past the train samples once.
    check_loader_resume(lambda: get_savable_loader(make()), 12, at=(5,), identity=tagged, restore_samples=True)


def test_build_batch_override_is_used_by_the_default_composition(dataset: Path) -> None:
    n = len(val(dataset))
    ds = get_val_dataset(dataset, split_part="val", batch_size=2, worker_config=wc(), task_encoder=OwnBatch())
    assert [len(keys(b)) for b in get_loader(ds)] == [3] * (n // 3) + ([n % 3] if n % 3 else [])


def test_build_override_returning_something_else_is_an_error(dataset: Path) -> None:
    class Broken(DefaultTaskEncoder):
        def build_val_datasets(self, **kwargs):
            return [1, 2, 3]

    with pytest.raises(ConfigError, match="build_val_datasets returned list"):
        get_val_dataset(dataset, split_part="val", batch_size=2, worker_config=wc(), task_encoder=Broken())


def test_wrappers_refuse_mixed_worker_configs_and_iter_map(dataset: Path) -> None:
    with pytest.raises(ConfigError, match="different worker configs"):
        MapDataset(val(dataset), lambda s: s, worker_config=wc(2))
    with pytest.raises(ConfigError, match="IterMapDataset is not supported"):
        IterMapDataset(val(dataset), lambda it: it, worker_config=wc())


@pytest.mark.parametrize("workers", [0, 2])
def test_val_restored_from_the_end_of_a_pass_yields_the_next_pass(dataset: Path, workers: int) -> None:
    loader = get_savable_loader(get_val_dataset(dataset, split_part="val", batch_size=2, worker_config=wc(workers)))
    full = [keys(b) for b in loader]
    state = loader.save_state_rank()
    fresh = get_savable_loader(get_val_dataset(dataset, split_part="val", batch_size=2, worker_config=wc(workers)))
    fresh.restore_state_rank(state)
    assert [keys(b) for b in fresh] == full


@pytest.mark.parametrize("workers", [0, 2])
def test_restored_right_after_the_last_item_has_nothing_left_of_that_pass(dataset: Path, workers: int) -> None:
    # As Energon: saved after the last item but before the loop ended, the restored pass is over
    # (nothing left); the next loop over the restored loader is the next pass.
    def make():
        return get_savable_loader(get_val_dataset(dataset, split_part="val", batch_size=2, worker_config=wc(workers)))

    full = [keys(b) for b in make()]
    loader = make()
    it = iter(loader)
    for _ in range(len(full)):
        next(it)
    state = loader.save_state_rank()
    assert state["pass_ended"] is False
    fresh = make()
    fresh.restore_state_rank(state)
    assert [keys(b) for b in fresh] == []
    assert [keys(b) for b in fresh] == full


def test_a_wrapper_over_a_pipeline_dataset_counts_each_workers_share(dataset: Path) -> None:
    inner = val(dataset, workers=2)
    per_worker = [inner.worker_length(w) for w in range(2)]
    assert sum(per_worker) == len(inner)
    # Each worker batches its own samples: the batch count is per worker, rounded up per worker.
    assert len(BatchDataset(inner, 4, generic_batch, worker_config=wc(2))) == sum(-(-n // 4) for n in per_worker)
    assert len(list(get_loader(BatchDataset(inner, 4, generic_batch, worker_config=wc(2))))) == sum(-(-n // 4) for n in per_worker)
