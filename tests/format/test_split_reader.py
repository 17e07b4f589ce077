import tarfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from megatron_energon_lite.errors import DatasetError
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.format.split_reader import SplitReader
from megatron_energon_lite.format.tar_index import index_path


def _tar_samples(path: Path) -> list[tuple[str, dict[str, bytes]]]:
    samples: list[tuple[str, dict[str, bytes]]] = []
    with tarfile.open(path, "r:") as tar:
        for member in tar.getmembers():
            base = member.name.rsplit("/", 1)
            last = base[-1]
            key = (base[0] + "/" if len(base) == 2 else "") + last.split(".", 1)[0]
            part = last.split(".", 1)[1]
            if not samples or samples[-1][0] != key:
                samples.append((key, {}))
            samples[-1][1][part] = tar.extractfile(member).read()
    return samples


def test_reads_every_sample_like_tarfile(text_dataset: Path) -> None:
    prepare_dataset(text_dataset, split_parts=[("all", ".*")], progress=False)
    reader = SplitReader(text_dataset, "all")
    expected = [s for shard in sorted((text_dataset / "shards").glob("*.tar")) for s in _tar_samples(shard)]
    got = [reader.read(i) for i in range(len(reader))]
    assert [(s.key, s.parts) for s in got] == expected
    assert [s.index for s in got] == list(range(20))


def test_key_excludes_skip_on_read(text_dataset: Path) -> None:
    prepare_dataset(text_dataset, split_ratio=(1, 0, 0), progress=False)
    split_path = text_dataset / ".nv-meta/split.yaml"
    config = yaml.safe_load(split_path.read_text())
    config["exclude"] = ["shards/shard_000.tar/s0_000003"]
    split_path.write_text(yaml.safe_dump(config))
    reader = SplitReader(text_dataset, "train")
    assert len(reader) == 20
    assert reader.read(3) is None and reader.read(2).key == "s0_000002"


def test_index_that_disagrees_with_counts(text_dataset: Path) -> None:
    prepare_dataset(text_dataset, split_ratio=(1, 0, 0), progress=False)
    idx = index_path(text_dataset / "shards/shard_000.tar")
    offsets = np.fromfile(idx, dtype="<u8")
    offsets[:-1].tofile(idx)
    reader = SplitReader(text_dataset, "train")
    with pytest.raises(DatasetError, match="disagrees"):
        reader.read(0)


def test_truncated_shard_after_prepare(text_dataset: Path) -> None:
    prepare_dataset(text_dataset, split_ratio=(1, 0, 0), progress=False)
    shard = text_dataset / "shards/shard_000.tar"
    shard.write_bytes(shard.read_bytes()[:2048])
    reader = SplitReader(text_dataset, "train")
    # The tar's size no longer fits its index: caught before any sample is read.
    with pytest.raises(DatasetError, match="truncated \\(damaged\\)(.|\n)*shard_000.tar(.|\n)*'s0_000001'(.|\n)*found: 2048 bytes(.|\n)*restore the shard"):
        reader.read(0)


def test_grown_shard_after_prepare_is_stale(text_dataset: Path) -> None:
    prepare_dataset(text_dataset, split_ratio=(1, 0, 0), progress=False)
    shard = text_dataset / "shards/shard_000.tar"
    shard.write_bytes(shard.read_bytes() + bytes(64 * 1024))
    with pytest.raises(DatasetError, match="stale"):
        SplitReader(text_dataset, "train").read(0)


def test_short_read_inside_a_fresh_looking_tar(text_dataset: Path) -> None:
    """A tar whose size still fits but which is cut while open is caught by the read itself."""
    prepare_dataset(text_dataset, split_ratio=(1, 0, 0), progress=False)
    shard = text_dataset / "shards/shard_000.tar"
    reader = SplitReader(text_dataset, "train")
    reader.read(0)  # index loaded and checked against the full tar
    shard.write_bytes(shard.read_bytes()[:2048])
    with pytest.raises(DatasetError, match="shorter than its index"):
        reader.read(4)
