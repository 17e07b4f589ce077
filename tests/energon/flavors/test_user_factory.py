"""A user's own dataset factory class named in ``dataset.yaml`` (Megatron-Bridge's ``ChatMLWebdataset``
pattern): made with the file's keys, its ``_decoder`` and ``load_sample`` build every sample."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from energon_lite_dev.synthetic import generate_text_dataset

from megatron_energon_lite import (
    CaptioningSample,
    CaptioningWebdataset,
    ConfigError,
    CrudeSample,
    CrudeWebdataset,
    DefaultTaskEncoder,
    TextSample,
    WorkerConfig,
    get_loader,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
)
from megatron_energon_lite.energon.dataset_config import get_dataset_from_config
from megatron_energon_lite.energon.flavors.webdataset import DefaultDecoderWebdatasetFactory
from megatron_energon_lite.format.dataset_config import load_dataset_config
from megatron_energon_lite.format.prepare import prepare_dataset

NO_WORKERS = WorkerConfig(rank=0, world_size=1, num_workers=0)
TEXT_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"


def shout(raw: dict[str, Any]) -> dict[str, Any]:
    """A webdataset-style decoder: takes and returns the raw sample dict (parts as bytes)."""
    return {name: value.decode().upper() if name == "txt" else value for name, value in raw.items()}


class ShoutingText(DefaultDecoderWebdatasetFactory[TextSample]):
    """As Bridge's ChatMLWebdataset: drops the loader's decoder, sets its own ``_decoder``, and
    takes a constructor argument of its own from dataset.yaml."""

    __sample_type__ = TextSample

    def __init__(self, path: Any, *, suffix: str = "", **kwargs: Any) -> None:
        kwargs["decoder"] = None
        super().__init__(path, **kwargs)
        self.suffix = suffix
        self._decoder = shout

    def load_sample(self, raw_data: dict[str, Any]) -> TextSample:
        sample = super().load_sample(raw_data)
        sample.text += self.suffix
        return sample


class WordCount(DefaultDecoderWebdatasetFactory[TextSample]):
    """Builds the sample itself (no field_map in dataset.yaml)."""

    __sample_type__ = TextSample

    def load_sample(self, raw_data: dict[str, Any]) -> TextSample:
        return TextSample(__key__=raw_data["__key__"], __restore_key__=raw_data["__restore_key__"], text=str(len(raw_data["txt"].split())))


class TaggedCrude(CrudeWebdataset):
    """A user's subclass of CrudeWebdataset: its dataset.yaml is a crude one."""


class NotAFactory:
    pass


@pytest.fixture(scope="module")
def texts(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("user_factory") / "texts"
    generate_text_dataset(root, num_shards=2, samples_per_shard=6, min_words=3, max_words=8, seed=4)
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=TEXT_YAML)
    meta = root / ".nv-meta"
    (meta / "shouting.yaml").write_text(f"__module__: {__name__}\n__class__: ShoutingText\nfield_map:\n  text: txt\nsuffix: '!'\nsubflavors:\n  kind: loud\n")
    (meta / "counting.yaml").write_text(f"__module__: {__name__}\n__class__: WordCount\n")
    (meta / "tagged.yaml").write_text(f"__module__: {__name__}\n__class__: TaggedCrude\npart_filter: [txt]\nsubflavors:\n  kind: tagged\n")
    return root


def plain_texts(root: Path) -> dict[str, str]:
    factory = get_dataset_from_config(root, split_part="train", training=False, worker_config=NO_WORKERS)
    return {s.__key__: s.text for s in get_loader(factory.build())}


def test_dataset_yaml_names_the_users_factory_class(texts: Path) -> None:
    factory = get_dataset_from_config(texts, dataset_config="shouting.yaml", split_part="train", training=False, worker_config=NO_WORKERS)
    assert type(factory) is ShoutingText and factory.suffix == "!"  # constructed with the file's keys
    samples = list(get_loader(factory.build()))
    assert len(samples) == len(factory) == 12
    plain = plain_texts(texts)
    for sample in samples:
        assert isinstance(sample, TextSample)
        assert sample.text == plain[sample.__key__].upper() + "!"  # its _decoder and load_sample ran
        assert sample.__subflavors__ == {"kind": "loud"}


def test_a_user_factory_builds_the_whole_sample(texts: Path) -> None:
    samples = list(get_val_dataset(texts, split_part="train", batch_size=None, dataset_config="counting.yaml", worker_config=NO_WORKERS))
    plain = plain_texts(texts)
    assert {s.__key__: s.text for s in samples} == {key: str(len(text.split())) for key, text in plain.items()}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_user_factory_in_a_training_loader_restores_exactly(texts: Path, num_workers: int) -> None:
    worker_config = WorkerConfig(rank=0, world_size=1, num_workers=num_workers)

    def loader():
        dataset = get_train_dataset(texts, batch_size=2, shuffle_buffer_size=4, max_samples_per_sequence=2, dataset_config="shouting.yaml", worker_config=worker_config, task_encoder=DefaultTaskEncoder())
        return get_savable_loader(dataset)

    first = loader()
    it = iter(first)
    head = [next(it) for _ in range(3)]
    state = first.save_state_rank()
    rest = [next(it) for _ in range(4)]
    assert all(text.endswith("!") and text == text.upper() for batch in head + rest for text in batch.text)
    resumed = loader()
    resumed.restore_state_rank(state)
    again = iter(resumed)
    assert [next(again).__key__ for _ in range(4)] == [batch.__key__ for batch in rest]


def test_a_subclass_of_crude_webdataset_reads_crude_samples(texts: Path) -> None:
    config = load_dataset_config(texts, "tagged.yaml")
    assert (config.kind, config.factory_class, config.yields, config.part_filter) == ("crude", TaggedCrude, CrudeSample, frozenset({"txt"}))
    factory = get_dataset_from_config(texts, dataset_config="tagged.yaml", split_part="train", training=False, worker_config=NO_WORKERS)
    samples = list(get_loader(factory.build()))
    assert type(factory) is TaggedCrude and len(samples) == 12
    assert all(isinstance(s, CrudeSample) and set(s) >= {"txt", "__key__"} and s["__subflavors__"] == {"kind": "tagged"} for s in samples)


def test_a_factory_constructed_in_code_builds_its_own_samples(texts: Path) -> None:
    factory = ShoutingText(texts, split_part="train", training=False, worker_config=NO_WORKERS, field_map={"text": "txt"}, suffix="?")
    plain = plain_texts(texts)
    assert {s.__key__: s.text for s in get_loader(factory.build())} == {key: text.upper() + "?" for key, text in plain.items()}


def test_field_map_given_in_code_replaces_dataset_yamls(texts: Path) -> None:
    factory = CaptioningWebdataset(texts, split_part="train", training=False, worker_config=NO_WORKERS, field_map={"image": "txt", "caption": "txt"})
    sample = factory.load_sample({"__key__": "k", "__restore_key__": ("Webdataset", 0), "txt": b"hello"})
    assert isinstance(sample, CaptioningSample) and sample.caption == "hello" and sample.image == "hello"
    assert {s.caption for s in get_loader(factory.build())} == set(plain_texts(texts).values())


def test_a_factory_module_the_program_did_not_import_is_refused_naming_the_opt_in(texts: Path, tmp_path: Path, monkeypatch) -> None:
    package = tmp_path / "site"
    package.mkdir()
    (package / "user_factories_not_imported.py").write_text(
        textwrap.dedent(
            f"""
            from {__name__} import ShoutingText

            class Loud(ShoutingText):
                pass
            """
        )
    )
    monkeypatch.syspath_prepend(str(package))
    monkeypatch.delenv("ENERGON_LITE_TRUST_DATASET_CODE", raising=False)
    (texts / ".nv-meta" / "other.yaml").write_text("__module__: user_factories_not_imported\n__class__: Loud\nfield_map:\n  text: txt\n")
    with pytest.raises(ConfigError, match=r"(?s)user_factories_not_imported\.Loud is not available.*import user_factories_not_imported.*trust_dataset_code=True"):
        get_dataset_from_config(texts, dataset_config="other.yaml", split_part="train", training=False, worker_config=NO_WORKERS)
    assert "user_factories_not_imported" not in sys.modules  # nothing was imported
    factory = get_dataset_from_config(texts, dataset_config="other.yaml", split_part="train", training=False, worker_config=NO_WORKERS, trust_dataset_code=True)
    assert type(factory).__name__ == "Loud"
    monkeypatch.delitem(sys.modules, "user_factories_not_imported")


def test_a_class_that_is_not_a_factory_is_refused(texts: Path) -> None:
    (texts / ".nv-meta" / "wrong.yaml").write_text(f"__module__: {__name__}\n__class__: NotAFactory\n")
    with pytest.raises(ConfigError, match=r"(?s)NotAFactory is not available.*wrong\.yaml: __class__.*not a dataset factory"):
        get_dataset_from_config(texts, dataset_config="wrong.yaml", split_part="train", training=False, worker_config=NO_WORKERS)


def test_a_key_the_factory_does_not_take_names_dataset_yaml(texts: Path) -> None:
    (texts / ".nv-meta" / "typo.yaml").write_text(f"__module__: {__name__}\n__class__: ShoutingText\nfield_map:\n  text: txt\nsufix: '!'\n")
    with pytest.raises(ConfigError, match=r"(?s)cannot construct the dataset factory .*ShoutingText.*typo\.yaml.*sufix"):
        get_dataset_from_config(texts, dataset_config="typo.yaml", split_part="train", training=False, worker_config=NO_WORKERS)
