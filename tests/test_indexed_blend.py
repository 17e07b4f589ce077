"""Megatron ``.bin/.idx`` datasets as loader datasets: documents, token windows, blends with tar
datasets, exact resume (the format itself is tested in ``tests/format/test_indexed.py``)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from energon_lite_dev.resume import batch_identity, check_loader_resume
from energon_lite_dev.synthetic import generate_text_dataset

from megatron_energon_lite import (
    BatchDataset,
    ConfigError,
    DatasetError,
    DefaultTaskEncoder,
    TextSample,
    TokensSample,
    WorkerConfig,
    get_loader,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
)
from megatron_energon_lite.format.indexed import IndexedWriter
from megatron_energon_lite.format.prepare import prepare_dataset

TEXT_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"
HEADER = "__module__: megatron.energon\n__class__: MetadatasetV2\n"


def documents(seed: int, count: int, vocab: int = 60000) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, size=int(rng.integers(1, 40))).astype(np.uint16) for _ in range(count)]


def write_indexed(prefix: Path, docs: list[np.ndarray]) -> Path:
    writer = IndexedWriter(prefix, dtype=np.uint16)
    for doc in docs:
        writer.add_document(doc)
    writer.finalize()
    return prefix


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("indexed")
    write_indexed(base / "web_text_document", documents(1, 37))
    write_indexed(base / "code_text_document", documents(2, 23))
    generate_text_dataset(base / "tars", num_shards=3, samples_per_shard=10, max_words=8, seed=3, key_pattern="T{shard:02d}_{index:03d}")
    prepare_dataset(base / "tars", split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=TEXT_YAML)
    return base


def config(workers: int = 0) -> WorkerConfig:
    return WorkerConfig(rank=0, world_size=1, num_workers=workers)


def ident(sample) -> tuple:
    """Which sample this is: its dataset and key, and (for token samples) its tokens."""
    tokens = tuple(sample.tokens.tolist()) if isinstance(sample, TokensSample) else None
    return Path(sample.__sources__[0].dataset_path).name, sample.__key__, tokens


def write_yaml(root: Path, name: str, body: str) -> Path:
    path = root / name
    path.write_text(HEADER + body)
    return path


@pytest.mark.parametrize("name", ["web_text_document", "web_text_document.idx", "web_text_document.bin"])
def test_a_val_pass_yields_every_document_in_order(root: Path, name: str) -> None:
    docs = documents(1, 37)
    ds = get_val_dataset(root / name, split_part="val", worker_config=config(), batch_size=None)
    samples = list(get_savable_loader(ds))
    assert [s.__key__ for s in samples] == [str(i) for i in range(37)]
    for sample, doc in zip(samples, docs):
        assert isinstance(sample, TokensSample)
        assert sample.tokens.dtype.is_floating_point is False and str(sample.tokens.dtype) == "torch.int64"
        assert sample.tokens.tolist() == doc.tolist()
    assert samples[0].__sources__[0].shard_name == "web_text_document.bin"


def test_token_windows_cover_the_stream_with_one_shared_token(root: Path) -> None:
    stream = np.concatenate(documents(1, 37)).tolist()
    seq = 16
    yaml = write_yaml(root, "windows.yaml", f"splits:\n  val:\n    path: ./web_text_document\n    sequence_length: {seq}\n")
    samples = list(get_savable_loader(get_val_dataset(yaml, split_part="val", worker_config=config(), batch_size=None)))
    assert len(samples) == -(-(len(stream) - 1) // seq)
    for k, sample in enumerate(samples):
        assert sample.tokens.tolist() == stream[k * seq : k * seq + seq + 1]
    assert all(len(s.tokens) == seq + 1 for s in samples[:-1]) and 2 <= len(samples[-1].tokens) <= seq + 1


def test_train_epoch_visits_each_document_once(root: Path) -> None:
    docs = documents(2, 23)
    ds = get_train_dataset(root / "code_text_document", worker_config=config(2), batch_size=None, shuffle_buffer_size=5, max_samples_per_sequence=3, repeat=False)
    seen = [ident(s) for s in get_savable_loader(ds)]
    assert sorted(int(key) for _, key, _ in seen) == list(range(23))
    assert all(list(tokens) == docs[int(key)].tolist() for _, key, tokens in seen)


def blend_yaml(root: Path) -> Path:
    return write_yaml(
        root,
        "blend.yaml",
        "splits:\n  train:\n    blend:\n"
        "      - weight: 2\n        path: ./web_text_document.idx\n"
        "      - weight: 1\n        path: ./code_text_document\n        sequence_length: 8\n"
        "      - weight: 1\n        path: ./tars\n",
    )


def test_blend_mixes_tar_and_indexed_datasets_by_weight(root: Path) -> None:
    ds = get_train_dataset(blend_yaml(root), worker_config=config(), batch_size=None, shuffle_buffer_size=None, max_samples_per_sequence=None, blend_mode="exact")
    loader = get_savable_loader(ds)
    items = [s for _, s in zip(range(400), loader)]
    counts = Counter(Path(s.__sources__[0].dataset_path).name for s in items)
    assert counts == {"web_text_document": 200, "code_text_document": 100, "tars": 100}
    assert {type(s) for s in items} == {TokensSample, TextSample}
    windows = [s for s in items if Path(s.__sources__[0].dataset_path).name == "code_text_document"]
    assert all(len(s.tokens) <= 9 for s in windows) and any(len(s.tokens) == 9 for s in windows)


@pytest.mark.parametrize("workers", [0, 2])
def test_blend_resumes_exactly_at_every_step(root: Path, workers: int) -> None:
    def make():
        return get_train_dataset(blend_yaml(root), worker_config=config(workers), batch_size=None, shuffle_buffer_size=6, max_samples_per_sequence=4)

    steps = 36
    check_loader_resume(lambda: get_savable_loader(make()), steps, at=range(0, steps + 1, 1 if workers == 0 else 7), identity=lambda s: (batch_identity(s), ident(s)))


def test_subset_of_an_indexed_dataset(root: Path) -> None:
    yaml = write_yaml(root, "subset.yaml", "splits:\n  val:\n    path: ./web_text_document\n    subset: {range: [10, 20]}\n")
    samples = list(get_savable_loader(get_val_dataset(yaml, split_part="val", worker_config=config(), batch_size=None)))
    assert [s.__key__ for s in samples] == [str(i) for i in range(10, 20)]


def test_sequence_length_on_a_tar_dataset_is_refused(root: Path) -> None:
    yaml = write_yaml(root, "bad_seq.yaml", "splits:\n  train:\n    path: ./tars\n    sequence_length: 8\n")
    with pytest.raises(ConfigError, match=r"sequence_length applies only to Megatron \.bin/\.idx datasets"):
        get_train_dataset(yaml, worker_config=config(), batch_size=None)


@pytest.mark.parametrize("value", [0, -3, "8", True])
def test_invalid_sequence_length_names_the_key(root: Path, value) -> None:
    yaml = write_yaml(root, f"bad_seq_{value}.yaml", f"splits:\n  train:\n    path: ./web_text_document\n    sequence_length: {json.dumps(value)}\n")
    with pytest.raises(ConfigError, match="splits.train.sequence_length"):
        get_train_dataset(yaml, worker_config=config(), batch_size=None)


def test_a_missing_bin_is_named(root: Path, tmp_path: Path) -> None:
    prefix = write_indexed(tmp_path / "lonely", documents(4, 3))
    Path(f"{prefix}.bin").unlink()
    with pytest.raises(DatasetError, match=r"lonely\.bin"):
        get_train_dataset(f"{prefix}.idx", worker_config=config(), batch_size=None)


def test_state_fingerprint_names_the_window_length(root: Path) -> None:
    def loader(seq: int):
        yaml = write_yaml(root, "fingerprint.yaml", f"splits:\n  train:\n    path: ./web_text_document\n    sequence_length: {seq}\n")
        return get_savable_loader(get_train_dataset(yaml, worker_config=config(), batch_size=None, shuffle_buffer_size=None, max_samples_per_sequence=None))

    first = loader(8)
    next(iter(first))
    with pytest.raises(Exception, match="sequence_length"):
        loader(9).restore_state_rank(first.save_state_rank())


class KeysBatch(DefaultTaskEncoder):
    """Composes its own batching (Energon's build_batch), which goes through the dataset factory."""

    def build_batch(self, dataset, *, batch_size, worker_config, **kwargs):
        return BatchDataset(dataset, batch_size, lambda samples: [(type(s).__name__, s.__key__) for s in samples], worker_config=worker_config)


def test_a_task_encoder_composing_its_own_pipeline_reads_token_samples(root: Path) -> None:
    ds = get_val_dataset(root / "code_text_document", split_part="val", batch_size=5, worker_config=config(), task_encoder=KeysBatch())
    batches = list(get_loader(ds))
    assert [tuple(item) for batch in batches for item in batch] == [("TokensSample", str(i)) for i in range(23)]
