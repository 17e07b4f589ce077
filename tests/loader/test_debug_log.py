"""Debug log records of the loader and its workers (``WorkerConfig(worker_log_level=...)``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from energon_lite_dev.synthetic import write_tar

from megatron_energon_lite import (
    SavableDataLoader,
    WorkerConfig,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
)
from megatron_energon_lite.loader.debug_log import dataset_mode_and_path, find_config_value
from megatron_energon_lite.format.dataset_config import render_dataset_yaml
from megatron_energon_lite.format.prepare import prepare_dataset

pytestmark = [pytest.mark.filterwarnings("ignore:.*pin_memory.*:UserWarning")]


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    """Three shards of six text samples, prepared as one train split."""
    root = tmp_path / "ds"
    for shard in range(3):
        write_tar(root / f"shards/part_{shard}.tar", [(f"{shard}_{i:03d}", {"txt": f"t {shard} {i}".encode()}) for i in range(6)])
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=render_dataset_yaml("TextSample", {"text": "txt"}))
    return root


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _config(tmp_path: Path, level: int, num_workers: int = 2) -> WorkerConfig:
    return WorkerConfig(rank=0, world_size=1, num_workers=num_workers, worker_log_level=level, worker_debug_path=str(tmp_path / "log/{worker_id}.jsonl"))


def test_loader_records_every_batch_per_pass(dataset: Path, tmp_path: Path) -> None:
    SavableDataLoader._next_id = 0
    loader = get_savable_loader(get_val_dataset(dataset, split_part="train", batch_size=4, worker_config=_config(tmp_path, 1)))
    passes = [[batch.__key__ for batch in loader] for _ in range(2)]

    main = _records(tmp_path / "log/0.jsonl")
    init = main[0]
    assert init["t"] == "SavableLoader.__init__" and init["id"] == 0 and init["w"] is None
    assert init["config"]["map_fn_config"] == {"training": False, "_path": str(dataset)}
    kinds = [r["t"] for r in main]
    assert kinds.count("SavableDataLoader.iter") == 2 and kinds.count("SavableDataLoader.StopIteration") == 2
    yields = [r for r in main if r["t"] == "SavableDataLoader.yield"]
    assert [r["global_idx"] for r in yields] == list(range(len(yields)))
    by_pass = [[r["keys"] for r in yields if r["iter_id"] == iter_id] for iter_id in (1, 2)]
    assert by_pass == passes
    assert [r["idx"] for r in yields] == [*range(len(passes[0])), *range(len(passes[1]))]
    # Level 1 and a validation dataset: the workers write nothing (Energon logs their batches at 2).
    assert sorted(p.name for p in (tmp_path / "log").iterdir()) == ["0.jsonl"]


def test_workers_log_their_batches(dataset: Path, tmp_path: Path) -> None:
    loader = get_savable_loader(get_val_dataset(dataset, split_part="train", batch_size=4, worker_config=_config(tmp_path, 2)))
    batches = [batch.__key__ for batch in loader]
    worker_logs = {name: _records(tmp_path / "log" / name) for name in ("1.jsonl", "2.jsonl")}
    for worker, (name, records) in enumerate(sorted(worker_logs.items())):
        assert {r["t"] for r in records} == {"yield_batch"}
        assert all(r["m"] == "val" and r["w"] == worker and r["r"] == 0 for r in records)
        assert [r["idx"] for r in records] == list(range(len(records)))
    logged = sorted(tuple(r["keys"]) for records in worker_logs.values() for r in records)
    assert logged == sorted(tuple(keys) for keys in batches)


def test_train_workers_log_at_level_one_and_level_zero_writes_nothing(dataset: Path, tmp_path: Path) -> None:
    train = get_train_dataset(dataset, batch_size=2, shuffle_buffer_size=None, max_samples_per_sequence=None, worker_config=_config(tmp_path, 1, num_workers=0))
    loader = get_savable_loader(train)
    for _, _batch in zip(range(3), loader):
        pass
    records = _records(tmp_path / "log/0.jsonl")  # no worker processes: all in the main file
    assert [r["m"] for r in records if r["t"] == "yield_batch"] == ["train"] * 3
    assert records[0]["config"]["map_fn_config"]["training"] is True

    quiet = tmp_path / "quiet"
    config = WorkerConfig(rank=0, world_size=1, num_workers=0, worker_debug_path=str(quiet / "{worker_id}.jsonl"))
    for _ in get_savable_loader(get_val_dataset(dataset, split_part="train", batch_size=4, worker_config=config)):
        pass
    assert not quiet.exists()


def test_mode_and_path_of_a_config_without_spec() -> None:
    class Wrapper:
        def config(self) -> dict:
            return {"type": "X", "dataset": {"map_fn_config": {"training": True, "_path": "/data/a"}}}

    assert dataset_mode_and_path(Wrapper()) == (True, "/data/a")
    assert find_config_value({"datasets": [{"x": 1}, {"path": "p"}]}, ("path",)) == "p"
    assert find_config_value({"a": {"b": 1}}, ("path",)) is None
