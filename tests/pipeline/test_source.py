from collections import Counter
from pathlib import Path

import pytest
import yaml
from energon_lite_dev.synthetic import write_tar
from resume import check_resume_at_every_step

from megatron_energon_lite.errors import FatalSampleError
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.pipeline.guard import SampleGuard
from megatron_energon_lite.pipeline.load import SampleLoader
from megatron_energon_lite.pipeline.repeat import RepeatNode
from megatron_energon_lite.pipeline.source import SliceSource


def _random_order(num_slices: int, epoch: int, seed: int) -> list[int]:
    import numpy as np

    return list(np.random.default_rng((99, epoch)).permutation(num_slices))


@pytest.fixture
def text_loader(tmp_path: Path) -> SampleLoader:
    root = tmp_path / "ds"
    for shard in range(4):
        write_tar(root / f"s{shard}.tar", [(f"{shard}_{i:03d}", {"txt": f"t{shard}.{i}".encode()}) for i in range(6 + shard)])
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1)
    (root / ".nv-meta/dataset.yaml").write_text(yaml.safe_dump({"sample_type": {"__module__": "megatron.energon", "__class__": "TextSample"}, "field_map": {"text": "txt"}}))
    return SampleLoader(root, "train")


def _slices(loader: SampleLoader) -> list[tuple[int, int]]:
    starts = loader.reader.shard_starts
    return [(a, b) for a, b in zip(starts, starts[1:])]


def test_sequential_reads_every_sample_once_in_order(text_loader: SampleLoader) -> None:
    source = SliceSource(text_loader, _slices(text_loader), seed=1)
    keys = [s.__key__ for s in source]
    assert keys == [f"{shard}_{i:03d}" for shard in range(4) for i in range(6 + shard)]


def test_parallel_slices_interleave_and_cover_the_epoch(text_loader: SampleLoader) -> None:
    source = SliceSource(text_loader, _slices(text_loader), seed=1, parallel_slices=3, slice_order=_random_order)
    epoch0 = [s.__key__ for s in source]
    assert Counter(epoch0) == Counter(f"{shard}_{i:03d}" for shard in range(4) for i in range(6 + shard))
    assert epoch0 != sorted(epoch0)  # interleaved, not sequential
    for shard in range(4):  # within a slice, samples keep their order
        own = [k for k in epoch0 if k.startswith(f"{shard}_")]
        assert own == sorted(own)
    source.start_epoch(1)
    epoch1 = [s.__key__ for s in source]
    assert Counter(epoch1) == Counter(epoch0) and epoch1 != epoch0


def test_resume_at_every_step_across_epochs(text_loader: SampleLoader) -> None:
    slices = _slices(text_loader)
    check_resume_at_every_step(
        lambda: RepeatNode(SliceSource(text_loader, slices, seed=5, parallel_slices=2, slice_order=_random_order)),
        steps=2 * len(text_loader) + 5,
    )


def test_excluded_keys_are_skipped(text_loader: SampleLoader) -> None:
    root = text_loader.path
    split = yaml.safe_load((root / ".nv-meta/split.yaml").read_text())
    split["exclude"] = ["s1.tar/1_002"]
    (root / ".nv-meta/split.yaml").write_text(yaml.safe_dump(split))
    loader = SampleLoader(root, "train")
    keys = [s.__key__ for s in SliceSource(loader, _slices(loader), seed=1)]
    assert "1_002" not in keys and len(keys) == len(loader) - 1


def test_bad_samples_are_skipped_then_stop_the_run(text_loader: SampleLoader, tmp_path: Path) -> None:
    root = text_loader.path
    (root / ".nv-meta/dataset.yaml").write_text(yaml.safe_dump({"sample_type": {"__module__": "megatron.energon", "__class__": "TextSample"}, "field_map": {"text": "missing_part"}}))
    loader = SampleLoader(root, "train")
    seen = []
    source = SliceSource(loader, _slices(loader), seed=1, guard=SampleGuard(lambda exc, item, src: seen.append(item), tolerance=3, stage="load"))
    with pytest.raises(FatalSampleError, match="load"):
        next(source)
    assert len(seen) == 3
