"""Energon's metadataset API: load_dataset(...).get_datasets, traverse_metadataset, prepare_metadataset."""

from __future__ import annotations

from pathlib import Path

import pytest
from energon_lite_dev.synthetic import generate_text_dataset

from megatron_energon_lite import (
    ConfigError,
    StandardWebdatasetFactory,
    TextSample,
    WorkerConfig,
    get_loader,
    get_train_dataset,
    load_dataset,
    prepare_metadataset,
    traverse_metadataset,
)
from megatron_energon_lite.energon.epathlib import EPath
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.energon.metadataset import DatasetLoader, MetadatasetV2
from megatron_energon_lite.energon.metadataset.loader_interface import DatasetBlendMode

TEXT_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\nsubflavors:\n  yaml: true\n"
WC = WorkerConfig(rank=0, world_size=1, num_workers=0)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("loadds")
    for name, shards in (("a", 2), ("b", 3)):
        generate_text_dataset(base / name, num_shards=shards, samples_per_shard=4, max_words=5, seed=len(name) + shards, key_pattern=name + "{shard:02d}_{index:03d}")
        prepare_dataset(base / name, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=TEXT_YAML)
    (base / "blend.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
        "      - weight: 3\n        path: a\n        subflavors: {src: a}\n"
        "      - weight: 1\n        path: b\n        subflavors: {src: b}\n"
    )
    return base


def test_get_datasets_of_a_blend_gives_factories_weights_and_mode(root: Path) -> None:
    loaded = load_dataset(root / "blend.yaml")
    assert isinstance(loaded, MetadatasetV2)
    for training in (True, False):  # weights as the YAML gives them, also for validation (Energon)
        datasets = loaded.get_datasets(training=training, split_part="train", worker_config=WC)
        assert datasets.blend_mode is DatasetBlendMode.DATASET_WEIGHT
        assert [d.weight for d in datasets.datasets] == [0.75, 0.25]
        factories = [d.dataset for d in datasets.datasets]
        assert all(type(f) is StandardWebdatasetFactory and f.__sample_type__ is TextSample for f in factories)
        assert [f.paths[0].name for f in factories] == ["a", "b"]
        assert [len(f) for f in factories] == [8, 12]
        assert [f.subflavors for f in factories] == [{"yaml": True, "src": "a"}, {"yaml": True, "src": "b"}]
    keys = [s.__key__ for s in get_loader(factories[1].build())]
    assert len(keys) == 12 and all(k.startswith("b") for k in keys)


def test_load_dataset_of_a_folder(root: Path) -> None:
    loaded = load_dataset(root / "a")
    assert isinstance(loaded, DatasetLoader)
    datasets = loaded.get_datasets(training=True, split_part="train", worker_config=WC, subflavors={"extra": 1})
    assert datasets.blend_mode is DatasetBlendMode.NONE
    assert [d.dataset.subflavors for d in datasets.datasets] == [{"yaml": True, "extra": 1}]


def test_traverse_lists_leaves_with_aux_without_opening_them(root: Path) -> None:
    path = root / "aux.yaml"
    path.write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
        "      - weight: 1\n        path: missing_ds\n        subflavors: {k: 1}\n        aux:\n          labels: labels_ds\n          media: filesystem://media\n"
        "      - weight: 1\n        path: blend.yaml\n        subflavors: {outer: x}\n"
    )
    refs = traverse_metadataset(path, split_part="train")
    assert [r.path for r in refs] == [EPath(root / "missing_ds"), EPath(root / "a"), EPath(root / "b")]
    assert refs[0].aux == {"labels": EPath(root / "labels_ds"), "media": EPath(root / "media")}
    assert [r.subflavors for r in refs] == [{"k": 1}, {"src": "a", "outer": "x"}, {"src": "b", "outer": "x"}]


def test_loading_refuses_aux_on_a_dataset_that_is_not_crude(root: Path) -> None:
    path = root / "aux_existing.yaml"
    path.write_text("__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    path: a\n    aux:\n      labels: b\n")
    assert traverse_metadataset(path, split_part="train")[0].aux == {"labels": EPath(root / "b")}
    with pytest.raises(ConfigError, match=r"aux sources are read by cookers, but this dataset is not crude(.|\n)*splits.train.aux"):
        get_train_dataset(path, worker_config=WC, batch_size=1)


def test_prepare_metadataset_builds_join_indices(root: Path) -> None:
    path = root / "join.yaml"
    path.write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    join:\n"
        "      - path: a\n      - path: a\n        nonmatch: skip\n"
        "    joiner:\n      __module__: megatron.energon\n      __class__: TextSample\n"
    )
    files = prepare_metadataset(path)
    assert len(files) == 1 and Path(str(files[0])).is_file()


def _val_entries(get_val_datasets, root: Path) -> list[tuple[int, str, str, dict]]:
    entries = get_val_datasets(root / "blend.yaml", split_part="train", worker_config=WC, batch_size=4)
    return [(len(ds), type(factory).__name__, Path(str(factory.path)).name, factory.subflavors) for ds, factory in entries]


def test_get_val_datasets_gives_each_dataset_with_its_factory(root: Path) -> None:
    from megatron_energon_lite import get_val_datasets

    entries = get_val_datasets(root / "blend.yaml", split_part="train", worker_config=WC, batch_size=4)
    assert all(isinstance(factory, StandardWebdatasetFactory) for _, factory in entries)
    assert _val_entries(get_val_datasets, root) == [(2, "StandardWebdatasetFactory", "a", {"yaml": True, "src": "a"}), (3, "StandardWebdatasetFactory", "b", {"yaml": True, "src": "b"})]
    keys = [key for batch in get_loader(entries[1][0]) for key in batch.__key__]
    assert len(keys) == 12 and all(k.startswith("b") for k in keys)


@pytest.mark.energon
def test_get_val_datasets_is_energons(root: Path) -> None:
    energon = pytest.importorskip("megatron.energon")
    from megatron_energon_lite import get_val_datasets

    theirs = energon.get_val_datasets(root / "blend.yaml", split_part="train", worker_config=energon.WorkerConfig(rank=0, world_size=1, num_workers=0), batch_size=4)
    theirs = [(len(ds), type(factory).__name__, Path(str(factory.path)).name, factory.subflavors) for ds, factory in theirs]
    assert _val_entries(get_val_datasets, root) == theirs
