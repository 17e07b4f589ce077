"""JPEGs written once after their decode: where only the default batching sees the samples, the
decoder gives CHW views of the HWC pixels and the batch is where they are transposed to.

Whatever the pipeline, a batch's images are contiguous and equal those of a pipeline whose hooks
see the samples (and so get contiguous images, as before)."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch
from energon_lite_dev.synthetic import prepared_captioning_dataset

from megatron_energon_lite import (
    DefaultTaskEncoder,
    WorkerConfig,
    get_loader,
    get_train_dataset,
)
from megatron_energon_lite.decode import SampleDecoder
from megatron_energon_lite.samples import generic_batch

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
pytest.importorskip("simplejpeg")

@pytest.fixture(scope="module")
def captioning(tmp_path_factory) -> Path:
    return prepared_captioning_dataset(tmp_path_factory.mktemp("into_batch") / "cap", num_shards=2, samples_per_shard=20, image_size=(24, 16), seed=3)


class Uint8(DefaultTaskEncoder):
    decoder = SampleDecoder(image_decode="torchrgb8")


class SeesSamples(Uint8):
    """encode_sample sees every sample: its images must be contiguous (views are off)."""

    def __init__(self) -> None:
        super().__init__()
        self.strided = 0

    def encode_sample(self, sample):
        self.strided += not sample.image.is_contiguous()
        return sample


class OwnBatch(Uint8):
    """A batch of its own sees the samples: views are off."""

    def __init__(self) -> None:
        super().__init__()
        self.strided = 0

    def batch(self, samples):
        self.strided += sum(not s.image.is_contiguous() for s in samples)
        return generic_batch(samples)


class EncodesBatches(Uint8):
    """encode_batch sees only the stacked batch: views stay on."""

    def encode_batch(self, batch):
        batch.image = batch.image.clone()  # a hook that does something with the batch
        return batch


def _batches(root: Path, task_encoder, workers: int, count: int = 8) -> list:
    config = WorkerConfig(rank=0, world_size=1, num_workers=workers)
    loader = get_loader(get_train_dataset(root, batch_size=4, shuffle_buffer_size=6, max_samples_per_sequence=5, task_encoder=task_encoder, worker_config=config))
    it = iter(loader)
    batches = [next(it) for _ in range(count)]
    del it, loader
    gc.collect()
    return batches


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_equal_those_of_a_pipeline_whose_hooks_see_the_samples(captioning: Path, workers: int) -> None:
    seeing = SeesSamples()
    reference = _batches(captioning, seeing, workers)
    for task_encoder in (Uint8(), EncodesBatches()):
        batches = _batches(captioning, task_encoder, workers)
        assert [b.__key__ for b in batches] == [b.__key__ for b in reference]
        for batch, expected in zip(batches, reference):
            assert batch.image.is_contiguous() and batch.image.shape == (4, 3, 16, 24)
            assert torch.equal(batch.image, expected.image)
    if workers == 0:  # the hook ran in this process, so its count is here
        assert seeing.strided == 0


def test_hooks_that_see_samples_get_contiguous_images(captioning: Path) -> None:
    for task_encoder in (SeesSamples(), OwnBatch()):
        batches = _batches(captioning, task_encoder, 0)
        assert all(b.image.is_contiguous() for b in batches)
        assert task_encoder.strided == 0


def test_the_default_pipeline_decodes_views(captioning: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default task encoder's pipeline does get views (else the tests above prove nothing)."""
    import megatron_energon_lite.samples as samples_module
    from megatron_energon_lite.samples import batch_stack as real_batch_stack

    strided = []

    def counting_batch_stack(values):
        strided.append(sum(not v.is_contiguous() for v in values))
        return real_batch_stack(values)

    monkeypatch.setattr(samples_module, "batch_stack", counting_batch_stack)
    _batches(captioning, Uint8(), 0)
    assert strided and all(n == 4 for n in strided)
    strided.clear()
    _batches(captioning, SeesSamples(), 0)
    assert strided and not any(strided)


def test_views_of_different_sizes_are_padded_like_contiguous_images() -> None:
    """Images of different sizes in one batch go the padding way: views and copies give the same batch."""
    import numpy as np

    from megatron_energon_lite import CaptioningSample

    rng = np.random.default_rng(0)
    pixels = [rng.integers(0, 255, (h, w, 3), dtype=np.uint8) for h, w in [(5, 7), (6, 4), (5, 7)]]

    def samples(make):
        return [CaptioningSample(__key__=str(k), __restore_key__=(), image=make(p), caption="c") for k, p in enumerate(pixels)]

    views = generic_batch(samples(lambda p: torch.from_numpy(p).permute(2, 0, 1)))
    copies = generic_batch(samples(lambda p: torch.from_numpy(np.ascontiguousarray(p.transpose(2, 0, 1)))))
    assert views.image.shape == (3, 3, 6, 7) and views.image.is_contiguous()
    assert torch.equal(views.image, copies.image)


def test_jsonl_with_the_default_batching_loads(tmp_path: Path) -> None:
    """A JSONL dataset (crude, no dataset config) in a pipeline where only the default batching
    sees the samples: its loader is left as it is."""
    from energon_lite_dev.synthetic import write_jsonl

    from megatron_energon_lite import Cooker, TextSample, basic_sample_keys, stateless
    from megatron_energon_lite.format.jsonl import write_jsonl_index

    write_jsonl(tmp_path / "records.jsonl", [{"text": f"record {i}"} for i in range(6)])
    write_jsonl_index(tmp_path / "records.jsonl")

    @stateless
    def cook(crude: dict) -> TextSample:
        return TextSample(**basic_sample_keys(crude), text=crude["json"]["text"])

    class Encoder(DefaultTaskEncoder):
        cookers = [Cooker(cook)]

    batches = _batches(tmp_path / "records.jsonl", Encoder(), 0, count=3)  # 12 texts: over a pass
    texts = [t for b in batches for t in b.text]
    assert len(texts) == 12 and set(texts) == {f"record {i}" for i in range(6)}


def test_restored_batches_are_contiguous_and_equal(captioning: Path) -> None:
    """restore_sample builds a batch again through the same decoder and batching."""
    from megatron_energon_lite import get_savable_loader

    config = WorkerConfig(rank=0, world_size=1, num_workers=0)
    loader = get_savable_loader(get_train_dataset(captioning, batch_size=4, shuffle_buffer_size=6, max_samples_per_sequence=5, task_encoder=Uint8(), worker_config=config))
    it = iter(loader)
    batches = [next(it) for _ in range(4)]
    for batch in batches:
        restored = loader.restore_sample(batch.__restore_key__)
        assert restored.__key__ == batch.__key__ and restored.image.is_contiguous()
        assert torch.equal(restored.image, batch.image)
