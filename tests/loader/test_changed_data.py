"""Data that changed between save and restore, continued on the opt-ins (loader/changed_data.py):
``join_new_shards`` (appended shards join the running epoch) and ``allow_data_change``
(shards changed, removed or moved: the running epoch continues by shard, the rest is counted).

The loaders here do not repeat (``repeat=False``): a run ends with its epoch, so "the rest of the
running epoch" is everything a restored loader yields (the blend test, whose datasets repeat,
reads until no dataset reads what was carried over)."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import re
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from energon_lite_dev.states import carried_datasets
from energon_lite_dev.synthetic import prepare_text, sized_keys, write_tar, write_text_blend, write_text_shard
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from megatron_energon_lite import DefaultTaskEncoder, NotSupportedError, StateError, WorkerConfig, get_savable_loader, get_train_dataset
from megatron_energon_lite.loader.changed_data import ShardMap
from megatron_energon_lite.loader.env_settings import DATA_CHANGE_ENV, JOIN_NEW_SHARDS_ENV

SHARD = 25


def keys_of(first: int, count: int = SHARD) -> set[str]:
    return {f"{i:05d}" for i in range(first, first + count)}


def dataset(root: Path, shards: int = 4) -> Path:
    for k in range(shards):
        write_text_shard(root, f"data-{k}", 100 * k, SHARD)
    prepare_text(root)
    return root


def loader(root: Path, workers: int, *, shuffle: int | None = 8, world_size: int = 1, rank: int = 0):
    config = WorkerConfig(rank=rank, world_size=world_size, num_workers=workers)
    return get_savable_loader(get_train_dataset(root, worker_config=config, batch_size=4, shuffle_buffer_size=shuffle, max_samples_per_sequence=4, repeat=False))


def keys(run, batches: int | None = None) -> list[str]:
    return [key for batch in itertools.islice(run, batches) for key in batch.__key__]


def restored(root: Path, state, workers: int, shuffle: int | None = 8, **options):
    run = loader(root, workers, shuffle=shuffle)
    run.restore_state_rank(state, **options)
    return run


def check_continues_exactly(root: Path, state, workers: int, shuffle: int | None, **options) -> list[str]:
    """Everything a loader restored from ``state`` yields; a save after a few of its batches,
    restored in a fresh loader, must yield exactly what the first went on to yield."""
    whole = keys(restored(root, state, workers, shuffle, **options))
    partway = restored(root, state, workers, shuffle, **options)
    head = keys(partway, 3)
    again = partway.save_state_rank()
    assert head + keys(restored(root, again, workers, shuffle)) == whole
    return whole


def save_after(root: Path, workers: int, batches: int, shuffle: int | None = 8) -> tuple[list[str], dict]:
    run = loader(root, workers, shuffle=shuffle)
    before = keys(run, batches)
    return before, run.save_state_rank()


#: (workers, shuffle buffer size) the parametrised tests run with.
TOPOLOGIES = [(0, None), (2, 8)]


@pytest.mark.parametrize(("workers", "shuffle"), TOPOLOGIES)
@pytest.mark.parametrize("batches", [1, 6])
def test_new_shards_join_the_running_epoch(tmp_path: Path, caplog: pytest.LogCaptureFixture, workers: int, batches: int, shuffle: int | None) -> None:
    """Every saved-epoch sample once across the two runs, and both appended shards' samples
    within the running epoch, each once; the restored run saves and restores exactly."""
    root = dataset(tmp_path / "ds")
    before, state = save_after(root, workers, batches, shuffle)
    write_text_shard(root, "data-4", 400, SHARD)
    write_text_shard(root, "data-5", 500, 7)
    prepare_text(root)
    with caplog.at_level(logging.INFO, logger="megatron_energon_lite.loader"):
        after = check_continues_exactly(root, state, workers, shuffle, join_new_shards=True)
    assert "2 new shard(s) (32 samples) join the running epoch" in caplog.text
    delivered = Counter(before + after)
    assert delivered == Counter(sorted(set().union(*(keys_of(100 * k) for k in range(5)), keys_of(500, 7))))
    # The new samples are mixed into the rest, not all left to its end.
    new_places = [i for i, key in enumerate(after) if key >= "00400"]
    assert new_places[0] < len(after) - 32


@pytest.mark.parametrize("workers", [0, 2])
def test_without_the_opt_in_new_shards_wait_for_the_next_epoch(tmp_path: Path, workers: int) -> None:
    """Saved after one batch (with two workers the second had not yielded: its whole epoch is
    left), the running epoch finishes on the saved shards, each sample once."""
    root = dataset(tmp_path / "ds")
    before, state = save_after(root, workers, 1)
    write_text_shard(root, "data-4", 400, SHARD)
    prepare_text(root)
    after = keys(restored(root, state, workers))
    assert Counter(before + after) == Counter(sorted(set().union(*(keys_of(100 * k) for k in range(4)))))


def test_the_join_opt_in_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = dataset(tmp_path / "ds")
    before, state = save_after(root, 0, 2)
    write_text_shard(root, "data-4", 400, SHARD)
    prepare_text(root)
    monkeypatch.setenv(JOIN_NEW_SHARDS_ENV, "1")
    assert keys_of(400) <= set(keys(restored(root, state, 0)))


#: How the data changes after the save: (shard name, first key, count) written, and shards removed.
CHANGES = {
    # data-1 rewritten with fewer samples, data-3 gone, data-5 new (sorts last).
    "resized_removed_new": ([("data-1", 100, 20), ("data-5", 500, 10)], ["data-3"]),
    # data-0a sorts between data-0 and data-1: every later shard moves; data-2 gone.
    "inserted_moved": ([("data-0a", 50, 10)], ["data-2"]),
}


@pytest.mark.parametrize(("workers", "shuffle"), TOPOLOGIES)
@pytest.mark.parametrize("change", sorted(CHANGES))
@pytest.mark.parametrize("join", [False, True])
def test_changed_data_continues_by_shard(tmp_path: Path, caplog: pytest.LogCaptureFixture, workers: int, shuffle: int | None, change: str, join: bool) -> None:
    """Each undelivered sample of a shard kept (same name and count, wherever it is now) comes
    once; those of changed and removed shards do not come, and the log counts them exactly; new
    shards come within the running epoch only with join_new_shards."""
    root = dataset(tmp_path / "ds")
    before, state = save_after(root, workers, 5, shuffle)
    written, removed = CHANGES[change]
    for name, first, count in written:
        write_text_shard(root, name, first, count)
    for name in removed:
        (root / f"parts/{name}.tar").unlink()
    prepare_text(root)
    with caplog.at_level(logging.INFO, logger="megatron_energon_lite.loader"):
        after = check_continues_exactly(root, state, workers, shuffle, allow_data_change=True, join_new_shards=join)
    saved = {f"data-{k}": keys_of(100 * k) for k in range(4)}
    gone = {name: saved[name] for name in removed} | {name: saved[name] for name, _, _ in written if name in saved}
    kept = set().union(*(k for name, k in saved.items() if name not in gone))
    new = set().union(*(keys_of(first, count) for name, first, count in written if name not in saved))
    assert Counter(after) == Counter(sorted((kept - set(before)) | (new if join else set())))
    lost = {name: len(k - set(before)) for name, k in gone.items()}
    for name, count in lost.items():
        assert re.search(rf"shard parts/{name}\.tar(: 25 samples then, \d+ now| gone): {count} undelivered sample\(s\) not delivered", caplog.text), (name, count, caplog.text)
    assert f"{sum(lost.values())} sample(s) of the saved running epoch not delivered in all" in caplog.text


@pytest.mark.parametrize("how", ["global", "rank", "one_rank"])
def test_changed_data_over_two_ranks(tmp_path: Path, how: str) -> None:
    """Two ranks of two workers: restored through restore_state_global (the rest divided over
    every rank; "one_rank": on one rank without workers) or each rank's restore_state_rank (each
    keeps its rest), every kept sample of the running epoch comes once over both ranks, and the
    new shard's samples too (joined)."""
    root = dataset(tmp_path / "ds")
    ranks = [loader(root, 2, world_size=2, rank=rank) for rank in range(2)]
    before = [key for run in ranks for key in keys(run, 3)]
    states = [run.save_state_rank() for run in ranks]
    (root / "parts/data-0.tar").unlink()
    write_text_shard(root, "data-4", 400, 10)
    prepare_text(root)
    after = []
    for rank in range(1 if how == "one_rank" else 2):
        run = loader(root, 0, world_size=1) if how == "one_rank" else loader(root, 2, world_size=2, rank=rank)
        if how != "rank":
            run.restore_state_global(states, allow_data_change=True, join_new_shards=True)
        else:
            run.restore_state_rank(states[rank], allow_data_change=True, join_new_shards=True)
        after += keys(run)
    kept = set().union(*(keys_of(100 * k) for k in (1, 2, 3)))
    assert Counter(after) == Counter(sorted((kept - set(before)) | keys_of(400, 10)))


def test_the_refusal_names_the_opt_in_and_the_environment_grants_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = dataset(tmp_path / "ds")
    _, state = save_after(root, 0, 3)
    (root / "parts/data-2.tar").unlink()
    prepare_text(root)
    monkeypatch.delenv(DATA_CHANGE_ENV, raising=False)
    with pytest.raises(StateError) as info:
        restored(root, state, 0)
    message = str(info.value)
    assert "shard parts/data-2.tar gone (25 samples)" in message and "allow_data_change=True" in message and f"{DATA_CHANGE_ENV}=1" in message, message
    with pytest.raises(StateError, match="allow_data_change=True"):
        restored(root, state, 0, allow_data_change=False)
    monkeypatch.setenv(DATA_CHANGE_ENV, "1")
    assert not keys_of(200) & set(keys(restored(root, state, 0)))


def test_an_exact_blend_restored_rank_by_rank_is_refused(tmp_path: Path) -> None:
    """An exact blend's global position needs every rank's state: restore_state_global is named."""
    a, b = dataset(tmp_path / "a", 2), dataset(tmp_path / "b", 2)
    yaml = tmp_path / "blend.yaml"
    yaml.write_text(f"__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend_mode: exact\n    blend:\n      - {{weight: 1, path: {a}}}\n      - {{weight: 1, path: {b}}}\n")
    run = get_savable_loader(get_train_dataset(yaml, worker_config=WorkerConfig(rank=0, world_size=2, num_workers=0), batch_size=2, shuffle_buffer_size=None, max_samples_per_sequence=4))
    keys(run, 2)
    state = run.save_state_rank()
    (a / "parts/data-1.tar").unlink()
    prepare_text(a)
    again = get_savable_loader(get_train_dataset(yaml, worker_config=WorkerConfig(rank=0, world_size=2, num_workers=0), batch_size=2, shuffle_buffer_size=None, max_samples_per_sequence=4))
    with pytest.raises(NotSupportedError, match="restore_state_global"):
        again.restore_state_rank(state, allow_data_change=True)


def test_blend_epochized_is_refused_with_the_reason(tmp_path: Path) -> None:
    a, b = dataset(tmp_path / "a", 2), dataset(tmp_path / "b", 2)
    yaml = tmp_path / "blend.yaml"
    yaml.write_text(f"__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend_epochized:\n      - {{repetitions: 1, path: {a}}}\n      - {{repetitions: 1, path: {b}}}\n")

    def make():
        return get_savable_loader(get_train_dataset(yaml, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), batch_size=2, shuffle_buffer_size=None, max_samples_per_sequence=4))

    run = make()
    keys(run, 2)
    state = run.save_state_rank()
    (a / "parts/data-1.tar").unlink()
    prepare_text(a)
    with pytest.raises((NotSupportedError, StateError), match="blend_epochized pass") as info:
        make().restore_state_rank(state, allow_data_change=True)
    assert "target share 0.5 -> 0.3333 (the datasets' sample counts changed)" in str(info.value)  # what changed, not only that something did


@pytest.mark.parametrize("mode", ["random", "exact"])
def test_a_blend_whose_dataset_changed_finishes_each_running_epoch(tmp_path: Path, mode: str) -> None:
    """A blend of a (3 shards) and b saved on 2 ranks x 1 worker; a's second shard removed and a
    fourth appended; restored through restore_state_global on 2 ranks without workers: a's kept
    shards' and b's running epochs are finished once each, the new shard's samples come within
    a's running epoch, the removed shard's rest does not come."""
    yaml = write_text_blend(tmp_path, {"a": [5, 4, 6], "b": [7, 4]}, {"a": 1, "b": 2})

    def make(rank: int, world: int, workers: int):
        config = WorkerConfig(rank=rank, world_size=world, num_workers=workers)
        return get_savable_loader(get_train_dataset(yaml, worker_config=config, batch_size=1, shuffle_buffer_size=None, max_samples_per_sequence=3, blend_mode=mode))

    saving = [make(rank, 2, 1) for rank in range(2)]
    before = [key for run in saving for key in keys(run, 4)]
    states = [run.save_state_rank() for run in saving]
    (tmp_path / "a/shards/001.tar").unlink()
    write_tar(tmp_path / "a/shards/003.tar", [(f"a3_{i:03d}", {"txt": f"a 3 {i}".encode()}) for i in range(3)])
    prepare_text(tmp_path / "a")
    after = []
    for rank in range(2):
        run = make(rank, 2, 0)
        run.restore_state_global(states, allow_data_change=True, join_new_shards=True)
        it = iter(run)
        carried = carried_datasets(run.save_state_rank(), 2)
        for _ in range(200):  # far more than the carried samples
            if not any(carried):
                break
            (key,) = next(it).__key__
            carried = carried_datasets(run.save_state_rank(), 2)
            if carried["ab".index(key[0])]:
                after.append(key)
        assert not any(carried), f"rank {rank} still reads carried samples after {len(after)}"
    assert not [key for key in after if key.startswith("a1")]
    a_kept = sorted(set(sized_keys("a", [5, 4, 6])) - set(sized_keys("a", [0, 4])) | {f"a3_{i:03d}" for i in range(3)})
    assert Counter(key for key in before + after if key.startswith("a") and not key.startswith("a1")) == Counter(a_kept)
    assert Counter(key for key in before + after if key.startswith("b")) == Counter(sized_keys("b", [7, 4]))


@settings(max_examples=200, deadline=None)
@given(data=st.data(), counts=st.lists(st.integers(0, 5), min_size=1, max_size=6))
def test_a_shard_map_follows_kept_shards_and_counts_the_rest(data, counts: list[int]) -> None:
    """Any saved shards, any of them removed, resized or moved, new ones added, any undelivered
    samples: each one of a kept shard (same name and count) lands on its shard and offset now;
    the others are counted per shard."""
    names = [f"s{i}" for i in range(len(counts))]
    fate = data.draw(st.lists(st.sampled_from(["kept", "gone", "resized"]), min_size=len(counts), max_size=len(counts)))
    now = [(name, count + 1 if how == "resized" else count) for name, count, how in zip(names, counts, fate) if how != "gone"]
    now += [(f"new{i}", count) for i, count in enumerate(data.draw(st.lists(st.integers(0, 4), max_size=2)))]
    now = data.draw(st.permutations(now))
    total = sum(counts)
    undelivered = sorted(data.draw(st.sets(st.integers(0, max(total - 1, 0)), max_size=total)) if total else [])
    shard_map = ShardMap(names, counts, [n for n, _ in now], [c for _, c in now])
    moved, lost = shard_map.moved([(i, i + 1) for i in undelivered])
    saved_at = [(name, offset) for name, count in zip(names, counts) for offset in range(count)]
    now_at = [(name, offset) for name, count in now for offset in range(count)]
    expected_moved = sorted(now_at.index(saved_at[i]) for i in undelivered if fate[names.index(saved_at[i][0])] == "kept")
    assert [i for start, end in moved for i in range(start, end)] == expected_moved
    expected_lost = Counter(names.index(saved_at[i][0]) for i in undelivered if fate[names.index(saved_at[i][0])] != "kept")
    assert lost == expected_lost
    assert [i for start, end in shard_map.new_ranges() for i in range(start, end)] == [i for i, (name, _) in enumerate(now_at) if name.startswith("new")]


class PairPacker(DefaultTaskEncoder):
    """Packs neighbours in pairs; a pack's key lists its members' keys."""

    def select_samples_to_pack(self, samples):
        return [samples[i : i + 2] for i in range(0, len(samples), 2)]

    def pack_selected_samples(self, samples):
        return dataclasses.replace(samples[0], __key__=",".join(s.__key__ for s in samples), text=" | ".join(s.text for s in samples))


@pytest.mark.parametrize("workers", [0, 2])
def test_an_open_packing_buffer_with_new_shards_and_with_lost_ones(tmp_path: Path, workers: int) -> None:
    """Saved with a packing buffer open (which the plain grown restore refuses): with shards only
    appended, the buffer's samples are part of the rest, and every sample comes once with the
    new shard's joined; with a shard gone, the buffer's replay would read it: refused, saying so."""
    root = dataset(tmp_path / "ds")

    def make():
        config = WorkerConfig(rank=0, world_size=1, num_workers=workers)
        return get_savable_loader(get_train_dataset(root, worker_config=config, batch_size=2, shuffle_buffer_size=None, max_samples_per_sequence=4, repeat=False, packing_buffer_size=5, task_encoder=PairPacker()))

    def members(run, batches=None) -> list[str]:
        return [key for pack in keys(run, batches) for key in pack.split(",")]

    run = make()
    before = members(run, 3)
    state = run.save_state_rank()
    write_text_shard(root, "data-4", 400, 6)
    prepare_text(root)
    restored_run = make()
    restored_run.restore_state_rank(state, join_new_shards=True)
    after = members(restored_run)
    assert Counter(before + after) == Counter(sorted(set().union(*(keys_of(100 * k) for k in range(4)), keys_of(400, 6))))
    (root / "parts/data-1.tar").unlink()
    prepare_text(root)
    with pytest.raises(StateError, match="packing buffer open"):
        make().restore_state_rank(state, allow_data_change=True)


@settings(max_examples=8, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=4),
    fates=st.lists(st.sampled_from(["kept", "kept", "gone", "resized"]), min_size=4, max_size=4),
    added=st.lists(st.tuples(st.booleans(), st.integers(1, 5)), max_size=2),
    workers=st.sampled_from([0, 2]),
    shuffle=st.sampled_from([None, 3]),
    position=st.floats(0, 1),
    join=st.booleans(),
)
def test_any_change_at_any_point_delivers_each_kept_sample_once(sizes, fates, added, workers, shuffle, position, join) -> None:
    """Any shards, saved at any point of the epoch, then any of them removed or resized and new
    ones inserted or appended: restored with allow_data_change (and maybe join_new_shards), the
    rest of the epoch holds each undelivered sample of the kept shards once, and the new shards'
    samples exactly when joined."""
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder) / "ds"
        for k, size in enumerate(sizes):
            write_text_shard(root, f"data-{k}", 100 * k, size)
        prepare_text(root)
        run = loader(root, workers, shuffle=shuffle)
        before = keys(run, int(position * (sum(sizes) // 4)))
        state = run.save_state_rank()
        for k, (size, fate) in enumerate(zip(sizes, fates)):
            if fate == "gone":
                (root / f"parts/data-{k}.tar").unlink()
            elif fate == "resized":
                write_text_shard(root, f"data-{k}", 100 * k, size + 1)
        new: set[str] = set()
        for j, (inserted, size) in enumerate(added):
            write_text_shard(root, f"data-{j}a" if inserted else f"data-{len(sizes) + j}", 1000 + 100 * j, size)
            new |= keys_of(1000 + 100 * j, size)
        assume(any(fate == "kept" for fate in fates[: len(sizes)]) or added)
        prepare_text(root)
        after = keys(restored(root, state, workers, shuffle, allow_data_change=True, join_new_shards=join))
    kept = set().union(*(keys_of(100 * k, size) for k, (size, fate) in enumerate(zip(sizes, fates)) if fate == "kept"))
    assert Counter(after) == Counter(sorted((kept - set(before)) | (new if join else set())))
