"""``energon-lite analyze-debug`` on real debug logs of our loader, and on hand-written Energon records."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from energon_lite_dev.synthetic import write_tar
from PIL import Image

from megatron_energon_lite import WorkerConfig, get_savable_loader, get_val_dataset
from megatron_energon_lite.cli.main import cli
from megatron_energon_lite.format.dataset_config import render_dataset_yaml
from megatron_energon_lite.format.prepare import prepare_dataset

pytestmark = [pytest.mark.filterwarnings("ignore:.*pin_memory.*:UserWarning")]


def _run(*args: str, input: str | None = None):
    return CliRunner().invoke(cli, ["analyze-debug", *args], input=input, catch_exceptions=False)


def _write_log(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    """Two passes of a val loader with two workers over 12 samples, logged at level 2."""
    root = tmp_path / "ds"
    for shard in range(2):
        write_tar(root / f"shards/part_{shard}.tar", [(f"{shard}_{i:03d}", {"txt": b"x"}) for i in range(6)])
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=render_dataset_yaml("TextSample", {"text": "txt"}))
    config = WorkerConfig(rank=0, world_size=1, num_workers=2, worker_log_level=2, worker_debug_path=str(tmp_path / "log/{worker_id}.jsonl"))
    loader = get_savable_loader(get_val_dataset(root, split_part="train", batch_size=3, worker_config=config))
    for _ in range(2):
        for _batch in loader:
            pass
    return tmp_path / "log"


def test_counts_keys_and_steps_of_the_loader(logs: Path, tmp_path: Path) -> None:
    heatmap = tmp_path / "heat.png"
    result = _run(str(logs), "--include-modality", "val", "--heatmap-path", str(heatmap))
    assert result.exit_code == 0, result.output
    assert "Analyzing 3 logs" in result.output
    assert "Found 12 unique sample keys, 8 steps" in result.output  # 4 batches per pass, 2 passes
    pixels = np.asarray(Image.open(heatmap))
    assert pixels.shape == (12, 8, 3)
    assert (pixels.sum(axis=2) > 0).sum() == 24  # every key once per pass


def test_bins_large_logs_and_skips_steps(logs: Path, tmp_path: Path) -> None:
    heatmap = tmp_path / "small.png"
    result = _run(str(logs), "--include-modality", "val", "--heatmap-path", str(heatmap), "--heatmap-steps", "3", "--heatmap-samples", "5", "--skip", "4")
    assert result.exit_code == 0, result.output
    assert "Found 12 unique sample keys, 4 steps" in result.output  # the second pass only
    assert np.asarray(Image.open(heatmap)).shape == (4, 2, 3)  # 12 keys at 3 per row, 4 steps at 2 per column


def test_train_modality_finds_no_loader_of_a_val_run(logs: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["analyze-debug", str(logs), "--heatmap-path", str(tmp_path / "h.png")])
    assert result.exit_code == 1
    assert "no data found" in result.output and "--include-modality val" in result.output


def test_worker_records_when_the_main_process_did_not_log(tmp_path: Path) -> None:
    for worker in range(2):
        _write_log(tmp_path / f"log/{worker + 1}.jsonl", [{"t": "yield_batch", "r": 0, "w": worker, "m": "train", "idx": i, "keys": [f"w{worker}_{i}"]} for i in range(3)])
    result = _run(str(tmp_path / "log"), "--heatmap-path", str(tmp_path / "h.png"))
    assert result.exit_code == 0, result.output
    assert "yield_batch" in result.output and "Found 6 unique sample keys, 3 steps" in result.output


def test_energon_sample_loader_records_give_the_loading_order(tmp_path: Path) -> None:
    kind = "WebdatasetSampleLoaderDataset._slices_iter.yield"
    _write_log(tmp_path / "a.jsonl", [{"t": kind, "r": 0, "w": 0, "index": i, "key": f"s/{i % 4}", "shard": "s", "count": i, "epoch": 0, "epoch_count": i} for i in range(6)])
    result = _run(str(tmp_path / "a.jsonl"), "--force-loading-order", "--no-colors", "--heatmap-path", str(tmp_path / "h.png"))
    assert result.exit_code == 0, result.output
    assert "Found 4 unique sample keys, 6 steps" in result.output
    assert {tuple(p) for p in np.asarray(Image.open(tmp_path / "h.png")).reshape(-1, 3)} <= {(0, 0, 0), (255, 255, 255)}


def test_asks_which_loader_when_several_match(tmp_path: Path) -> None:
    records = []
    for loader_id, path in ((0, "/a"), (1, "/b")):
        records.append({"t": "SavableLoader.__init__", "r": 0, "w": None, "id": loader_id, "config": {"map_fn_config": {"training": True, "_path": path}}})
        records += [{"t": "SavableDataLoader.yield", "r": 0, "w": None, "id": loader_id, "global_idx": i, "keys": [f"{path}/{i}", f"{path}/{i + 1}"]} for i in range(2 + loader_id)]
    _write_log(tmp_path / "0.jsonl", records)
    result = _run(str(tmp_path), "--heatmap-path", str(tmp_path / "h.png"), input="1\n")
    assert result.exit_code == 0, result.output
    assert "Choose loader id" in result.output and "Reading for loader 1: train /b" in result.output
    assert "Found 4 unique sample keys, 3 steps" in result.output


def test_no_logs_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(cli, ["analyze-debug", str(tmp_path / "empty")])
    assert result.exit_code == 1 and "no *.jsonl log files" in result.output
