"""The ready-made encoders (text packing, aspect-ratio grouping) and token-budget blending."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
from energon_lite_dev.resume import batch_identity, check_loader_resume
from energon_lite_dev.synthetic import generate_text_dataset, make_jpeg, write_tar

from megatron_energon_lite import ConfigError, WorkerConfig, get_loader, get_savable_loader, get_train_dataset
from megatron_energon_lite.encoders import AspectRatioGroupingTaskEncoder, TextPackingTaskEncoder, TokenizedSample
from megatron_energon_lite.format.prepare import prepare_dataset

TEXT_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"
IMAGE_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: ImageSample\nfield_map:\n  image: jpg\n"
HEADER = "__module__: megatron.energon\n__class__: MetadatasetV2\n"


def byte_tokenizer(text: str) -> list[int]:
    """One token per UTF-8 byte, +1 so that 0 stays free for padding."""
    return [b + 1 for b in text.encode("utf-8")]


def tokenized(key: str, tokens: list[int]) -> TokenizedSample:
    return TokenizedSample(__key__=key, __restore_key__=(), __subflavors__=None, __sources__=(), tokens=tokens)


def test_a_pack_has_labels_loss_mask_positions_and_boundaries() -> None:
    encoder = TextPackingTaskEncoder(byte_tokenizer, 10)
    pack = encoder.pack_selected_samples([tokenized("a", [5, 6, 7]), tokenized("b", [8, 9])])
    assert pack.tokens.tolist() == [5, 6, 7, 8, 9, 0, 0, 0, 0, 0]
    assert pack.labels.tolist() == [6, 7, 0, 9, 0, 0, 0, 0, 0, 0]
    assert pack.loss_mask.tolist() == [1, 1, 0, 1, 0, 0, 0, 0, 0, 0]
    assert pack.position_ids.tolist() == [0, 1, 2, 0, 1, 0, 0, 0, 0, 0]
    assert pack.cu_seqlens.tolist() == [0, 3, 5, 10] and pack.sample_keys == ["a", "b"]
    with_empty = encoder.pack_selected_samples([tokenized("e", []), tokenized("a", [5, 6, 7])])
    assert with_empty.loss_mask.tolist()[:4] == [1, 1, 0, 0] and with_empty.cu_seqlens.tolist() == [0, 0, 3, 10]
    batch = encoder.batch([pack, pack])
    assert batch.tokens.shape == (2, 10) and batch.cu_seqlens.tolist() == [0, 3, 5, 10, 13, 15, 20]


def test_first_fit_decreasing_uses_every_sample_once() -> None:
    encoder = TextPackingTaskEncoder(byte_tokenizer, 10)
    samples = [tokenized(str(i), [1] * n) for i, n in enumerate([7, 3, 5, 5, 2, 8, 1])]
    groups = encoder.select_samples_to_pack(samples)
    assert sorted(s.__key__ for g in groups for s in g) == [str(i) for i in range(7)]
    assert all(sum(len(s.tokens) for s in g) <= 10 for g in groups) and len(groups) == 4  # 31 tokens


def test_too_long_samples_are_cut_or_refused() -> None:
    from megatron_energon_lite import TextSample

    sample = TextSample(__key__="k", __restore_key__=(), __subflavors__=None, __sources__=(), text="x" * 30)
    assert len(TextPackingTaskEncoder(byte_tokenizer, 10).encode_sample(sample).tokens) == 10
    with pytest.raises(ConfigError, match="longer than seq_length"):
        TextPackingTaskEncoder(byte_tokenizer, 10, truncate=False).encode_sample(sample)


@pytest.fixture(scope="module")
def texts(tmp_path_factory) -> Path:
    """short: 1-4 words per text; long: 30-60 words (~10x the tokens)."""
    base = tmp_path_factory.mktemp("tokens")
    for name, low, high in (("short", 1, 4), ("long", 30, 60)):
        generate_text_dataset(base / name, num_shards=2, samples_per_shard=40, min_words=low, max_words=high, seed=len(name), key_pattern=name + "{shard}_{index:03d}")
        prepare_dataset(base / name, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=TEXT_YAML)
    (base / "equal.yaml").write_text(HEADER + "splits:\n  train:\n    blend:\n      - {weight: 1, path: ./short}\n      - {weight: 1, path: ./long}\n")
    return base


def token_shares(packs, n: int) -> dict[str, float]:
    """Tokens per dataset, counted from the packs' own boundaries and keys."""
    tokens: Counter = Counter()
    for _, pack in zip(range(n), packs):
        lengths = (pack.cu_seqlens[1:] - pack.cu_seqlens[:-1]).tolist()
        for key, length in zip(pack.sample_keys, lengths):
            tokens[key.rstrip("0123456789_")] += length
    total = sum(tokens.values())
    return {name: count / total for name, count in tokens.items()}


def packing_loader(texts: Path, mode: str, workers: int = 0):
    encoder = TextPackingTaskEncoder(byte_tokenizer, 256)
    ds = get_train_dataset(texts / "equal.yaml", worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers), batch_size=None, shuffle_buffer_size=None, max_samples_per_sequence=None, packing_buffer_size=32, task_encoder=encoder, blend_mode=mode)
    return get_savable_loader(ds)


def test_token_budget_blend_holds_token_shares_within_2_percent(texts: Path) -> None:
    """en#212: equal sample weights give ~10:1 tokens; cost mode gives 1:1 within 2% over
    10,000 packed sequences."""
    loader = packing_loader(texts, "cost")
    shares = token_shares(loader, 10_000)
    assert abs(shares["short"] - 0.5) < 0.02 and abs(shares["long"] - 0.5) < 0.02, shares
    report = {Path(r["path"]).name: r for r in loader.blend_report()}
    assert abs(report["short"]["cost_share"] - 0.5) < 0.02 and report["short"]["samples"] > 5 * report["long"]["samples"]
    by_samples = token_shares(packing_loader(texts, "random"), 2_000)
    assert by_samples["long"] > 0.85  # what sample weights do to the token mix


@pytest.mark.parametrize("workers", [0, 2])
def test_token_budget_blend_resumes_exactly(texts: Path, workers: int) -> None:
    check_loader_resume(lambda: packing_loader(texts, "cost", workers), 12, at=(0, 1, 5, 12), identity=lambda pack: (batch_identity(pack), pack.sample_keys))


def test_cost_mode_needs_sample_cost(texts: Path) -> None:
    with pytest.raises(ConfigError, match="sample_cost"):
        get_train_dataset(texts / "equal.yaml", worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), batch_size=None, shuffle_buffer_size=None, max_samples_per_sequence=None, blend_mode="cost")


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("aspect") / "images"
    sizes = [(32, 16), (16, 32), (24, 24), (30, 16), (24, 25)]
    write_tar(root / "shards/data-0.tar", [(f"{i:03d}", {"jpg": make_jpeg(*sizes[i % 5], seed=i)}) for i in range(40)])
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=IMAGE_YAML)
    return root


def test_aspect_ratio_buckets_with_their_batch_sizes(images: Path) -> None:
    encoder = AspectRatioGroupingTaskEncoder((0.5, 1.0, 2.0), batch_sizes={2.0: 2})
    ds = get_train_dataset(images, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), batch_size=3, shuffle_buffer_size=None, max_samples_per_sequence=None, task_encoder=encoder, repeat=False)
    batches = list(get_loader(ds))
    assert sum(len(b.__key__) for b in batches) == 40
    for batch in batches:
        ratio = batch.image.shape[-1] / batch.image.shape[-2]
        bucket = encoder.bucket_of(batch.image.shape[-1], batch.image.shape[-2])
        assert len(batch.__key__) <= (2 if bucket == 2.0 else 3)
        assert abs(ratio - bucket) < 0.25 or bucket == 1.0


def test_bad_buckets() -> None:
    with pytest.raises(ConfigError, match="buckets"):
        AspectRatioGroupingTaskEncoder(())
    with pytest.raises(ConfigError, match="do not exist"):
        AspectRatioGroupingTaskEncoder((1.0,), batch_sizes={2.0: 4})


@pytest.mark.parametrize(("script", "args", "expected"), [
    ("text_packing.py", ["--workers", "0", "--batches", "12", "--seq-length", "512"], "continuation matches"),
    ("aspect_ratio_grouping.py", ["--images", "30"], "bucket  2.0: 3 batch(es) of 4"),
])
def test_examples_run(tmp_path: Path, script: str, args: list[str], expected: str) -> None:
    import subprocess
    import sys

    example = Path(__file__).resolve().parent.parent / "examples" / script
    run = subprocess.run([sys.executable, str(example), "--data-dir", str(tmp_path), *args], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert expected in run.stdout
