"""Elastic resume: every rank's state saved on (W1 ranks x N1 workers), restored on (W2 x N2).

The property: over the epoch that was running, the keys delivered before the save and after the
restore (on the new topology, to the end of that epoch) are the epoch's samples exactly once;
shuffle buffers' samples included.  Ranks are loaders in one process (``WorkerConfig(rank=r)``),
each with its real worker processes.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import logging
import random
from collections import Counter
from pathlib import Path

import pytest
from energon_lite_dev.synthetic import write_tar
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megatron_energon_lite import (
    DefaultTaskEncoder,
    NotSupportedError,
    StateError,
    WorkerConfig,
    energon_mode,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
)
from megatron_energon_lite.loader.elastic import merge_ranges, share_remainder
from megatron_energon_lite.format.prepare import prepare_dataset

# Up to 3 workers per rank on a 2-core machine: torch warns, the test means it.
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

TEXT_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"
SHARD_SIZES = [7, 1, 12, 5, 9, 3, 10, 6]  # uneven on purpose: slices of every length


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("elastic") / "text"
    for shard, size in enumerate(SHARD_SIZES):
        write_tar(root / f"shards/{shard:03d}.tar", [(f"s{shard}_{i:03d}", {"txt": f"shard {shard} sample {i}".encode()}) for i in range(size)])
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=TEXT_YAML)
    return root


ALL_KEYS = sorted(f"s{shard}_{i:03d}" for shard, size in enumerate(SHARD_SIZES) for i in range(size))


class ByShardParity(DefaultTaskEncoder):
    """Length grouping stand-in: batches of 3 from shards of the same parity."""

    def batch_group_criterion(self, sample):
        return int(sample.__key__[1:].split("_")[0]) % 2, 3


class PairPacker(DefaultTaskEncoder):
    """Packs neighbours of a 5-sample buffer in pairs; a pack's key lists its members' keys."""

    def select_samples_to_pack(self, samples):
        return [samples[i : i + 2] for i in range(0, len(samples), 2)]

    def pack_selected_samples(self, samples):
        return dataclasses.replace(samples[0], __key__=",".join(s.__key__ for s in samples), text=" | ".join(s.text for s in samples))


ENCODERS = {"plain": DefaultTaskEncoder, "group": ByShardParity, "pack": PairPacker}


def _loader(dataset: Path, rank: int, world: int, workers: int, *, shuffle: int | None, train: bool = True, mode: str = "plain"):
    config = WorkerConfig(rank=rank, world_size=world, num_workers=workers)
    if train:
        packing = 5 if mode == "pack" else None
        ds = get_train_dataset(
            dataset, batch_size=2, shuffle_buffer_size=shuffle, max_samples_per_sequence=3, repeat=False,
            packing_buffer_size=packing, task_encoder=ENCODERS[mode](), worker_config=config,
        )
    else:
        ds = get_val_dataset(dataset, split_part="train", batch_size=2, worker_config=config)
    return get_savable_loader(ds)


def _keys(batch) -> list[str]:
    """The samples in a batch (a pack's key lists its members)."""
    return [key for item in batch.__key__ for key in item.split(",")]


def _save_after(dataset: Path, world: int, workers: int, steps: list[int], *, shuffle: int | None, train: bool = True, mode: str = "plain"):
    """Each rank reads ``steps[rank]`` batches; returns (their keys, save_state_global's list)."""
    delivered: list[str] = []
    states = []
    for rank in range(world):
        loader = _loader(dataset, rank, world, workers, shuffle=shuffle, train=train, mode=mode)
        for batch in itertools.islice(loader, steps[rank]):
            delivered += _keys(batch)
        states.append(loader.save_state_rank())
    return delivered, states


def _finish(dataset: Path, world: int, workers: int, states: list[dict], *, shuffle: int | None, train: bool = True, mode: str = "plain") -> list[str]:
    delivered: list[str] = []
    for rank in range(world):
        loader = _loader(dataset, rank, world, workers, shuffle=shuffle, train=train, mode=mode)
        loader.restore_state_global(states)
        delivered += [key for batch in loader for key in _keys(batch)]
    return delivered


def _states_after_one_batch(make_loader, *, world: int) -> list[dict]:
    """Every rank's state after its first batch; ``make_loader(rank, world)``."""
    states = []
    for rank in range(world):
        saving = make_loader(rank, world)
        next(iter(saving))
        states.append(saving.save_state_rank())
    return states


def _check_exactly_once(before: list[str], after: list[str]) -> None:
    counts = Counter(before + after)
    repeated = sorted(k for k, n in counts.items() if n > 1)
    missing = sorted(set(ALL_KEYS) - set(counts))
    assert not repeated and not missing, f"repeated {repeated[:10]}, missing {missing[:10]} ({len(before)} before, {len(after)} after)"
    assert sorted(counts) == ALL_KEYS


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    old=st.tuples(st.integers(1, 4), st.integers(0, 3)),
    new=st.tuples(st.integers(1, 4), st.integers(0, 3)),
    shuffle=st.sampled_from([None, 4]),
    mode=st.sampled_from(sorted(ENCODERS)),
    seed=st.integers(0, 10**6),
)
def test_the_rest_of_the_epoch_comes_once_on_another_topology(dataset: Path, old, new, shuffle, mode: str, seed: int) -> None:
    rng = random.Random(seed)
    # At most 3 batches: no rank reaches the end of its share (a loop that ended would restore
    # to the next pass, which is not what this property is about).
    steps = [rng.randint(0, 3) for _ in range(old[0])]
    before, states = _save_after(dataset, *old, steps, shuffle=shuffle, mode=mode)
    after = _finish(dataset, *new, states, shuffle=shuffle, mode=mode)
    _check_exactly_once(before, after)


@pytest.mark.parametrize(("old", "new"), [((2, 2), (1, 3)), ((1, 0), (3, 1)), ((3, 1), (2, 0))])
def test_a_validation_pass_finishes_on_another_topology(dataset: Path, old, new) -> None:
    before, states = _save_after(dataset, *old, [2] * old[0], shuffle=None, train=False)
    _check_exactly_once(before, _finish(dataset, *new, states, shuffle=None, train=False))


def test_the_same_topology_still_resumes_exactly(dataset: Path) -> None:
    """restore_state_global on the saved topology takes the exact path: the same batches follow."""
    loader = _loader(dataset, 0, 1, 2, shuffle=4)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.save_state_rank()
    expected = [list(b.__key__) for b in it]
    restored = _loader(dataset, 0, 1, 2, shuffle=4)
    restored.restore_state_global([state])
    assert [list(b.__key__) for b in restored] == expected


def test_after_the_carried_epoch_the_next_follows_the_new_topology(dataset: Path) -> None:
    """An endless training stream saved on 2 ranks x 1 worker, restored on 1 rank without workers:
    the rest of the running epoch once, then the next epoch whole."""
    delivered_before, states = [], []
    for rank in range(2):
        config = WorkerConfig(rank=rank, world_size=2, num_workers=1)
        saving = get_savable_loader(get_train_dataset(dataset, batch_size=1, shuffle_buffer_size=None, max_samples_per_sequence=3, worker_config=config))
        delivered_before += [k for b in itertools.islice(saving, 4) for k in b.__key__]
        states.append(saving.save_state_rank())
    config = WorkerConfig(rank=0, world_size=1, num_workers=0)
    loader = get_savable_loader(get_train_dataset(dataset, batch_size=1, shuffle_buffer_size=None, max_samples_per_sequence=3, worker_config=config))
    loader.restore_state_global(states)
    rest = len(ALL_KEYS) - len(delivered_before)
    keys = [k for b in itertools.islice(loader, rest + len(ALL_KEYS)) for k in b.__key__]
    _check_exactly_once(delivered_before, keys[:rest])
    assert sorted(keys[rest:]) == ALL_KEYS  # the next epoch, whole


def _worker_streams(batches: list[list[str]], rank: int, workers: int, first: int) -> dict[int, list[list[str]]]:
    """A rank's batches by global worker: the loader takes its workers in turn from ``first``."""
    streams: dict[int, list[list[str]]] = {}
    for j, batch in enumerate(batches):
        streams.setdefault(rank * workers + (first + j) % workers, []).append(batch)
    return streams


@pytest.mark.parametrize("new", [(1, 4), (4, 1), (4, 0)])
@pytest.mark.parametrize("saved_after", [4, 3])
def test_the_same_global_workers_move_their_states(dataset: Path, new, saved_after: int) -> None:
    """Saved on 2 ranks x 2 workers, restored on another topology of 4 global workers: each
    worker's state moves as it is, so every worker goes on with exactly its uninterrupted batches,
    across epochs (40 batches of 2 per worker: six passes over the 53 samples).  After 3 batches
    per rank each rank's worker 0 had given one more; the new ranks start with a worker that had
    not."""
    def loader(rank: int, world: int, workers: int):
        config = WorkerConfig(rank=rank, world_size=world, num_workers=workers)
        return get_savable_loader(get_train_dataset(dataset, batch_size=2, shuffle_buffer_size=4, max_samples_per_sequence=3, worker_config=config))

    per_worker = 40
    states, expected = [], {}
    for rank in range(2):
        saving = loader(rank, 2, 2)
        it = iter(saving)
        for _ in range(saved_after):
            next(it)
        states.append(saving.save_state_rank())
        batches = [list(next(it).__key__) for _ in range(2 * per_worker)]
        expected.update(_worker_streams(batches, rank, 2, first=saved_after % 2))
        del it, saving
    got = {}
    workers = max(1, new[1])
    for rank in range(new[0]):
        restored = loader(rank, *new)
        restored.restore_state_global(states)
        state = restored.save_state_rank()  # before iterating: the restored state as it is
        if new == (1, 4):  # saved workers 0 and 2 were ahead after an odd number of batches
            assert state["next_worker"] == saved_after % 2
        batches = [list(batch.__key__) for batch in itertools.islice(restored, workers * per_worker)]
        got.update(_worker_streams(batches, rank, workers, first=state["next_worker"]))
        del restored
    gc.collect()
    assert sorted(got) == [0, 1, 2, 3]
    for worker in got:
        n = min(len(got[worker]), len(expected[worker]))
        assert n >= per_worker - 1 and got[worker][:n] == expected[worker][:n], worker


def test_a_state_list_with_a_missing_rank_is_refused(dataset: Path) -> None:
    _, states = _save_after(dataset, 3, 0, [1, 1, 1], shuffle=None)
    loader = _loader(dataset, 0, 2, 0, shuffle=None)
    with pytest.raises(StateError, match="every rank once") as raised:
        loader.restore_state_global([states[0], states[2]])
    assert "missing [1]" in str(raised.value)
    with pytest.raises(StateError, match="every rank once"):
        loader.restore_state_global([states[0], states[0], states[2]])


def test_another_batch_size_is_refused_naming_it(dataset: Path) -> None:
    _, states = _save_after(dataset, 2, 0, [1, 1], shuffle=None)
    config = WorkerConfig(rank=0, world_size=1, num_workers=0)
    other = get_savable_loader(get_train_dataset(dataset, batch_size=3, shuffle_buffer_size=None, max_samples_per_sequence=3, repeat=False, worker_config=config))
    with pytest.raises(StateError, match="batch_size: saved 2, now 3"):
        other.restore_state_global(states)


def test_as_energon_another_batch_size_is_allowed_and_the_samples_go_on(dataset: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Energon's redist test: saved on 2 ranks x 2 workers with batches of 2, restored under
    ``as_energon`` on 1 rank x 4 workers with batches of 1 (logged once): every worker's samples
    go on as they would have."""
    def loader(rank: int, world: int, workers: int, batch: int):
        config = WorkerConfig(rank=rank, world_size=world, num_workers=workers)
        return get_savable_loader(get_train_dataset(dataset, batch_size=batch, shuffle_buffer_size=4, max_samples_per_sequence=3, worker_config=config))

    states, expected = [], {}
    for rank in range(2):
        saving = loader(rank, 2, 2, 2)
        it = iter(saving)
        for _ in range(4):
            next(it)
        states.append(saving.save_state_rank())
        for worker, batches in _worker_streams([list(next(it).__key__) for _ in range(20)], rank, 2, first=0).items():
            expected[worker] = [key for batch in batches for key in batch]
        del it, saving
    energon_mode.enable()
    try:
        restored = loader(0, 1, 4, 1)
        with caplog.at_level(logging.WARNING):
            restored.restore_state_global(states)
        streams = _worker_streams([list(b.__key__) for b in itertools.islice(restored, 80)], 0, 4, first=0)
        del restored
    finally:
        energon_mode.disable()
    gc.collect()
    assert "restoring a state saved with another batch_size" in caplog.text
    assert {worker: [key for batch in batches for key in batch] for worker, batches in streams.items()} == expected


def test_a_pack_generator_between_two_outputs_is_refused(dataset: Path) -> None:
    class TwoOutputs(PairPacker):
        def pack_selected_samples(self, samples):
            for member in samples:
                yield member

    def loader(rank, world):
        config = WorkerConfig(rank=rank, world_size=world, num_workers=0)
        return get_savable_loader(get_train_dataset(dataset, batch_size=None, packing_buffer_size=4, shuffle_buffer_size=None, max_samples_per_sequence=3, repeat=False, task_encoder=TwoOutputs(), worker_config=config))

    states = _states_after_one_batch(loader, world=2)
    with pytest.raises(NotSupportedError, match="pack generator was between two outputs"):
        loader(0, 1).restore_state_global(states)


def test_restore_state_rank_alone_names_what_to_do_on_another_topology(dataset: Path) -> None:
    _, states = _save_after(dataset, 2, 0, [1, 1], shuffle=None)
    with pytest.raises(StateError, match="restore_state_global"):
        _loader(dataset, 0, 1, 0, shuffle=None).restore_state_rank(states[0])


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 10)), max_size=8), st.integers(1, 7))
def test_shares_cover_the_remainder_once_in_order(pairs, workers: int) -> None:
    ranges = merge_ranges((start, start + length) for start, length in pairs)
    shares = [share_remainder(ranges, g, workers) for g in range(workers)]
    flat = [i for share in shares for start, end in share for i in range(start, end)]
    assert flat == [i for start, end in ranges for i in range(start, end)]
    sizes = [sum(end - start for start, end in share) for share in shares]
    assert max(sizes) - min(sizes) <= 1


@given(
    st.lists(st.tuples(st.integers(0, 50), st.integers(0, 10)), max_size=8),
    st.lists(st.integers(0, 5), min_size=1, max_size=7).filter(any),
)
def test_weighted_shares_cover_the_remainder_once_in_proportion(pairs, weights: list[int]) -> None:
    ranges = merge_ranges((start, start + length) for start, length in pairs)
    shares = [share_remainder(ranges, g, len(weights), weights=weights) for g in range(len(weights))]
    flat = [i for share in shares for start, end in share for i in range(start, end)]
    assert flat == [i for start, end in ranges for i in range(start, end)]
    total = len(flat)
    for weight, share in zip(weights, shares):
        size = sum(end - start for start, end in share)
        assert abs(size - total * weight / sum(weights)) < 1 + 1e-9
        assert weight or not size  # a worker of weight 0 gets nothing
