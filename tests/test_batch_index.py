"""``TaskEncoder.current_batch_index`` inside ``encode_sample``: the batch the sample goes into (Energon)."""

from __future__ import annotations

from pathlib import Path

import pytest
from energon_lite_dev.resume import check_loader_resume
from energon_lite_dev.synthetic import generate_text_dataset

from megatron_energon_lite import (
    DefaultTaskEncoder,
    TextSample,
    WorkerConfig,
    edataclass,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
)
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.samples import Sample

TEXT_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bidx") / "text"
    generate_text_dataset(root, num_shards=3, samples_per_shard=10, max_words=5, seed=5)
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=TEXT_YAML)
    return root


@edataclass
class Tagged(TextSample):
    batch_index: int = -1
    sample_index: int = -1


class TagOnce(DefaultTaskEncoder):
    def encode_sample(self, sample: TextSample) -> Tagged:
        return Tagged.extend(sample, batch_index=self.current_batch_index, sample_index=self.current_sample_index)

    def batch(self, samples: list[Sample]) -> list[Sample]:
        return samples


class TagTwice(TagOnce):
    def encode_sample(self, sample: TextSample):  # a generator: outputs may land in the next batch
        for _ in range(2):
            yield Tagged.extend(sample, batch_index=self.current_batch_index, sample_index=self.current_sample_index)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("encoder", [TagOnce, TagTwice])
def test_encode_sample_sees_the_index_of_its_batch(dataset: Path, workers: int, encoder: type) -> None:
    wc = WorkerConfig(rank=0, world_size=1, num_workers=workers)

    def make():
        return get_savable_loader(get_train_dataset(dataset, worker_config=wc, batch_size=3, shuffle_buffer_size=5, max_samples_per_sequence=4, task_encoder=encoder()))

    # Restored mid-generator (after 8 batches of 3 from pairs, ...), the rest sees the same indices.
    stream = check_loader_resume(make, 12, at=None if workers == 0 else (3, 8), identity=lambda batch: [(s.__key__, s.batch_index, s.sample_index) for s in batch])
    batches = stream[:8]
    per_worker = [0] * max(workers, 1)
    for step, batch in enumerate(batches):
        w = step % max(workers, 1)
        expected = per_worker[w] * max(workers, 1) + w  # this worker's batch counter, unique over workers
        per_worker[w] += 1
        assert [batch_index for _, batch_index, _ in batch] == [expected] * 3, step
    if encoder is TagTwice:  # two outputs per input: inputs counted, not outputs
        assert [sample_index for _, _, sample_index in batches[0]] == [0, 0, max(workers, 1)]


class PackAllButFull(DefaultTaskEncoder):
    """Packs full buffers in twos and leaves a short last buffer out entirely (Energon's doc example shape)."""

    packing_may_drop_samples = True

    def select_samples_to_pack(self, samples):
        if len(samples) < 4:
            return []
        return [samples[:2], samples[2:]]

    def pack_selected_samples(self, samples):
        return TextSample.derive_from(samples[0], text="+".join(s.text for s in samples))


def test_a_buffer_left_out_entirely_is_skipped(dataset: Path) -> None:
    # 30 samples, buffers of 4: 7 full buffers (14 packs), the last 2 samples left out.
    ds = get_val_dataset(dataset, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), split_part="train", batch_size=None, packing_buffer_size=4, task_encoder=PackAllButFull())
    packs = list(get_savable_loader(ds))
    assert len(packs) == 14
    assert all(len(p.text.split("+")) == 2 for p in packs)
