"""The loader's one policy: a problem with the dataset or the machine stops the run (raised in the
main process, also from a worker); a problem with one sample skips that sample, with its key."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path

import pytest
from energon_lite_dev.synthetic import generate_captioning_dataset, write_tar

from megatron_energon_lite import (
    Batch,
    DatasetError,
    DefaultTaskEncoder,
    FatalSampleError,
    WorkerConfig,
    get_loader,
    get_val_dataset,
)
from megatron_energon_lite.format.prepare import prepare_dataset

CAPTION_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: CaptioningSample\nfield_map:\n  image: jpg\n  caption: txt\n"


@pytest.fixture
def captions(tmp_path: Path) -> Path:
    root = tmp_path / "captions"
    generate_captioning_dataset(root, num_shards=2, samples_per_shard=6, image_size=(8, 6), seed=5)
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=CAPTION_YAML)
    return root


def val_loader(root: Path, workers: int):
    config = WorkerConfig(rank=0, world_size=1, num_workers=workers)
    return get_loader(get_val_dataset(root, split_part="train", worker_config=config, batch_size=None))


def val_keys(root: Path, workers: int) -> list[str]:
    return [s.__key__ for s in val_loader(root, workers)]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_truncated_shard_stops_the_pass_instead_of_skipping_its_samples(captions: Path, workers: int) -> None:
    shard = sorted(captions.rglob("*.tar"))[1]
    os.truncate(shard, shard.stat().st_size // 2)
    with pytest.raises(DatasetError) as failure:
        val_keys(captions, workers)
    message = str(failure.value)
    # Damaged, not stale: it names the lost samples (from the index) instead of asking for prepare.
    assert shard.name in message and "truncated (damaged): 3 of its 6 samples lie past its end" in message
    assert "'0001_000003', '0001_000004', '0001_000005'" in message and "restore the shard" in message


@pytest.mark.parametrize("workers", [0, 2])
def test_a_sample_that_does_not_decode_is_skipped_with_its_key(captions: Path, workers: int, caplog) -> None:
    import tarfile

    shard = sorted(captions.rglob("*.tar"))[0]
    with tarfile.open(shard) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith(".jpg"))
    with open(shard, "r+b") as f:  # same size: the index still fits, only the bytes are bad
        f.seek(member.offset_data)
        f.write(b"\0" * min(64, member.size))
    bad_key = member.name.rsplit(".", 1)[0]
    loader = val_loader(captions, workers)
    with caplog.at_level(logging.WARNING):
        keys = [s.__key__ for s in loader]
    assert len(keys) == 11 and bad_key not in keys
    # Logged by the main process (caplog sees only this process), also when a worker skipped it.
    [record] = [r for r in caplog.records if bad_key in r.getMessage()]
    message = record.getMessage()
    assert f"skipping sample {bad_key} at load" in message and "DecodeError" in message and f"shard_name='{shard.relative_to(captions)}'" in message
    assert loader.skipped_samples == 1
    # ... and listed by the loader, counted per dataset and shard.
    report = loader.skip_report()
    assert report["skipped"] == 1 and report["samples"] == 1 and report["not_listed"] == 0
    assert report["by_dataset"] == {str(captions): {"samples": 1, "shards": {str(shard.relative_to(captions)): 1}}}
    [listed] = report["listed"]
    assert listed["key"] == bad_key and listed["stage"] == "load" and listed["shard"] == str(shard.relative_to(captions))
    assert listed["reason"].startswith("DecodeError") and listed["dataset"] == str(captions) and listed["worker"] in range(max(workers, 1))


def test_skips_after_a_workers_last_item_still_reach_the_main_process(captions: Path, caplog) -> None:
    import tarfile

    shard = sorted(captions.rglob("*.tar"))[-1]
    with tarfile.open(shard) as tar:
        member = [m for m in tar.getmembers() if m.name.endswith(".jpg")][-1]  # the last sample of the split
    with open(shard, "r+b") as f:
        f.seek(member.offset_data)
        f.write(b"\0" * min(64, member.size))
    loader = val_loader(captions, 2)
    with caplog.at_level(logging.WARNING):
        keys = [s.__key__ for s in loader]
    assert len(keys) == 11 and loader.skipped_samples == 1
    assert member.name.rsplit(".", 1)[0] in caplog.text


@dataclasses.dataclass(kw_only=True, slots=True)
class CaptionBatch(Batch):
    caption: list


class FailingBatchEncoder(DefaultTaskEncoder):
    """``encode_batch`` fails on the batch holding sample 0000_000004 (it spans both shards)."""

    def __init__(self, batch_class: bool) -> None:
        super().__init__()
        self.batch_class = batch_class

    def batch(self, samples):
        if self.batch_class:  # its __sources__ are the samples' sources in a row
            return CaptionBatch.from_samples(samples, caption=[s.caption for s in samples])
        return super().batch(samples)  # one __sources__ entry per sample

    def encode_batch(self, batch):
        if "0000_000004" in batch.__key__:
            raise ValueError("bad batch")
        return batch


@pytest.mark.parametrize("batch_class", [False, True])
@pytest.mark.parametrize("workers", [0, 1])
def test_a_failed_encode_batch_counts_every_sample_where_it_came_from(captions: Path, workers: int, batch_class: bool) -> None:
    config = WorkerConfig(rank=0, world_size=1, num_workers=workers)
    dataset = get_val_dataset(captions, split_part="train", worker_config=config, batch_size=4, task_encoder=FailingBatchEncoder(batch_class))
    loader = get_loader(dataset)
    delivered = [key for batch in loader for key in batch.__key__]
    assert len(delivered) == 8 and "0000_000004" not in delivered
    assert loader.skipped_samples == 1  # skips (one failure), as documented; the report counts samples
    report = loader.skip_report()
    assert report["skipped"] == 1 and report["samples"] == 4
    shards = sorted(str(p.relative_to(captions)) for p in captions.rglob("*.tar"))
    assert report["by_dataset"] == {str(captions): {"samples": 4, "shards": {shards[0]: 2, shards[1]: 2}}}
    [listed] = report["listed"]
    assert listed["key"] == "0000_000004" and listed["samples"] == 4 and listed["stage"] == "encode_batch"
    assert listed["dataset"] == str(captions) and listed["shard"] == shards[0]


def _json_dataset(root: Path, odd: set[int], count: int = 12) -> Path:
    """Samples whose JSON part is an object, except those in ``odd``: a list."""
    write_tar(root / "a.tar", [(f"s{i:03d}", {"json": json.dumps([i] if i in odd else {"n": i}).encode(), "txt": b"x"}) for i in range(count)])
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=JSON_YAML)
    return root


JSON_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: CaptioningSample\nfield_map:\n  image: json\n  caption: txt\n"


@pytest.mark.parametrize("workers", [0, 1])
def test_a_json_part_of_another_type_skips_its_batch(tmp_path: Path, workers: int) -> None:
    root = _json_dataset(tmp_path / "json", odd={5})
    config = WorkerConfig(rank=0, world_size=1, num_workers=workers)
    loader = get_loader(get_val_dataset(root, split_part="train", worker_config=config, batch_size=4))
    batches = [batch.__key__ for batch in loader]
    assert batches == [[f"s{i:03d}" for i in range(4)], [f"s{i:03d}" for i in range(8, 12)]]
    report = loader.skip_report()
    assert report["samples"] == 4 and report["by_dataset"] == {str(root): {"samples": 4, "shards": {"a.tar": 4}}}
    [listed] = report["listed"]
    assert listed["stage"] == "batch" and listed["key"] == "s004"
    assert listed["reason"].startswith("BatchMismatchError: cannot batch field 'n'") and "types dict, list" in listed["reason"]


def test_batches_that_keep_failing_stop_the_run(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = _json_dataset(tmp_path / "json", odd={1, 5, 9, 13, 17}, count=20)

    class Tolerant(DefaultTaskEncoder):
        __default_failure_tolerance__ = 3

    config = WorkerConfig(rank=0, world_size=1, num_workers=0)
    loader = get_loader(get_val_dataset(root, split_part="train", worker_config=config, batch_size=4, task_encoder=Tolerant()))
    with caplog.at_level(logging.WARNING), pytest.raises(FatalSampleError, match="3 samples in a row") as info:
        list(loader)
    assert "BatchMismatchError" in str(info.value)
    # The skips before the stop are logged, not left for the next loader of this process.
    assert sum("skipping 4 samples" in record.getMessage() for record in caplog.records) == 3
    clean = get_loader(get_val_dataset(_json_dataset(tmp_path / "clean", odd=set()), split_part="train", worker_config=config, batch_size=4))
    assert len(list(clean)) == 3 and clean.skip_report()["skipped"] == 0
