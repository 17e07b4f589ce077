"""``energon-lite checkpoint info`` / ``redist`` on loader states saved with torch.save and as JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from energon_lite_dev.synthetic import write_tar

from megatron_energon_lite import WorkerConfig, get_savable_loader, get_val_dataset
from megatron_energon_lite.cli.main import cli
from megatron_energon_lite.format.dataset_config import render_dataset_yaml
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.tools.checkpoint import command_redist

pytestmark = [pytest.mark.filterwarnings("ignore:.*pin_memory.*:UserWarning")]


@pytest.fixture
def rank_states(tmp_path: Path) -> list[dict]:
    """The saved state of each of two ranks (one worker each) after two batches."""
    root = tmp_path / "ds"
    write_tar(root / "shards/part_0.tar", [(f"{i:03d}", {"txt": b"x"}) for i in range(8)])
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=render_dataset_yaml("TextSample", {"text": "txt"}))
    states = []
    for rank in range(2):
        config = WorkerConfig(rank=rank, world_size=2, num_workers=1)
        loader = get_savable_loader(get_val_dataset(root, split_part="train", batch_size=1, worker_config=config))
        for _, _batch in zip(range(2), loader):
            pass
        states.append(loader.save_state_rank())
    return states


def test_info_of_per_rank_files_and_a_global_file(rank_states: list[dict], tmp_path: Path) -> None:
    files = []
    for rank, state in enumerate(rank_states):
        files.append(tmp_path / f"state_r{rank}.pt")
        torch.save(state, files[-1])
    result = CliRunner().invoke(cli, ["checkpoint", "info", *map(str, files)])
    assert result.exit_code == 0, result.output
    assert "Per-rank checkpoint files" in result.output and "Number of DP ranks: 2" in result.output
    assert "Number of workers per DP rank: 1" in result.output and "Rank 1 (state_r1.pt)" in result.output

    global_file = tmp_path / "global.json"
    global_file.write_text(json.dumps(rank_states))
    result = CliRunner().invoke(cli, ["checkpoint", "info", str(global_file)])
    assert result.exit_code == 0, result.output
    assert "Global checkpoint" in result.output and "Number of DP ranks: 2" in result.output


def test_redist_is_not_supported_yet_and_says_what_to_do(rank_states: list[dict], tmp_path: Path) -> None:
    global_file = tmp_path / "global.pt"
    torch.save(rank_states, global_file)
    out = tmp_path / "out"
    result = CliRunner().invoke(command_redist, [str(global_file), str(out), "--new-world-size", "1"])
    assert result.exit_code == 1
    assert "not supported yet" in result.output and "2 rank(s) x 1 worker(s)" in result.output and "restore_state_global" in result.output
    assert not out.exists()


def test_a_file_that_is_no_loader_state(tmp_path: Path) -> None:
    other = tmp_path / "model.pt"
    torch.save({"weights": [1, 2]}, other)
    result = CliRunner().invoke(cli, ["checkpoint", "info", str(other)])
    assert result.exit_code == 1 and "not an energon-lite loader state" in result.output and str(other) in result.output


def test_info_describes_each_worker_in_words(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    write_tar(root / "shards/part_0.tar", [(f"{i:03d}", {"txt": b"x"}) for i in range(20)])
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=render_dataset_yaml("TextSample", {"text": "txt"}))
    from megatron_energon_lite import get_train_dataset

    config = WorkerConfig(rank=0, world_size=1, num_workers=0)
    loader = get_savable_loader(get_train_dataset(root, batch_size=2, shuffle_buffer_size=5, max_samples_per_sequence=4, worker_config=config))
    for _, _batch in zip(range(3), loader):
        pass
    state = loader.save_state_rank()
    buffer = state["worker_states"][0]["source"]["source"]["buffer"]
    source = state["worker_states"][0]["source"]["source"]["source"]["source"]
    file = tmp_path / "state.json"
    file.write_text(json.dumps(state))
    result = CliRunner().invoke(cli, ["checkpoint", "info", str(file)])
    assert result.exit_code == 0, result.output
    assert "Saved on: rank 0 of 1, 0 workers per rank" in result.output and "had not ended" in result.output
    assert "Batch: 3 batches made" in result.output
    assert f"Shuffle buffer: {len(buffer)} samples waiting (sample indices {', '.join(str(k[-1]) for k in buffer)})" in result.output
    assert f"Slices: epoch {source['epoch']}, {source['next_slice']} slices opened, {len(source['open'])} open" in result.output
    quiet = CliRunner().invoke(cli, ["checkpoint", "info", "--no-workers", str(file)])
    assert quiet.exit_code == 0 and "Worker 0" not in quiet.output
