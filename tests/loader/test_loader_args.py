"""Energon's keyword arguments of get_train_dataset / get_val_dataset and the loaders, and the
defaults that let the documentation's short snippets run."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from energon_lite_dev.synthetic import generate_captioning_dataset
from PIL import Image

from megatron_energon_lite import (
    CaptioningSample,
    ConfigError,
    DefaultTaskEncoder,
    SampleDecoder,
    TextSample,
    WorkerConfig,
    get_loader,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
)
from megatron_energon_lite.format.prepare import prepare_dataset

PER_SHARD = 6


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("args") / "captions"
    generate_captioning_dataset(root, num_shards=4, samples_per_shard=PER_SHARD, image_size=(8, 6), seed=5)
    prepare_dataset(root, split_ratio=(1, 1, 0), progress=False, num_workers=1)
    (root / ".nv-meta/dataset.yaml").write_text(
        "sample_type:\n  __module__: megatron.energon\n  __class__: CaptioningSample\nfield_map:\n  image: jpg\n  caption: txt\n"
    )
    return root


def _wc(workers: int = 0, **kwargs) -> WorkerConfig:
    return WorkerConfig(rank=0, world_size=1, num_workers=workers, **kwargs)


def _first(path: Path, **kwargs):
    kwargs.setdefault("worker_config", _wc())
    return next(iter(get_loader(get_train_dataset(path, batch_size=None, **kwargs))))


def _epoch_keys(path: Path, **kwargs) -> list[str]:
    ds = get_train_dataset(path, worker_config=_wc(), batch_size=None, repeat=False, **kwargs)
    return [sample.__key__ for sample in get_loader(ds)]


# --- the seed documentation's snippets ---------------------------------------------------------


def test_documented_snippets_run_with_defaults(dataset: Path) -> None:
    ds = get_train_dataset(dataset, batch_size=32, shuffle_buffer_size=1000, worker_config=WorkerConfig.default_worker_config())
    assert ds.worker_config.num_workers == 4 and ds.spec.max_samples_per_sequence is None
    short = get_train_dataset(dataset, batch_size=8)  # worker config from torch.distributed (none here)
    assert short.worker_config == WorkerConfig.default_worker_config() and short.spec.shuffle_buffer_size is None
    assert len(short) == len(get_train_dataset(dataset, batch_size=8, worker_config=WorkerConfig(num_workers=4)))
    val = get_val_dataset(dataset, batch_size=4)
    assert val.worker_config == WorkerConfig.default_worker_config()


def test_batches_are_subscriptable_by_field_name(dataset: Path) -> None:
    batch = next(iter(get_loader(get_train_dataset(dataset, batch_size=4, worker_config=_wc()))))
    assert batch["image"].shape == (4, 3, 6, 8) and batch["image"] is batch.image
    assert len(batch["caption"]) == 4
    with pytest.raises(KeyError, match="caption"):
        batch["text"]


def test_worker_config_prefetch_factor_is_the_loaders_default(dataset: Path) -> None:
    config = WorkerConfig(num_workers=1, prefetch_factor=3, persistent_workers=True)
    ds = get_train_dataset(dataset, batch_size=2, worker_config=config)
    assert get_loader(ds).prefetch_factor == 3
    assert get_savable_loader(ds, prefetch_factor=5).prefetch_factor == 5
    assert get_savable_loader(get_train_dataset(dataset, batch_size=2, worker_config=_wc(1))).prefetch_factor == 2


def test_worker_config_passed_to_the_loader_is_deprecated_and_must_match(dataset: Path) -> None:
    ds = get_train_dataset(dataset, batch_size=2, worker_config=_wc())
    with pytest.warns(FutureWarning, match="deprecated"):
        get_savable_loader(ds, worker_config=_wc())
    with pytest.raises(ConfigError, match="differs"):
        get_loader(ds, worker_config=_wc(2))


# --- Energon's deprecated decoder arguments ----------------------------------------------------


@pytest.mark.parametrize(("image_decode", "check"), [
    ("pilrgb", lambda image: isinstance(image, Image.Image) and image.mode == "RGB"),
    ("torchrgb8", lambda image: isinstance(image, torch.Tensor) and image.dtype == torch.uint8),
    ("l8", lambda image: image.shape == (6, 8)),
])
def test_image_decode_argument_changes_the_samples(dataset: Path, image_decode: str, check) -> None:
    with pytest.warns(FutureWarning, match="image_decode.*deprecated"):
        sample = _first(dataset, image_decode=image_decode)
    assert check(sample.image)


def test_auto_decode_false_hands_out_raw_bytes(dataset: Path) -> None:
    te = DefaultTaskEncoder()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Energon does not warn about auto_decode
        sample = _first(dataset, auto_decode=False, image_decode="pil", task_encoder=te)
    assert isinstance(sample.image, bytes) and sample.image[:2] == b"\xff\xd8" and isinstance(sample.caption, bytes)
    assert te.decoder is None  # as Energon, on the task encoder


def test_av_decode_arguments_configure_the_decoder(dataset: Path) -> None:
    te = DefaultTaskEncoder()
    with pytest.warns(FutureWarning):
        get_train_dataset(dataset, batch_size=2, worker_config=_wc(), task_encoder=te, av_decode="torch", video_decode_audio=True)
    assert (te.decoder.av_decode, te.decoder.video_decode_audio, te.decoder.image_decode) == ("torch", True, "torchrgb")
    assert DefaultTaskEncoder.decoder.av_decode == "AVDecoder"  # the class default is untouched


def test_decoder_arguments_and_the_task_encoders_decoder(dataset: Path) -> None:
    class PilEncoder(DefaultTaskEncoder):
        decoder = SampleDecoder(image_decode="pil")

    te = PilEncoder()
    with pytest.warns(FutureWarning):  # agreeing arguments: accepted (e.g. reused for train and val)
        ds = get_train_dataset(dataset, batch_size=None, worker_config=_wc(), task_encoder=te, image_decode="pil")
    assert te.decoder is PilEncoder.decoder and isinstance(next(iter(get_loader(ds))).image, Image.Image)
    with pytest.warns(FutureWarning), pytest.raises(ConfigError, match="image_decode") as info:
        get_train_dataset(dataset, batch_size=None, worker_config=_wc(), task_encoder=te, image_decode="torchrgb8")
    assert "'pil'" in str(info.value) and "'torchrgb8'" in str(info.value)
    te_none = DefaultTaskEncoder()
    te_none.decoder = None
    with pytest.warns(FutureWarning), pytest.raises(ConfigError, match="decoder is None"):
        get_train_dataset(dataset, batch_size=None, worker_config=_wc(), task_encoder=te_none, image_decode="pil")
    with pytest.warns(FutureWarning), pytest.raises(ConfigError, match="image_decode"):
        get_train_dataset(dataset, batch_size=None, worker_config=_wc(), image_decode="jpeg")


def test_handler_is_deprecated_and_ignored(dataset: Path) -> None:
    calls = []
    with pytest.warns(FutureWarning, match="handler"):
        sample = _first(dataset, handler=lambda *args: calls.append(args))
    assert isinstance(sample, CaptioningSample) and calls == []


# --- Energon's dataset arguments ----------------------------------------------------------------


def test_sample_type_is_checked(dataset: Path) -> None:
    assert isinstance(_first(dataset, sample_type=CaptioningSample), CaptioningSample)
    with pytest.raises(ConfigError, match="yields CaptioningSample, not the sample_type TextSample"):
        get_train_dataset(dataset, batch_size=2, worker_config=_wc(), sample_type=TextSample)


def test_subflavors_argument_wins_over_the_datasets(dataset: Path) -> None:
    sample = _first(dataset, subflavors={"source": "args"})
    assert sample.__subflavors__ == {"source": "args"}


def test_subset_argument(dataset: Path) -> None:
    everything = _epoch_keys(dataset)
    assert len(everything) == 2 * PER_SHARD
    half = _epoch_keys(dataset, subset={"range": (0.0, 0.5)})
    assert len(half) == PER_SHARD and set(half) < set(everything)
    assert len(_epoch_keys(dataset, subset={"absolute_range": (2, 5)})) == 3
    with pytest.raises(ConfigError, match="invalid subset"):
        get_train_dataset(dataset, batch_size=2, worker_config=_wc(), subset={"range": (0.5, 0.2)})


def test_val_accepts_energons_factory_arguments(dataset: Path) -> None:
    plain = get_val_dataset(dataset, batch_size=2, worker_config=_wc(2))
    sliced = get_val_dataset(dataset, batch_size=2, worker_config=_wc(2), max_samples_per_sequence=2, shuffle_over_epochs_multiplier=2)
    assert sliced.spec.max_samples_per_sequence == 2
    assert sorted(k for b in get_loader(plain) for k in b.__key__) == sorted(k for b in get_loader(sliced) for k in b.__key__)


@pytest.mark.parametrize("kwargs", [
    dict(ignore_decoder_errors=True),  # documented as deprecated by Energon, but its factories reject it
    dict(shuffle_over_epochs=2),
    dict(decoder=None),
    dict(cache_pool=None),
    dict(training=False),
])
def test_arguments_energon_rejects_are_errors_listing_the_accepted_ones(dataset: Path, kwargs: dict) -> None:
    with pytest.raises(ConfigError, match=f"unknown keyword argument {next(iter(kwargs))!r}") as info:
        get_train_dataset(dataset, batch_size=2, worker_config=_wc(), **kwargs)
    assert "image_decode" in str(info.value) and "subflavors" in str(info.value)
    with pytest.raises(ConfigError, match="unknown keyword argument 'repeat'"):
        get_val_dataset(dataset, batch_size=2, worker_config=_wc(), repeat=False)
