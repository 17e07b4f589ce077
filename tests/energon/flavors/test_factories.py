"""Dataset factories (Energon's ``flavors``) and ``get_dataset_from_config``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from energon_lite_dev.synthetic import (
    generate_captioning_dataset,
    generate_jsonl,
    generate_text_dataset,
)

from megatron_energon_lite import (
    BatchDataset,
    CaptioningSample,
    CaptioningWebdataset,
    ConfigError,
    CrudeSample,
    CrudeWebdataset,
    MapDataset,
    NotSupportedError,
    StandardWebdatasetFactory,
    TextSample,
    TextWebdataset,
    WorkerConfig,
    generic_batch,
    get_loader,
    get_savable_loader,
)
from megatron_energon_lite.energon.dataset_config import get_dataset_from_config
from megatron_energon_lite.energon.flavors import BaseWebdatasetFactory
from megatron_energon_lite.format.metadata import read_info
from megatron_energon_lite.format.prepare import prepare_dataset

NO_WORKERS = WorkerConfig(rank=0, world_size=1, num_workers=0)
CAPTION_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: CaptioningSample\nfield_map:\n  image: jpg\n  caption: txt\nsubflavors:\n  from_yaml: 1\n"
CRUDE_YAML = "__module__: megatron.energon\n__class__: CrudeWebdataset\n"


@pytest.fixture(scope="module")
def captions(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("factories") / "captions"
    generate_captioning_dataset(root, num_shards=3, samples_per_shard=7, image_size=(16, 12), seed=3)
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=CAPTION_YAML)
    (root / ".nv-meta" / "crude.yaml").write_text(CRUDE_YAML)
    return root


def keys_of(dataset) -> list[str]:
    return [sample["__key__"] if isinstance(sample, CrudeSample) else sample.__key__ for sample in get_loader(dataset)]


def test_get_dataset_from_config_gives_the_factory_dataset_yaml_implies(captions: Path) -> None:
    factory = get_dataset_from_config(captions, split_part="train", training=False, worker_config=NO_WORKERS, sample_type=CaptioningSample)
    assert type(factory) is StandardWebdatasetFactory
    assert factory.__sample_type__ is CaptioningSample
    assert len(factory) == 21
    assert factory.paths[0].name == "captions"
    assert factory.subflavors == {}  # the call's own; dataset.yaml's come with each sample
    samples = list(get_loader(factory.build()))
    assert [s.__key__ for s in samples] == sorted(s.__key__ for s in samples)  # validation reads in order
    assert len({s.__key__ for s in samples}) == 21
    first = samples[0]
    assert isinstance(first, CaptioningSample) and isinstance(first.caption, str)
    assert tuple(first.image.shape) == (3, 12, 16) and first.image.dtype == torch.float32
    assert first.__subflavors__ == {"from_yaml": 1}


def test_factory_builds_compose_with_wrappers_and_restore(captions: Path) -> None:
    factory = get_dataset_from_config(captions, split_part="train", training=True, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=2))
    dataset = BatchDataset(
        MapDataset(factory.build(), lambda s: s.caption.upper(), worker_config=factory.worker_config),
        batch_size=4,
        batcher=generic_batch,
        worker_config=factory.worker_config,
    )
    reference = get_savable_loader(dataset)
    it = iter(reference)
    for _ in range(2):
        next(it)
    state = reference.save_state_rank()
    rest = [next(it) for _ in range(3)]
    resumed = get_savable_loader(dataset)
    resumed.restore_state_rank(state)
    resumed_it = iter(resumed)
    assert [next(resumed_it) for _ in range(3)] == rest


def test_crude_dataset_config_gives_crude_samples(captions: Path) -> None:
    factory = get_dataset_from_config(captions, dataset_config="crude.yaml", split_part="train", training=False, worker_config=NO_WORKERS)
    assert type(factory) is CrudeWebdataset and factory.__sample_type__ is CrudeSample
    sample = next(iter(get_loader(factory.build())))
    assert isinstance(sample, CrudeSample) and {"jpg", "txt"} <= set(sample)


def test_sample_type_mismatch_names_both_types(captions: Path) -> None:
    with pytest.raises(ConfigError, match="yields CaptioningSample, not the sample_type TextSample"):
        get_dataset_from_config(captions, split_part="train", training=False, worker_config=NO_WORKERS, sample_type=TextSample)


def test_typed_factory_refuses_a_dataset_of_another_type(captions: Path) -> None:
    assert CaptioningWebdataset(captions, split_part="train", training=False, worker_config=NO_WORKERS).__len__() == 21
    wrong = TextWebdataset(captions, split_part="train", training=False, worker_config=NO_WORKERS)
    with pytest.raises(ConfigError, match="TextWebdataset reads TextSample samples, but the dataset yields CaptioningSample"):
        len(wrong)


def test_the_base_factory_has_no_load_sample(captions: Path) -> None:
    with pytest.raises(NotSupportedError, match="does not implement load_sample"):
        BaseWebdatasetFactory(captions, split_part="train", training=False, worker_config=NO_WORKERS).load_sample({})


def test_subset_applies_to_the_factory(captions: Path) -> None:
    factory = get_dataset_from_config(captions, split_part="train", training=False, worker_config=NO_WORKERS, subset={"absolute_range": (2, 9)})
    assert len(factory) == 7
    assert len(keys_of(factory.build())) == 7


def test_prepare_dataset_programmatically_with_brace_patterns(tmp_path: Path) -> None:
    root = tmp_path / "text"
    generate_text_dataset(root, num_shards=4, samples_per_shard=5, seed=1, shard_pattern="parts/data-{}.tar")
    parts, counts = BaseWebdatasetFactory.prepare_dataset(root, ["parts/data-{0..2}.tar"], split_parts_ratio=[("train", 2), ("val", 1)], workers=1)
    assert parts == {"txt"}
    assert counts == [("parts/data-0.tar", 5), ("parts/data-1.tar", 5), ("parts/data-2.tar", 5)]
    assert list(read_info(root).shard_counts) == ["parts/data-0.tar", "parts/data-1.tar", "parts/data-2.tar"]  # data-3 not named
    split = (root / ".nv-meta" / "split.yaml").read_text()
    assert "train:" in split and "val:" in split


def test_jsonl_factory_prepares_and_reads(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    generate_jsonl(path, num_records=6, seed=2)
    from megatron_energon_lite import CrudeJsonlDatasetFactory

    assert CrudeJsonlDatasetFactory.prepare_dataset(path) == 6
    factory = get_dataset_from_config(path, training=False, worker_config=NO_WORKERS)
    assert len(factory) == 6 and factory.__sample_type__ is CrudeSample
    assert len(keys_of(factory.build())) == 6
