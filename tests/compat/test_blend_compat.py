"""Blends over datasets prepared by Energon 7.4.1's own CLI, read by us and by Energon.

Energon is the oracle for everything that is not random: which samples each rank and worker
reads (rotation offsets between datasets), validation concatenation order, subsets, len() and the
composition of an epochized pass.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

energon = pytest.importorskip("megatron.energon")

from energon_lite_dev.synthetic import write_tar  # noqa: E402

import megatron_energon_lite as lite  # noqa: E402

pytestmark = [
    pytest.mark.energon,
    pytest.mark.filterwarnings("ignore:.*pin_memory.*:UserWarning"),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

_ENERGON_SCRIPT = Path(sys.executable).with_name("energon")
SHARDS = {"A": [2, 2, 3, 4, 10, 10, 10, 10, 4], "B": [7, 13, 5]}  # 55 and 25 samples
SUBSET_OF_A = ("A_part", [0, 4, 6])  # A's shards 0, 4 and 6 (keys A000-A001, A011-A020, A031-A040)
HEADER = "__module__: megatron.energon\n__class__: MetadatasetV2\n"


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("blend_compat")
    for name, sizes in SHARDS.items():
        index = 0
        for shard, size in enumerate(sizes):
            write_tar(base / name / f"parts/{name}-{shard}.tar", [(f"{name}{index + i:03d}", {"txt": f"{name} {index + i}".encode()}) for i in range(size)])
            if name == "A" and shard in SUBSET_OF_A[1]:
                write_tar(base / SUBSET_OF_A[0] / f"parts/{name}-{shard}.tar", [(f"{name}{index + i:03d}", {"txt": f"part {index + i}".encode()}) for i in range(size)])
            index += size
    for name in (*SHARDS, SUBSET_OF_A[0]):
        cmd = [str(_ENERGON_SCRIPT), "prepare", "--non-interactive", "--no-progress", "--split-parts", "train:parts/.*", "--split-parts", "val:parts/.*",
               "--sample-type", "TextSample", "--field-map", '{"text": "txt"}', str(base / name)]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
    (base / "val.yaml").write_text(HEADER + "splits:\n  val:\n    blend:\n      - {weight: 1, path: ./B}\n      - {weight: 3, path: ./A, subset: {range: [10%, 90%]}}\n      - {weight: 1, path: ./B, subset: {range: [3, end]}}\n")
    (base / "epochized.yaml").write_text(HEADER + "splits:\n  train:\n    blend_epochized:\n      - {repetitions: 2, path: ./A}\n      - {repetitions: 0.5, path: ./B}\n")
    (base / "weighted.yaml").write_text(HEADER + "splits:\n  train:\n    blend:\n      - {weight: 2, path: ./A, subset: {range: [80%, 100%]}}\n      - {weight: 1, path: ./B}\n")
    for nonmatch in ("skip",):
        join = base / f"join_{nonmatch}.yaml"
        join.write_text(HEADER + f"splits:\n  val:\n    join:\n      - {{path: ./A}}\n      - {{path: ./{SUBSET_OF_A[0]}, nonmatch: {nonmatch}}}\n"
                        "    joiner: {__module__: megatron.energon, __class__: TextSample}\n")
        result = subprocess.run([str(_ENERGON_SCRIPT), "prepare", str(join)], capture_output=True, text=True, timeout=120, input="")
        assert result.returncode == 0, result.stdout + result.stderr  # Energon's join cache
    return base


def _config(module, rank: int, world_size: int, workers: int):
    return module.WorkerConfig(rank=rank, world_size=world_size, num_workers=workers)


@pytest.mark.parametrize(("world_size", "workers", "batch_size"), [(1, 0, 4), (1, 2, 3), (2, 2, 4), (3, 0, 5), (2, 3, 2)])
def test_val_concatenation_equals_energons(root: Path, world_size: int, workers: int, batch_size: int) -> None:
    for rank in range(world_size):
        got = []
        for module in (lite, energon):
            ds = module.get_val_dataset(root / "val.yaml", worker_config=_config(module, rank, world_size, workers), batch_size=batch_size)
            got.append((len(ds), [list(batch.__key__) for batch in module.get_loader(ds)]))
        assert got[0] == got[1], f"rank {rank}"


@pytest.mark.parametrize(("world_size", "workers"), [(1, 2), (2, 2), (1, 3)])
def test_epochized_pass_equals_energons(root: Path, world_size: int, workers: int) -> None:
    """Same len() and, per rank, the same A samples twice each and as many distinct B samples once
    each (which half of B a worker reads depends on its random slice order)."""
    for rank in range(world_size):
        got = []
        for module in (lite, energon):
            ds = module.get_train_dataset(root / "epochized.yaml", worker_config=_config(module, rank, world_size, workers), batch_size=None, shuffle_buffer_size=None, max_samples_per_sequence=None, repeat=False)
            counts = Counter(sample.__key__ for sample in module.get_loader(ds))
            a = {k: v for k, v in counts.items() if k[0] == "A"}
            b_counts = sorted(v for k, v in counts.items() if k[0] == "B")
            got.append((len(ds), a, b_counts))
        assert got[0] == got[1], f"rank {rank}"


@pytest.mark.parametrize(("world_size", "workers", "batch_size"), [(1, 2, 4), (2, 2, 3)])
def test_weighted_blend_len_and_samples_equal_energons(root: Path, world_size: int, workers: int, batch_size: int) -> None:
    """len() is the sum of the datasets' lengths, as Energon's; the blend reads Energon's samples."""
    for rank in range(world_size):
        lengths, keys = [], []
        for module in (lite, energon):
            ds = module.get_train_dataset(root / "weighted.yaml", worker_config=_config(module, rank, world_size, workers), batch_size=batch_size, shuffle_buffer_size=None, max_samples_per_sequence=None)
            lengths.append(len(ds))
            seen: set[str] = set()
            for _, batch in zip(range(200), module.get_loader(ds)):
                seen.update(batch.__key__)
            keys.append(seen)
        assert lengths[0] == lengths[1], f"rank {rank}"
        assert keys[0] == keys[1], f"rank {rank}: after 200 batches both have read all their samples"


# nonmatch: none is not compared: Energon 7.4.1 fails reading such a join ("No valid files found
# in sample ITarSamplePointer(tar_file_id=-1, ...)"); tests/test_join.py covers ours.
@pytest.mark.parametrize("nonmatch", ["skip"])
@pytest.mark.parametrize(("world_size", "workers", "batch_size"), [(1, 0, 4), (2, 2, 3), (1, 3, 5)])
def test_join_equals_energons(root: Path, nonmatch: str, world_size: int, workers: int, batch_size: int) -> None:
    """A join over Energon-prepared datasets (their index.sqlite): the same rows, order and texts."""
    for rank in range(world_size):
        got = []
        for module in (lite, energon):
            ds = module.get_val_dataset(root / f"join_{nonmatch}.yaml", worker_config=_config(module, rank, world_size, workers), batch_size=batch_size)
            got.append((len(ds), [(list(b.__key__), list(b.text)) for b in module.get_loader(ds)]))
        assert got[0] == got[1], f"rank {rank}"
        assert got[0][1], "the join has rows"
        assert all(text.startswith("part ") for _, texts in got[0][1] for text in texts)  # the secondary's field wins
