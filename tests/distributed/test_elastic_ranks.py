"""Elastic resume under torchrun with gloo: 2 ranks save, 1 rank finishes the epoch; 1 rank saves,
2 ranks finish it.  Every sample of the epoch is delivered exactly once over both runs; for a
blend of two datasets, every sample of each dataset's running epoch."""

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
from energon_lite_dev.synthetic import sized_keys, write_tar, write_text_blend
from torchrun_helpers import torchrun

from megatron_energon_lite.format.prepare import prepare_dataset

SIZES = [6, 2, 9, 4, 7]
KEYS = sorted(f"s{shard}_{i:02d}" for shard, size in enumerate(SIZES) for i in range(size))
TEXT_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("elastic_dist") / "text"
    for shard, size in enumerate(SIZES):
        write_tar(root / f"shards/{shard}.tar", [(f"s{shard}_{i:02d}", {"txt": f"{shard} {i}".encode()}) for i in range(size)])
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=TEXT_YAML)
    return root


def _torchrun(mode: str, ranks: int, dataset: Path, out: Path, workers: int) -> list[str]:
    run = torchrun(str(Path(__file__).with_name("elastic_script.py")), [mode, str(dataset), str(out), str(workers)], ranks=ranks)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return [key for rank in range(ranks) for key in json.loads((out / f"{mode}_rank{rank}.json").read_text())]


@pytest.mark.parametrize(("saved", "restored"), [((2, 1), (1, 0)), ((1, 1), (2, 1))])
def test_the_epoch_finishes_exactly_once_on_another_number_of_ranks(dataset: Path, tmp_path: Path, saved, restored) -> None:
    before = _torchrun("save", saved[0], dataset, tmp_path, saved[1])
    states = json.loads((tmp_path / "states.json").read_text())
    assert len(states) == saved[0]
    after = _torchrun("restore", restored[0], dataset, tmp_path, restored[1])
    counts = Counter(before + after)
    assert sorted(counts) == KEYS and max(counts.values()) == 1, (before, after)
    assert before and after


def test_changed_data_continues_by_shard_over_ranks(dataset: Path, tmp_path: Path) -> None:
    """2 ranks save; shard 1 is removed, shard 3 rewritten with one sample less and shard 5
    appended; restored with allow_data_change and join_new_shards on 2 ranks (the rest divided
    over both; tests/loader/test_changed_data.py restores on other topologies): every sample of the kept shards once over both runs, the new shard's within
    the running epoch, nothing of the changed ones after the restore."""
    root = tmp_path / "text"
    shutil.copytree(dataset, root)
    before = _torchrun("save", 2, root, tmp_path, 1)
    (root / "shards/1.tar").unlink()
    write_tar(root / "shards/3.tar", [(f"s3_{i:02d}", {"txt": f"3 {i}".encode()}) for i in range(SIZES[3] - 1)])
    write_tar(root / "shards/5.tar", [(f"s5_{i:02d}", {"txt": f"5 {i}".encode()}) for i in range(3)])
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=TEXT_YAML, force_overwrite=True)
    after = _torchrun("restore-changed", 2, root, tmp_path, 1)
    kept = [key for key in KEYS if key[:2] not in ("s1", "s3")]
    new = [f"s5_{i:02d}" for i in range(3)]
    assert Counter(key for key in before + after if key[:2] not in ("s1", "s3")) == Counter(kept + new), (before, after)
    assert not [key for key in after if key[:2] in ("s1", "s3")], after


BLEND_SIZES = {"a": [5, 3, 6], "b": [7, 4, 8, 2]}


@pytest.fixture(scope="module")
def blend(tmp_path_factory) -> Path:
    return write_text_blend(tmp_path_factory.mktemp("elastic_dist_blend"), BLEND_SIZES, {"a": 1, "b": 2})


@pytest.mark.parametrize(("saved", "restored"), [((2, 1), (1, 0)), ((1, 1), (2, 1))])
def test_each_blended_dataset_finishes_its_epoch_once_on_another_number_of_ranks(blend: Path, tmp_path: Path, saved, restored) -> None:
    before = _torchrun("save", saved[0], blend, tmp_path, saved[1])
    after = _torchrun("restore", restored[0], blend, tmp_path, restored[1])
    for name, sizes in BLEND_SIZES.items():
        counts = Counter(k for k in before + after if k.startswith(name))
        expected = sized_keys(name, sizes)
        assert sorted(counts) == expected and max(counts.values()) == 1, (name, before, after)
