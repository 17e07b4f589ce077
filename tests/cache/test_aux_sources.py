"""aux: sources of a metadataset entry read by cookers: a prepared dataset, a folder, the primary."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import re
from pathlib import Path

import pytest
from energon_lite_dev.synthetic import write_numbered_shards

from megatron_energon_lite import (
    Cooker,
    DefaultTaskEncoder,
    Sample,
    TextSample,
    WorkerConfig,
    basic_sample_keys,
    cooker,
    get_loader,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
    stateless,
)
from megatron_energon_lite.cache import (
    DecodeFileStore,
    FileStoreCachePool,
    NoCachePool,
    PrimaryFileStore,
    SystemFileStore,
    WebdatasetFileStore,
)
from megatron_energon_lite.energon.epathlib import EPath
from megatron_energon_lite.errors import AuxFileNotFoundError, ConfigError, DatasetError
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.energon.metadataset import traverse_metadataset
from megatron_energon_lite.source_info import SourceInfo

CRUDE = "__module__: megatron.energon\n__class__: CrudeWebdataset\n"
N = 12


def crude_dataset(root: Path, offset: int) -> Path:
    write_numbered_shards(root, offset=offset)
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=CRUDE)
    return root


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("aux")
    crude_dataset(root / "ds1", 0)
    crude_dataset(root / "ds2", 100)
    (root / "files/sub").mkdir(parents=True)
    for i in range(N):
        (root / f"files/sub/{i}.txt").write_text(f"file {i}")
    (root / "mds.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    path: ds1\n"
        "    aux:\n      pkl_source: ds2\n      fs_source: filesystem://./files\n    subflavors:\n      crude_type: aux\n"
    )
    return root


@stateless
def cook_aux(sample: dict, pkl_source, fs_source) -> TextSample:
    index = int(sample["txt"])
    other = pkl_source.get(f"{index + 100:06d}.txt", sample)
    file = fs_source.get(f"sub/{index}.txt", sample)
    return TextSample(**basic_sample_keys(sample), text=f"<{index}|{other}|{file}>")


@dataclasses.dataclass
class WithPrimary(Sample):
    text: str = ""
    nxt: object = None


@stateless
@cooker(need_primary=True, need_cache=True)
def cook_primary(sample: dict, primary, pkl_source, fs_source, cache) -> WithPrimary:
    index = int(sample["txt"])
    own = primary.get(".txt", sample)
    nxt = cache.get_lazy(primary, f"{(index + 1) % N:06d}.txt")
    return WithPrimary(**basic_sample_keys(sample), text=f"{own}|{pkl_source.get(f'{index + 100:06d}.txt', sample)}", nxt=nxt)


class AuxEncoder(DefaultTaskEncoder):
    cookers = [Cooker(cook_aux)]


class PrimaryEncoder(DefaultTaskEncoder):
    cookers = [Cooker(cook_primary)]

    @stateless
    def encode_sample(self, sample: WithPrimary) -> TextSample:
        # Lazies are resolved in the worker, before the sample leaves it.
        nxt = sample.nxt.get(sample)  # appends its source to the sample's
        keys = {name: getattr(sample, name) for name in ("__key__", "__restore_key__", "__subflavors__", "__sources__")}
        return TextSample(**keys, text=f"{sample.text}|{nxt}")


def wc(workers: int = 0) -> WorkerConfig:
    return WorkerConfig(rank=0, world_size=1, num_workers=workers)


def train(data: Path, encoder, workers: int = 0, **kwargs):
    return get_train_dataset(data / "mds.yaml", worker_config=wc(workers), batch_size=2, shuffle_buffer_size=None, max_samples_per_sequence=None, task_encoder=encoder, **kwargs)


@pytest.mark.parametrize("workers", [0, 2])
def test_cookers_read_aux_datasets_and_folders_by_name(data: Path, workers: int) -> None:
    texts = [t for batch in itertools.islice(get_loader(train(data, AuxEncoder(), workers)), N // 2) for t in batch.text]
    assert len(texts) == N
    for text in texts:
        index, other, file = re.fullmatch(r"<(\d+)\|(\d+)\|file (\d+)>", text).groups()
        assert int(other) == int(index) + 100 and file == index
    assert sorted(int(t[1:].split("|")[0]) for t in texts) == list(range(N))


def test_sources_record_every_aux_read(data: Path) -> None:
    batch = next(iter(get_loader(train(data, AuxEncoder()))))
    first = int(batch.text[0][1:].split("|")[0])
    sources = batch.__sources__[0]  # the default batch keeps one tuple per sample (as Energon's)
    assert len(sources) == 3 and sources[0].dataset_path.endswith("ds1") and sources[0].file_names == (f"{first:06d}.txt",)
    assert sources[1] == SourceInfo(dataset_path=str(data / "ds2"), index=f"{first + 100:06d}.txt", shard_name=f"parts/data-{first // 4}.tar", file_names=(f"{first + 100:06d}.txt",))
    assert sources[2] == SourceInfo(dataset_path=str(data / "files"), index=f"sub/{first}.txt", shard_name=str(data / "files"), file_names=(f"sub/{first}.txt",))


@pytest.mark.parametrize("workers,pool", [(0, "none"), (2, "none"), (0, "files"), (2, "files")])
def test_primary_and_cache_with_exact_resume(data: Path, workers: int, pool: str, tmp_path: Path) -> None:
    def make_pool():
        return NoCachePool() if pool == "none" else FileStoreCachePool(parent_cache_dir=tmp_path / "cache", num_workers=2)

    loader = get_savable_loader(train(data, PrimaryEncoder(), workers), cache_pool=make_pool())
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    state = loader.save_state_rank()
    tail = [next(it).text for _ in range(4)]
    for batch in head:
        for text in batch.text:
            own, other, nxt = text.split("|")
            assert int(other) == int(own) + 100 and int(nxt) == (int(own) + 1) % N

    resumed = get_savable_loader(train(data, PrimaryEncoder(), workers), cache_pool=make_pool())
    resumed.restore_state_rank(state)
    it2 = iter(resumed)
    assert [next(it2).text for _ in range(4)] == tail
    # restore_sample rebuilds a batch by random access, the pool active in this process too.
    assert resumed.restore_sample(head[1].__restore_key__).text == head[1].text


def test_a_cooker_needing_the_cache_without_a_pool_is_told_how(data: Path, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ConfigError, match=r"no cache pool(.|\n)*cache_pool=FileStoreCachePool"):
        next(iter(get_loader(train(data, PrimaryEncoder()))))


def test_a_missing_aux_file_skips_the_sample_naming_it(data: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    @stateless
    def cook_missing(sample: dict, pkl_source, fs_source) -> TextSample:
        index = int(sample["txt"])
        name = "sub/missing.txt" if index == 3 else f"sub/{index}.txt"
        return TextSample(**basic_sample_keys(sample), text=fs_source.get(name, sample))

    class Encoder(DefaultTaskEncoder):
        cookers = [Cooker(cook_missing)]

    ds = get_val_dataset(data / "mds.yaml", split_part="train", worker_config=wc(), batch_size=None, task_encoder=Encoder())
    with caplog.at_level(logging.WARNING):
        texts = [s.text for s in get_loader(ds)]
    assert sorted(texts) == sorted(f"file {i}" for i in range(N) if i != 3)
    assert "file not found in an aux folder" in caplog.text and "sub/missing.txt" in caplog.text and "000003" in caplog.text


@pytest.mark.parametrize("name", ["../ds1/.nv-meta/.info.json", "/etc/passwd", "sub/../../mds.yaml", "s3://bucket/x"])
def test_a_folder_store_never_reads_outside_its_folder(data: Path, name: str) -> None:
    store = SystemFileStore(data / "files")
    with pytest.raises(AuxFileNotFoundError, match="must be a path inside it"):
        store.get(name)
    assert isinstance(AuxFileNotFoundError("x"), KeyError) and isinstance(AuxFileNotFoundError("x"), FileNotFoundError)


def test_dataset_store_reads_members_and_refuses_what_it_does_not_have(data: Path) -> None:
    store = WebdatasetFileStore(data / "ds2")
    assert store["000105.txt"][0] == b"105"
    with pytest.raises(AuxFileNotFoundError, match=r"no such sample part(.|\n)*'000105.jpg'"):
        store["000105.jpg"]
    with pytest.raises(AuxFileNotFoundError, match="tar member name"):
        store["000105"]
    decoded = DecodeFileStore(store, decoder=AuxEncoder().decoder)
    assert decoded.get("000105.txt") == "105"
    primary = PrimaryFileStore(decoded, current_key="000107")
    assert primary.get(".txt") == "107" and primary.get("000101.txt") == "101"
    with pytest.raises(DatasetError, match=r"must be a prepared dataset(.|\n)*filesystem://"):
        WebdatasetFileStore(data / "files")


def test_bad_aux_entries_name_the_yaml_path(data: Path, tmp_path: Path) -> None:
    def mds(aux: str) -> Path:
        path = data / f"bad_{abs(hash(aux))}.yaml"
        path.write_text(f"__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    path: ds1\n    aux:\n{aux}")
        return path

    with pytest.raises(ConfigError, match=r"aux folder does not exist(.|\n)*splits.train.aux.media"):
        next(iter(get_loader(get_train_dataset(mds("      media: filesystem://./nowhere\n"), worker_config=wc(), batch_size=1, shuffle_buffer_size=None, max_samples_per_sequence=None, task_encoder=AuxEncoder()))))
    with pytest.raises(DatasetError, match=r"must be a prepared dataset(.|\n)*splits.train.aux.labels"):
        next(iter(get_loader(get_train_dataset(mds("      labels: ./files\n"), worker_config=wc(), batch_size=1, shuffle_buffer_size=None, max_samples_per_sequence=None, task_encoder=AuxEncoder()))))
    with pytest.raises(ConfigError, match="unknown aux source scheme"):
        traverse_metadataset(mds("      media: filesystem+a+b://x\n"), split_part="train")


def test_traverse_reports_aux_sources_without_opening_them(data: Path) -> None:
    (refs,) = [traverse_metadataset(data / "mds.yaml", split_part="train")]
    assert [ref.aux for ref in refs] == [{"pkl_source": EPath(data / "ds2"), "fs_source": EPath(data / "files")}]


def test_an_aux_source_named_primary_reaches_a_cooker_that_does_not_ask_for_the_primary(data: Path) -> None:
    (data / "named_primary.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    path: ds1\n    aux:\n      primary: ds2\n"
    )

    @stateless
    def cook(sample: dict, primary) -> TextSample:
        return TextSample(**basic_sample_keys(sample), text=primary.get(f"{int(sample['txt']) + 100:06d}.txt"))

    class Encoder(DefaultTaskEncoder):
        cookers = [Cooker(cook)]

    ds = get_val_dataset(data / "named_primary.yaml", split_part="train", worker_config=wc(), batch_size=None, task_encoder=Encoder())
    assert sorted(s.text for s in get_loader(ds)) == sorted(str(i + 100) for i in range(N))
