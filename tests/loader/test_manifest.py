"""The per-step data manifest (issue 41, items 1 and 2): what get_savable_loader(manifest=DIR)
writes, and read_manifest reads back."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import tarfile
import zlib
from pathlib import Path

import pytest

from megatron_energon_lite import ConfigError, DatasetError, StateError, WorkerConfig, get_savable_loader, get_train_dataset
from megatron_energon_lite import manifest as manifest_module
from megatron_energon_lite.manifest import MANIFEST_ENV, manifest_problems, read_manifest, read_rank_files


def _dataset(path: Path, workers: int, *, rank: int = 0, world_size: int = 1, batch_size: int = 8):
    config = WorkerConfig(rank=rank, world_size=world_size, num_workers=workers)
    return get_train_dataset(path, worker_config=config, batch_size=batch_size, shuffle_buffer_size=5, max_samples_per_sequence=3)


def _run(loader, batches: int) -> list[tuple[tuple, list[str]]]:
    """(restore key, sample keys) of the next ``batches`` batches."""
    it = iter(loader)
    out = []
    for _ in range(batches):
        batch = next(it)
        out.append((batch.__restore_key__, list(batch.__key__)))
    return out


def _keys_in_shard(shard: Path) -> list[str]:
    """The sample keys of a tar shard in order (a member's key: its name up to the first dot)."""
    with tarfile.open(shard) as tar:
        return list(dict.fromkeys(member.name.split(".", 1)[0] for member in tar.getmembers() if member.isfile()))


def _sample_keys(steps) -> list[tuple]:
    return [tuple(s.restore_key for s in step.samples()) for step in steps]


@pytest.mark.parametrize("workers", [0, 2])
def test_each_step_lists_exactly_the_samples_of_its_batch(prepared_text: Path, tmp_path: Path, workers: int) -> None:
    loader = get_savable_loader(_dataset(prepared_text, workers), manifest=tmp_path / "m")
    seen = _run(loader, 12)
    loader.save_state_rank()  # flushes
    steps = list(read_manifest(tmp_path / "m"))
    assert [s.step for s in steps] == list(range(12))
    for step, (key, sample_keys) in zip(steps, seen):
        assert step.batches[0][0] == key
        assert _sample_keys([step])[0] == tuple(key[4:])
        # The listed samples rebuild the batch: the same sample keys.
        assert list(loader.restore_sample(step.batches[0][0]).__key__) == sample_keys
        for sample, sample_key in zip(step.samples(), sample_keys):
            assert sample.dataset == 0 and sample.dataset_path == str(prepared_text)
            assert _keys_in_shard(prepared_text / sample.shard)[sample.index_in_shard] == sample_key


def test_bytes_per_sample_of_a_plain_dataset(prepared_text: Path, tmp_path: Path) -> None:
    loader = get_savable_loader(_dataset(prepared_text, 0, batch_size=8), manifest=tmp_path / "m")
    _run(loader, 30)
    loader.save_state_rank()
    (file,) = read_rank_files(tmp_path / "m")
    data = file.path.read_bytes()
    header = 8 + int.from_bytes(data[4:8], "little") + 4
    per_sample = (len(data) - header) / (30 * 8)
    assert per_sample <= 16, per_sample


def test_blend_names_each_samples_dataset(prepared_blend: Path, tmp_path: Path) -> None:
    loader = get_savable_loader(_dataset(prepared_blend, 2, batch_size=4), manifest=tmp_path / "m")
    seen = _run(loader, 10)
    loader.save_state_rank()
    steps = list(read_manifest(tmp_path / "m"))
    datasets = {s.dataset_path for step in steps for s in step.samples()}
    assert datasets == {str(prepared_blend.parent / "a"), str(prepared_blend.parent / "b")}
    for step, (key, _) in zip(steps, seen):
        assert [s.dataset for s in step.samples()] == [sample[1] for sample in key[4:]]  # ("Blend", k, ...)
        assert all(s.shard.startswith("shards/") and 0 <= s.index_in_shard for s in step.samples())


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resumed_run_continues_the_steps(prepared_blend: Path, tmp_path: Path, workers: int) -> None:
    first = get_savable_loader(_dataset(prepared_blend, workers, batch_size=3), manifest=tmp_path / "m")
    it = iter(first)
    for _ in range(5):
        next(it)
    state = first.save_state_rank()
    assert state["manifest_step"] == 5
    after = [next(it).__restore_key__ for _ in range(4)]  # steps 5..8, written again by the resumed run
    first.save_state_rank()
    del it, first

    resumed = get_savable_loader(_dataset(prepared_blend, workers, batch_size=3), manifest=tmp_path / "m")
    resumed.restore_state_rank(state)
    again = [key for key, _ in _run(resumed, 6)]  # steps 5..10
    resumed.save_state_rank()
    assert again[:4] == after
    files = read_rank_files(tmp_path / "m")
    assert [f.seq for f in files] == [0, 1]
    assert [step for step, _, _ in files[1].records] == list(range(5, 11))
    steps = list(read_manifest(tmp_path / "m"))
    assert [s.step for s in steps] == list(range(11))
    assert [s.batches[0][0] for s in steps[5:]] == again


def test_an_elastic_resume_continues_the_steps(prepared_blend: Path, tmp_path: Path) -> None:
    first = get_savable_loader(_dataset(prepared_blend, 2, batch_size=3), manifest=tmp_path / "m")
    it = iter(first)
    for _ in range(6):
        next(it)
    states = first.save_state_global(0)
    del it, first
    resumed = get_savable_loader(_dataset(prepared_blend, 0, batch_size=3), manifest=tmp_path / "m")  # another worker count
    resumed.restore_state_global(states)
    keys = [key for key, _ in _run(resumed, 3)]
    resumed.save_state_rank()
    steps = list(read_manifest(tmp_path / "m"))
    assert [s.step for s in steps] == list(range(9))
    assert [s.batches[0][0] for s in steps[6:]] == keys
    assert read_rank_files(tmp_path / "m")[1].header["num_workers"] == 0


def test_two_ranks_write_one_folder(prepared_blend: Path, tmp_path: Path) -> None:
    keys = {}
    for rank in (0, 1):
        loader = get_savable_loader(_dataset(prepared_blend, 0, rank=rank, world_size=2, batch_size=3), manifest=tmp_path / "m")
        keys[rank] = [key for key, _ in _run(loader, 4)]
        loader.save_state_rank()
    steps = list(read_manifest(tmp_path / "m"))
    assert [sorted(s.batches) for s in steps] == [[0, 1]] * 4
    assert [[s.batches[r][0] for s in steps] for r in (0, 1)] == [keys[0], keys[1]]
    assert [f.header["rank"] for f in read_rank_files(tmp_path / "m")] == [0, 1]


def test_environment_variable_and_rotation(prepared_text: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MANIFEST_ENV, str(tmp_path / "env"))
    monkeypatch.setattr(manifest_module, "DEFAULT_ROTATE_BYTES", 300)
    monkeypatch.setattr(manifest_module, "FLUSH_EVERY", 2)
    loader = get_savable_loader(_dataset(prepared_text, 0, batch_size=4))
    seen = _run(loader, 40)
    loader.save_state_rank()
    # Another loader of the program (another batch size): its own subfolder, not a refusal.
    other = get_savable_loader(_dataset(prepared_text, 0, batch_size=2))
    _run(other, 1)
    other.save_state_rank()
    folders = sorted((tmp_path / "env").iterdir())
    assert len(folders) == 2 and all(f.name.startswith("train-") for f in folders)
    (folder,) = [f for f in folders if len(read_rank_files(f)) > 1]
    files = read_rank_files(folder)
    assert not manifest_problems(files)
    assert [s.batches[0][0] for s in read_manifest(folder)] == [key for key, _ in seen]


def test_a_folder_of_another_run_is_refused_naming_both(prepared_text: Path, prepared_blend: Path, tmp_path: Path) -> None:
    get_savable_loader(_dataset(prepared_text, 0), manifest=tmp_path / "m")
    with pytest.raises(ConfigError) as error:
        get_savable_loader(_dataset(prepared_blend, 0), manifest=tmp_path / "m")
    message = str(error.value)
    assert str(prepared_text) in message and str(prepared_blend.parent / "a") in message and str(tmp_path / "m") in message
    with pytest.raises(ConfigError, match="batch_size: 8 there, 4 here"):
        get_savable_loader(_dataset(prepared_text, 0, batch_size=4), manifest=tmp_path / "m")
    get_savable_loader(_dataset(prepared_text, 2), manifest=tmp_path / "m")  # another topology: the same run


def _one_file(path: Path, folder: Path, batches: int):
    """A loader that delivered ``batches`` batches of 4 into the manifest ``folder``; its batch
    keys, its one file and that file's bytes."""
    loader = get_savable_loader(_dataset(path, 0, batch_size=4), manifest=folder)
    seen = [key for key, _ in _run(loader, batches)]
    loader.save_state_rank()
    (file,) = read_rank_files(folder)
    return loader, seen, file, file.path.read_bytes()


def test_torn_tail_keeps_the_valid_prefix(prepared_text: Path, tmp_path: Path) -> None:
    loader, seen, file, whole = _one_file(prepared_text, tmp_path / "m", 6)
    header = 8 + int.from_bytes(whole[4:8], "little") + 4
    clean = 0
    for cut in range(header, len(whole)):
        file.path.write_bytes(whole[:cut])
        (torn,) = read_rank_files(tmp_path / "m")
        keys = [key for _, key, _ in torn.records]
        assert keys == seen[: len(keys)]
        if torn.problem is None:
            clean += 1
        else:
            assert "torn or damaged" in torn.problem and str(file.path) in torn.problem
    # Only cuts between records leave no torn tail: after the header, the one key shape, and
    # each of the first 5 batches.
    assert clean == 7
    file.path.write_bytes(whole[:-1])
    (torn,) = read_rank_files(tmp_path / "m")
    assert torn.problem is not None and [key for _, key, _ in torn.records] == seen[:5]


_KILLED_WRITER = """
import os, signal, sys
from megatron_energon_lite import WorkerConfig, get_savable_loader, get_train_dataset
dataset = get_train_dataset(sys.argv[1], worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), batch_size=4, shuffle_buffer_size=5, max_samples_per_sequence=3)
loader = get_savable_loader(dataset, manifest=sys.argv[2])
it = iter(loader)
for _ in range(7):
    key = next(it).__restore_key__
    print(repr(key), flush=True)
loader.save_state_rank()  # every record so far is on disk, the writer's thread is idle
# Killed in the middle of a record: half of the next one written, as a kill mid-write leaves it.
writer = loader._manifest
record = writer.encode(7, key)
os.write(writer._fd, record[: len(record) // 2])
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_writer_leaves_a_torn_tail_that_is_ignored(prepared_text: Path, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(prepared_text), str(tmp_path / "m")], capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr
    printed = done.stdout.splitlines()
    files = read_rank_files(tmp_path / "m")
    (problem,) = manifest_problems(files)
    assert "torn or damaged" in problem
    assert [repr(s.batches[0][0]) for s in read_manifest(tmp_path / "m")] == printed
    assert os.path.getsize(files[0].path) > 0


def test_the_saved_step_is_checked_and_a_state_without_it_counts_from_zero(prepared_text: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    plain = get_savable_loader(_dataset(prepared_text, 0))
    _run(plain, 2)
    state = plain.save_state_rank()
    assert "manifest_step" not in state  # loaders without a manifest keep the state's shape
    with pytest.raises(StateError, match="manifest_step"):
        get_savable_loader(_dataset(prepared_text, 0), manifest=tmp_path / "m").restore_state_rank({**state, "manifest_step": -1})
    loader = get_savable_loader(_dataset(prepared_text, 0), manifest=tmp_path / "m")
    loader.restore_state_rank(state)
    assert "records no manifest step" in caplog.text
    _run(loader, 1)
    loader.save_state_rank()
    assert [s.step for s in read_manifest(tmp_path / "m")] == [0]


def test_a_full_disk_is_raised_in_the_loop_not_hung(prepared_text: Path, small_disk: Path) -> None:
    loader = get_savable_loader(_dataset(prepared_text, 0), manifest=small_disk / "m")
    with open(small_disk / "filler", "wb", buffering=0) as filler:  # fill the disk after run.json
        try:
            while True:
                filler.write(b"\0" * 4096)
        except OSError:
            pass
    with pytest.raises(DatasetError, match="manifest could not be written"):
        _run(loader, 3)
        loader.save_state_rank()


def test_a_truncated_or_garbled_header_is_reported_not_raised(prepared_text: Path, tmp_path: Path) -> None:
    _, _, file, whole = _one_file(prepared_text, tmp_path / "m", 3)
    header_end = 8 + int.from_bytes(whole[4:8], "little") + 4
    for cut in (2, 10, header_end - 1):
        file.path.write_bytes(whole[:cut])
        (torn,) = read_rank_files(tmp_path / "m")
        assert torn.records == [] and str(file.path) in torn.problem, cut
    # A header whose CRC matches but that is no JSON object (a hostile or foreign file).
    for body in (b"not json", b"[1, 2]"):
        file.path.write_bytes(b"EMF1" + struct.pack("<I", len(body)) + body + struct.pack("<I", zlib.crc32(body)) + whole[header_end:])
        (bad,) = read_rank_files(tmp_path / "m")
        assert bad.records == [] and "not a manifest header" in bad.problem
    assert list(read_manifest(tmp_path / "m")) == []


def test_a_file_of_another_run_in_the_folder_is_left_out_naming_both(prepared_text: Path, prepared_blend: Path, tmp_path: Path) -> None:
    ours = get_savable_loader(_dataset(prepared_text, 0, batch_size=4), manifest=tmp_path / "m")
    seen = [key for key, _ in _run(ours, 3)]
    ours.save_state_rank()
    theirs = get_savable_loader(_dataset(prepared_blend, 0, batch_size=4), manifest=tmp_path / "other")
    _run(theirs, 5)
    theirs.save_state_rank()
    (foreign,) = read_rank_files(tmp_path / "other")
    (tmp_path / "m" / "rank00000-00007.emf").write_bytes(foreign.path.read_bytes())  # copied in by mistake
    files = read_rank_files(tmp_path / "m")
    (problem,) = manifest_problems(files)
    assert "rank00000-00007.emf" in problem and str(prepared_blend.parent / "a") in problem and str(prepared_text) in problem
    assert [step.batches[0][0] for step in read_manifest(tmp_path / "m")] == seen  # the foreign steps 0..4 are not mixed in


def test_read_manifest_streams_and_reports_what_it_leaves_out(prepared_text: Path, tmp_path: Path) -> None:
    loader, seen, file, whole = _one_file(prepared_text, tmp_path / "m", 6)
    file.path.write_bytes(whole[:-3])  # the last record torn
    problems: list[str] = []
    steps = read_manifest(tmp_path / "m", problems=problems)
    assert next(steps).batches[0][0] == seen[0] and problems == []  # read as asked for
    assert [s.batches[0][0] for s in steps] == seen[1:5]
    (problem,) = problems
    assert "torn or damaged" in problem and str(file.path) in problem
    # A record whose step does not follow the one before (a damaged or hostile file) ends it.
    records = read_rank_files(tmp_path / "m")[0].records
    writer = manifest_module.ManifestWriter(tmp_path / "m", rank=0, world_size=1, num_workers=0, config=loader.config(), data=loader.savable_dataset.data_record(), datasets=[])
    for step in (0, 1, 1):
        writer.add(step, records[0][1])
    writer.close()
    problems = []
    assert len(list(read_manifest(tmp_path / "m", problems=problems))) == 5
    assert any("step 1 after step 1" in p for p in problems)


def test_two_loaders_of_one_rank_made_before_either_writes_take_their_own_files(prepared_text: Path, tmp_path: Path) -> None:
    first = get_savable_loader(_dataset(prepared_text, 0, batch_size=4), manifest=tmp_path / "m")
    second = get_savable_loader(_dataset(prepared_text, 0, batch_size=4), manifest=tmp_path / "m")  # made before first writes
    first_keys = [key for key, _ in _run(first, 2)]
    first.save_state_rank()
    second_keys = [key for key, _ in _run(second, 3)]
    second.save_state_rank()  # raised FileExistsError when both took file 0
    files = read_rank_files(tmp_path / "m")
    assert [(f.seq, len(f.records)) for f in files] == [(0, 2), (1, 3)]
    assert [s.batches[0][0] for s in read_manifest(tmp_path / "m")] == second_keys  # the later file wins
    assert first_keys == second_keys[:2]
