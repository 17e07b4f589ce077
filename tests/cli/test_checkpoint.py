"""``energon-lite checkpoint info`` / ``redist`` on loader states saved with torch.save and as JSON."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from energon_lite_dev.synthetic import write_tar

from megatron_energon_lite import WorkerConfig, get_savable_loader, get_train_dataset, get_val_dataset
from megatron_energon_lite.cli.main import cli
from megatron_energon_lite.format.dataset_config import render_dataset_yaml
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.energon.tools.checkpoint import command_redist

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
        # Stop the worker now: a loader dropped mid-pass is otherwise shut down whenever the
        # garbage collector finds it, inside some later test.
        del loader, _batch
        gc.collect()
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


def _val_loader(root: Path, rank: int, world: int, workers: int):
    config = WorkerConfig(rank=rank, world_size=world, num_workers=workers)
    return get_savable_loader(get_val_dataset(root, split_part="train", batch_size=1, worker_config=config))


@pytest.mark.parametrize(("world", "workers", "suffix", "as_global"), [(1, 2, ".json", True), (3, 0, ".pt", False), (2, 3, ".pt", True)])
@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
def test_redist_makes_states_that_finish_the_pass_on_the_new_topology(rank_states: list[dict], tmp_path: Path, world: int, workers: int, suffix: str, as_global: bool) -> None:
    # The fixture's two ranks delivered samples 000, 001 (rank 0) and 004, 005 (rank 1).
    if as_global:
        inputs = [tmp_path / f"global{suffix}"]
        inputs[0].write_text(json.dumps(rank_states)) if suffix == ".json" else torch.save(rank_states, inputs[0])
    else:
        inputs = [tmp_path / f"state_r{rank}{suffix}" for rank in range(2)]
        for state, file in zip(rank_states, inputs):
            torch.save(state, file)
    out = tmp_path / "out"
    if world == 2:  # the spelling of the issue and of Energon's option names
        arguments = [*map(str, inputs), "--world-size", str(world), "--num-workers", str(workers), "-o", str(out)]
    else:
        arguments = [*map(str, inputs), str(out), "--new-world-size", str(world), "--new-num-workers", str(workers)]
    result = CliRunner().invoke(cli, ["checkpoint", "redist", *arguments])
    assert result.exit_code == 0, result.output
    assert f"2 rank(s) x 1 worker(s) -> {world} rank(s) x {workers} worker(s)" in result.output
    if as_global:
        written = out / inputs[0].name
        states = json.loads(written.read_text()) if suffix == ".json" else torch.load(written, weights_only=True)
    else:
        states = [torch.load(out / f"state_r{rank}{suffix}", weights_only=True) for rank in range(world)]  # named like the inputs
    assert len(states) == world
    info = CliRunner().invoke(cli, ["checkpoint", "info", *([str(out / inputs[0].name)] if as_global else [str(out / f"state_r{r}{suffix}") for r in range(world)])])
    # 2 global workers again: the worker states move as they are; else the rest is divided on restore.
    assert info.exit_code == 0 and ("Moved" if world * max(1, workers) == 2 else "Redistributed") in info.output, info.output
    assert "from a checkpoint of 2 rank(s) x 1 worker(s)" in info.output, info.output
    after = []
    for rank in range(world):
        loader = _val_loader(tmp_path / "ds", rank, world, workers)
        loader.restore_state_rank(states[rank])
        after += [key for batch in loader for key in batch.__key__]
    assert sorted(["000", "001", "004", "005", *after]) == [f"{i:03d}" for i in range(8)]


def test_a_redistributed_state_refuses_another_rank_or_topology(rank_states: list[dict], tmp_path: Path) -> None:
    from megatron_energon_lite import StateError
    from megatron_energon_lite.loader.elastic import redistribute

    states = redistribute(rank_states, 3, 0)
    with pytest.raises(StateError, match="rank 1 of 3 rank"):
        _val_loader(tmp_path / "ds", 0, 3, 0).restore_state_rank(states[1])
    with pytest.raises(StateError, match="rank 0 of 3 rank"):
        _val_loader(tmp_path / "ds", 0, 2, 0).restore_state_rank(states[0])
    assert redistribute(rank_states, 2, 1) == rank_states  # the same topology: unchanged


def test_redist_refuses_bad_requests(rank_states: list[dict], tmp_path: Path) -> None:
    global_file = tmp_path / "global.json"
    out = tmp_path / "out"
    global_file.write_text(json.dumps(rank_states[1:]))  # rank 1 only
    result = CliRunner().invoke(command_redist, [str(global_file), str(out), "--new-world-size", "1"])
    assert result.exit_code == 1 and "every rank once" in result.output and "missing [0]" in result.output, result.output
    global_file.write_text(json.dumps(rank_states))
    result = CliRunner().invoke(command_redist, [str(global_file), str(out)])
    assert result.exit_code == 1 and "--new-world-size" in result.output
    result = CliRunner().invoke(command_redist, [str(global_file), str(out), "--new-world-size", "3"])  # 2 workers over 3 ranks
    assert result.exit_code == 1 and "2 global workers do not divide over 3 ranks" in result.output and "--new-num-workers" in result.output
    other = [rank_states[0], {**rank_states[1], "config": {**rank_states[1]["config"], "batch_size": 3}}]
    global_file.write_text(json.dumps(other))
    result = CliRunner().invoke(command_redist, [str(global_file), str(out), "--new-world-size", "1"])
    assert result.exit_code == 1 and "batch_size" in result.output, result.output
    assert not out.exists()
    result = CliRunner().invoke(command_redist, [str(global_file), "--new-world-size", "1"])  # no output folder
    assert result.exit_code == 2 and "output folder" in result.output, result.output
    result = CliRunner().invoke(command_redist, [str(global_file), "-o", str(global_file), "--new-world-size", "1"])
    assert result.exit_code == 2 and "is a file" in result.output, result.output
    result = CliRunner().invoke(command_redist, [str(tmp_path / "missing.json"), str(out), "--new-world-size", "1"])
    assert result.exit_code == 2 and "missing.json" in result.output and "does not exist" in result.output, result.output


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


def test_info_shows_where_a_scheduled_blend_stands(tmp_path: Path) -> None:
    """A then B (a step schedule switching at global sample 8), two ranks of batch 2, three steps
    each: the job took 12 samples, 8 of A; A's target so far is 8 / 12 and 0 from now on."""
    for name in "AB":
        root = tmp_path / name
        write_tar(root / "shards/part_0.tar", [(f"{name}{i:03d}", {"txt": b"x"}) for i in range(20)])
        prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=render_dataset_yaml("TextSample", {"text": "txt"}))
    path = tmp_path / "scheduled.yaml"
    path.write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
        "      - {weight: {step: {0: 1, 8: 0}}, path: ./A}\n      - {weight: {step: {0: 0, 8: 1}}, path: ./B}\n"
    )
    loaders = [get_savable_loader(get_train_dataset(path, batch_size=2, shuffle_buffer_size=None, max_samples_per_sequence=None, worker_config=WorkerConfig(rank=rank, world_size=2, num_workers=0))) for rank in range(2)]
    iterators = [iter(loader) for loader in loaders]
    taken = [key for _ in range(3) for it in iterators for key in next(it).__key__]
    assert "".join(key[0] for key in taken) == "A" * 8 + "B" * 4
    state_file = tmp_path / "global.json"
    state_file.write_text(json.dumps([loader.save_state_rank() for loader in loaders]))
    result = CliRunner().invoke(cli, ["checkpoint", "info", "--no-workers", str(state_file)])
    assert result.exit_code == 0, result.output
    assert "Blend (blend, mode random) at clock 12 (its place in the global stream: samples the blend yielded, shuffle buffers included; the weight schedules read it):" in result.output
    assert f"ds0 {tmp_path / 'A'} [train]: 8 samples, share 0.667; target so far 0.667, now 0.000" in result.output
    assert f"ds1 {tmp_path / 'B'} [train]: 4 samples, share 0.333; target so far 0.333, now 1.000" in result.output
    rank_file = tmp_path / "rank0.json"
    rank_file.write_text(json.dumps(loaders[0].save_state_rank()))
    one_rank = CliRunner().invoke(cli, ["checkpoint", "info", "--no-workers", str(rank_file)])
    assert "at clock 12 (" in one_rank.output and "the weight schedules read it), this rank's samples of 2 ranks:" in one_rank.output
