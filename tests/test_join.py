"""Joins in metadatasets: samples of several datasets paired by key, through index.sqlite."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from energon_lite_dev.resume import check_loader_resume
from energon_lite_dev.synthetic import generate_captioning_dataset

from megatron_energon_lite import (
    CaptioningSample,
    ConfigError,
    DatasetError,
    Sample,
    WorkerConfig,
    get_loader,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
)
from megatron_energon_lite.format.prepare import prepare_dataset

IMAGE_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: ImageSample\nfield_map:\n  image: jpg\n"
TEXT_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"
HEADER = "__module__: megatron.energon\n__class__: MetadatasetV2\n"


@dataclasses.dataclass
class ImageText(Sample):
    """What the default joiner makes of an ImageSample joined with a TextSample."""

    image: Any = None
    text: str = ""


def caption_joiner(image, caption) -> CaptioningSample:
    """A dict-form joiner: keyword arguments named as in the YAML; caption may be None."""
    keys = {name: getattr(image, name) for name in ("__key__", "__restore_key__", "__subflavors__", "__sources__")}
    return CaptioningSample(**keys, image=image.image, caption="" if caption is None else caption.text)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """imgs: 4 shards x 5 images; caps: the same keys' captions for the first 3 shards only."""
    base = tmp_path_factory.mktemp("join")
    generate_captioning_dataset(base / "raw", num_shards=4, samples_per_shard=5, image_size=(8, 6), seed=7)
    shutil.copytree(base / "raw", base / "imgs")
    prepare_dataset(base / "imgs", split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=IMAGE_YAML)
    generate_captioning_dataset(base / "caps", num_shards=3, samples_per_shard=5, image_size=(8, 6), seed=7)
    prepare_dataset(base / "caps", split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=TEXT_YAML)
    shutil.copytree(base / "raw", base / "caps_all")
    prepare_dataset(base / "caps_all", split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=TEXT_YAML)
    return base


def write(root: Path, name: str, body: str) -> Path:
    path = root / name
    path.write_text(HEADER + "splits:\n  train:\n" + body)
    return path


def dict_join(root: Path, nonmatch: str, caps: str = "caps") -> Path:
    return write(
        root,
        f"join_{nonmatch}_{caps}.yaml",
        f"    join:\n      image: {{path: ./imgs}}\n      caption: {{path: ./{caps}, nonmatch: {nonmatch}}}\n"
        f"    joiner: {{__module__: {__name__}, __function__: caption_joiner}}\n",
    )


def config(workers: int = 0) -> WorkerConfig:
    return WorkerConfig(rank=0, world_size=1, num_workers=workers)


def val(path: Path, **kwargs) -> list:
    return list(get_loader(get_val_dataset(path, split_part="train", worker_config=config(), batch_size=None, **kwargs)))


def texts(root: Path) -> dict[str, str]:
    return {s.__key__: s.text for s in val(root / "caps_all")}


def test_skip_keeps_only_rows_with_a_caption(root: Path) -> None:
    samples = val(dict_join(root, "skip"))
    assert [s.__key__ for s in samples] == [f"{shard:04d}_{i:06d}" for shard in range(3) for i in range(5)]
    captions = texts(root)
    for s in samples:
        assert isinstance(s, CaptioningSample) and s.caption == captions[s.__key__]
        assert isinstance(s.image, torch.Tensor) and s.image.shape == (3, 6, 8)


def test_none_passes_none_for_missing_matches(root: Path) -> None:
    samples = val(dict_join(root, "none"))
    assert len(samples) == 20
    assert [s.caption == "" for s in samples] == [False] * 15 + [True] * 5


def test_error_names_the_missing_key(root: Path) -> None:
    with pytest.raises(ConfigError, match=r"'0003_000000'.*\n.*join\.caption"):
        val(dict_join(root, "error"))


def test_list_form_with_the_default_joiner_merges_fields(root: Path) -> None:
    path = write(root, "join_list.yaml", f"    join:\n      - path: ./imgs\n      - path: ./caps_all\n    joiner: {{__module__: {__name__}, __class__: ImageText}}\n")
    samples = val(path)
    captions = texts(root)
    assert len(samples) == 20 and all(isinstance(s, ImageText) and s.text == captions[s.__key__] for s in samples)
    assert all(len(s.__sources__) == 2 for s in samples)


def test_join_inside_a_blend_with_subset_and_training(root: Path) -> None:
    path = write(
        root,
        "join_blend.yaml",
        "    blend:\n"
        f"      - weight: 1\n        join:\n          image: {{path: ./imgs}}\n          caption: {{path: ./caps, nonmatch: skip}}\n"
        f"        joiner: {{__module__: {__name__}, __function__: caption_joiner}}\n        subset: {{range: [0%, 60%]}}\n"
        f"      - weight: 1\n        join:\n          image: {{path: ./imgs}}\n          caption: {{path: ./caps_all}}\n"
        f"        joiner: {{__module__: {__name__}, __function__: caption_joiner}}\n",
    )
    ds = get_train_dataset(path, worker_config=config(), batch_size=None, shuffle_buffer_size=None, max_samples_per_sequence=None, blend_mode="exact")
    assert len(ds) == 9 + 20
    samples = [s for _, s in zip(range(60), get_loader(ds))]
    first = {s.__key__ for s in samples if s.__restore_key__[2:4] == ("Blend", 0)}
    assert first == {f"{shard:04d}_{i:06d}" for shard in range(2) for i in range(5)} - {"0001_000004"}  # 60% of 15 rows


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_through_a_join(root: Path, workers: int) -> None:
    path = dict_join(root, "skip")

    def make():
        return get_savable_loader(get_train_dataset(path, worker_config=config(workers), batch_size=2, shuffle_buffer_size=4, max_samples_per_sequence=2))

    def joined(batch):
        assert isinstance(batch, CaptioningSample)  # restore_sample's rebuilt batches too
        return batch.__restore_key__, list(batch.__key__), list(batch.caption)

    check_loader_resume(make, 20, at=None if workers == 0 else (0, 3, 11, 20), identity=joined, restore_samples=True)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (f"    join:\n      - {{path: ./imgs, nonmatch: skip}}\n      - {{path: ./caps}}\n    joiner: {{__module__: {__name__}, __class__: ImageText}}\n", "primary"),
        ("    join:\n      - {path: ./imgs}\n      - {path: ./caps_all}\n    joiner: {__module__: not_imported_module, __function__: f}\n", "import not_imported_module"),
        ("    join:\n      - {path: ./imgs}\n    joiner: {__module__: megatron.energon, __class__: CaptioningSample}\n", "at least two"),
        ("    join:\n      - {path: ./imgs}\n      - {path: ./caps_all}\n", "joiner"),
        ("    join:\n      - {path: ./imgs}\n      - {path: ./caps_all, nonmatch: maybe}\n    joiner: {__module__: megatron.energon, __class__: CaptioningSample}\n", "nonmatch"),
    ],
)
def test_bad_joins(root: Path, body: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        val(write(root, "bad_join.yaml", body))
    assert "bad_join.yaml" in str(info.value)


# --- subflavors on a join member ------------------------------------------------------------------

SEEN_FLAVORS: list = []


def flavor_joiner(image, caption) -> CaptioningSample:
    """Records the subflavors each member's sample carries."""
    SEEN_FLAVORS.append((image.__subflavors__, None if caption is None else caption.__subflavors__))
    return caption_joiner(image, caption)


def flavored_join(root: Path) -> Path:
    return write(
        root,
        "join_flavors.yaml",
        "    join:\n"
        "      image: {path: ./imgs, subflavors: {side: image, both: inner}}\n"
        "      caption: {path: ./caps_all, subflavors: {side: caption}}\n"
        f"    joiner: {{__module__: {__name__}, __function__: flavor_joiner}}\n"
        "    subflavors: {both: outer}\n",
    )


def test_a_join_member_may_have_subflavors(root: Path) -> None:
    from megatron_energon_lite.format.metadataset import load_blend_plan

    (leaf,) = load_blend_plan(flavored_join(root), "train", training=False).leaves
    image, caption = leaf.join.members
    assert image.subflavors == {"side": "image", "both": "inner"} and caption.subflavors == {"side": "caption"}
    # Energon's merge: the member's own, overridden by the join's (outer levels win).
    assert image.sample_subflavors(leaf.subflavors) == {"side": "image", "both": "outer"}
    assert caption.sample_subflavors(leaf.subflavors) == {"side": "caption", "both": "outer"}
    assert leaf.describe()["join"][0][3] == {"side": "image", "both": "inner"}
    with pytest.raises(ConfigError, match=r"join\.image\.subflavors"):
        load_blend_plan(write(root, "bad_flavors.yaml", "    join:\n      image: {path: ./imgs, subflavors: [1]}\n      caption: {path: ./caps_all}\n    joiner: {__module__: megatron.energon, __class__: CaptioningSample}\n"), "train", training=False)


def test_each_member_sample_carries_its_own_subflavors(root: Path) -> None:
    SEEN_FLAVORS.clear()
    samples = val(flavored_join(root))
    assert len(samples) == 20
    assert set(map(lambda pair: (tuple(sorted(pair[0].items())), tuple(sorted(pair[1].items()))), SEEN_FLAVORS)) == {
        ((("both", "outer"), ("side", "image")), (("both", "outer"), ("side", "caption")))
    }
    assert samples[0].__subflavors__ == {"side": "image", "both": "outer"}  # the primary's


# --- energon-lite prepare meta.yaml ---------------------------------------------------------------


def top_level_metadatasets(root: Path):
    """A copytree ignore: the metadataset files (and caches) other tests wrote next to the datasets."""
    return lambda folder, names: [n for n in names if Path(folder) == root and n.endswith((".yaml", ".cache"))]


def energon_join(root: Path, name: str, nonmatch: str = "skip") -> Path:
    """A join both loaders read: Energon's own joiner class, relative paths."""
    return write(
        root,
        name,
        f"    join:\n      - {{path: ./imgs}}\n      - {{path: ./caps, nonmatch: {nonmatch}}}\n"
        "    joiner: {__module__: megatron.energon, __class__: OCRSample}\n",  # image + text
    )


def test_prepare_on_a_join_metadataset_writes_energons_join_index(root: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from megatron_energon_lite.cli.main import cli

    base = tmp_path / "copy"
    shutil.copytree(root, base, ignore=top_level_metadatasets(root))
    path = energon_join(base, "meta.yaml")
    result = CliRunner().invoke(cli, ["prepare", str(path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "15 of 20 primary samples joined, 5 skipped" in result.output
    files = list((base / "meta.yaml.cache").glob("join_index_*.bin"))
    assert len(files) == 1 and files[0].read_bytes()[:8] == b"JIDX0001"
    stale = base / "meta.yaml.cache/join_index_0000.bin"
    stale.write_bytes(b"JIDX0001")
    again = CliRunner().invoke(cli, ["prepare", str(path)], catch_exceptions=False)
    assert again.exit_code == 0 and "up to date" in again.output and "removed stale" in again.output
    assert not stale.exists() and files[0].exists()


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("nonmatch", ["skip", "none"])
def test_our_join_index_is_energons_and_energon_loads_it(root: Path, tmp_path: Path, nonmatch: str) -> None:
    energon = pytest.importorskip("megatron.energon")
    from megatron.energon.epathlib import EPath
    from megatron.energon.metadataset.loader import prepare_metadataset

    from megatron_energon_lite.format.join import prepare_metadataset_joins

    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    for base in (ours, theirs):
        shutil.copytree(root, base, ignore=top_level_metadatasets(root))
    for base in (ours, theirs):  # the same index.uuid in both copies: the same cache file name
        for name in ("imgs", "caps"):
            (base / name / ".nv-meta/index.uuid").write_text("00000000-0000-0000-0000-0000000000" + name[:2].encode().hex())
    prepared, _ = prepare_metadataset_joins(energon_join(ours, "meta.yaml", nonmatch))
    prepare_metadataset(EPath(str(energon_join(theirs, "meta.yaml", nonmatch))))
    (mine,) = (ours / "meta.yaml.cache").iterdir()
    (reference,) = (theirs / "meta.yaml.cache").iterdir()
    assert mine.name == reference.name and mine.name == prepared[0].index_file.path.name
    assert mine.read_bytes() == reference.read_bytes()
    if nonmatch == "none":
        return  # OCRSample needs a text: the rows without one cannot be loaded, by either loader
    # And Energon loads the join from our file.
    shutil.rmtree(theirs / "meta.yaml.cache")
    shutil.copytree(ours / "meta.yaml.cache", theirs / "meta.yaml.cache")
    ds = energon.get_val_dataset(str(theirs / "meta.yaml"), split_part="train", batch_size=None, worker_config=energon.WorkerConfig(rank=0, world_size=1, num_workers=0))
    loaded = [(s.__key__, s.text) for s in energon.get_loader(ds)]
    assert len(loaded) == 15
    lite = [(s.__key__, s.text) for s in val(ours / "meta.yaml")]
    assert loaded == lite


def test_as_energon_refuses_a_join_that_was_not_prepared_as_energon_does(root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from megatron_energon_lite import energon_mode
    from megatron_energon_lite.format.join import prepare_metadataset_joins

    base = tmp_path / "copy"
    shutil.copytree(root, base, ignore=top_level_metadatasets(root))
    path = energon_join(base, "meta.yaml")
    monkeypatch.setattr(energon_mode, "_enabled", False)
    assert len(val(path)) == 15  # the plain import computes the join: no prepare needed
    monkeypatch.setattr(energon_mode, "_enabled", True)
    with pytest.raises(DatasetError, match=r"(?s)not prepared.*meta\.yaml: splits\.train.*meta\.yaml\.cache/join_index_[0-9a-f]{64}\.bin.*energon prepare"):
        val(path)
    prepare_metadataset_joins(path)
    assert len(val(path)) == 15
    # A joined dataset prepared again (a new index.uuid): the join index is out of date, as in Energon.
    (base / "caps/.nv-meta/index.uuid").write_text("00000000-0000-0000-0000-000000000001")
    with pytest.raises(DatasetError, match="not prepared"):
        val(path)
