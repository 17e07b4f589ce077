"""Sharding: Energon's split reproduced to the sample, and the partition properties it must keep."""

from __future__ import annotations

import itertools
import pickle
from bisect import bisect_right

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_energon_lite.errors import ConfigError
from megatron_energon_lite.pipeline.sharding import (
    Slices,
    bit_reversal_permutation,
    epoch_slice_order,
    rotation_offset_for,
    slice_ranges,
    worker_sample_ranges,
    worker_slices,
)

FAST = settings(max_examples=150, deadline=None)

shard_sizes = st.lists(st.integers(1, 50), min_size=1, max_size=20)
shard_sizes_with_empty = st.lists(st.integers(0, 50), min_size=0, max_size=20)
world_sizes = st.integers(1, 4)
worker_counts = st.integers(0, 4)
msps_values = st.none() | st.integers(1, 20)
rotations = st.integers(-20, 40)


def starts_of(sizes: list[int]) -> list[int]:
    return [0, *itertools.accumulate(sizes)]


def all_slices(sizes, world_size, num_workers, msps, rotation=0) -> list[list[tuple[int, int]]]:
    """Every global worker's slices, in global worker order."""
    starts = starts_of(sizes)
    out = []
    for rank in range(world_size):
        out.extend(
            worker_slices(
                total_samples=starts[-1],
                shard_starts=starts,
                rank=rank,
                world_size=world_size,
                num_workers=num_workers,
                max_samples_per_sequence=msps,
                rotation_offset=rotation,
            )
        )
    return out


def as_boundaries(slices: list[tuple[int, int]]) -> list[int]:
    """Slices -> Energon's boundary list (start of each slice, then the end)."""
    return [a for a, _ in slices] + [slices[-1][1]] if slices else []


# ----------------------------------------------------------------------------------------------
# Plain examples (research/energon.md 6.2, observed with Energon 7.4.1)
# ----------------------------------------------------------------------------------------------

OBSERVED_SIZES = [2, 2, 3, 4, 10, 10, 10, 10, 4]
OBSERVED = [
    (1, 1, None, [[[0, 2, 4, 7, 11, 21, 31, 41, 51, 55]]]),
    (1, 2, None, [[[0, 2, 4, 7, 11, 21, 28], [28, 31, 41, 51, 55]]]),
    (2, 2, None, [[[0, 2, 4, 7, 11, 14], [14, 21, 28]], [[28, 31, 41, 42], [42, 51, 55]]]),
    (2, 2, 3, [[[0, 2, 4, 7, 11, 14], [14, 17, 21, 24, 28]], [[28, 31, 34, 37, 41, 42], [42, 45, 48, 51, 55]]]),
    (4, 1, None, [[[0, 2, 4, 7, 11, 14]], [[14, 21, 28]], [[28, 31, 41, 42]], [[42, 51, 55]]]),
    (3, 0, None, [[[0, 2, 4, 7, 11, 19]], [[19, 21, 31, 37]], [[37, 41, 51, 55]]]),
]


@pytest.mark.parametrize(("world_size", "num_workers", "msps", "expected"), OBSERVED)
def test_observed_energon_table(world_size, num_workers, msps, expected) -> None:
    starts = starts_of(OBSERVED_SIZES)
    for rank in range(world_size):
        got = worker_slices(
            total_samples=55,
            shard_starts=starts,
            rank=rank,
            world_size=world_size,
            num_workers=num_workers,
            max_samples_per_sequence=msps,
        )
        assert [as_boundaries(w) for w in got] == expected[rank]


def test_bit_reversal_examples() -> None:
    assert bit_reversal_permutation(8) == [0, 4, 2, 6, 1, 5, 3, 7]
    assert bit_reversal_permutation(6) == [0, 3, 1, 4, 2, 5]
    assert bit_reversal_permutation(5) == [0, 2, 1, 3, 4]
    assert bit_reversal_permutation(16) == [0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15]
    assert bit_reversal_permutation(0) == []
    assert bit_reversal_permutation(1) == [0]


def test_slice_starts_use_energons_float_truncation() -> None:
    # 122 samples, msps 9 -> 14 slices; the 8th starts at int(7 * (122 / 14)) = int(60.999...) = 60,
    # where exact arithmetic would give 61.  Energon does the former; so do we.
    slices = slice_ranges(0, 122, [0, 122], 9)
    assert len(slices) == 14
    assert slices[6] == (52, 60)
    assert slices[7] == (60, 69)


def test_round_half_to_even_and_the_1_5_threshold() -> None:
    assert slice_ranges(0, 6, [0, 6], 4) == [(0, 6)]  # 6 is not > 1.5 * 4
    assert slice_ranges(0, 7, [0, 7], 4) == [(0, 3), (3, 7)]  # 7 > 6: round(1.75) = 2 slices
    assert slice_ranges(0, 5, [0, 5], 2) == [(0, 2), (2, 5)]  # round(2.5) == 2 (half to even)


def test_rotation_offset_examples() -> None:
    assert [rotation_offset_for(i, [10, 7, 5], 4) for i in range(3)] == [0, 2, 1]
    assert rotation_offset_for(0, [3], 1) == 0


# ----------------------------------------------------------------------------------------------
# Against the real Energon
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def energon_sharding():
    sharder = pytest.importorskip("megatron.energon.flavors.webdataset.sharder")
    structs = pytest.importorskip("megatron.energon.flavors.webdataset.structs")
    energon = pytest.importorskip("megatron.energon")
    epath = pytest.importorskip("megatron.energon.epathlib")

    def shard_workers(sizes, rank, world_size, num_workers, msps, rotation):
        shards = [
            structs.ShardInfo(name=f"shard_{i}.tar", path=epath.EPath(f"/nonexistent/shard_{i}.tar"), count=n)
            for i, n in enumerate(sizes)
        ]
        config = energon.WorkerConfig(rank=rank, world_size=world_size, num_workers=num_workers)
        offsets = sharder.Sharder.shard_workers(
            shards, config, max_samples_per_sequence=msps, rotation_offset=rotation
        )
        return [[int(o) for o in worker] for worker in offsets]

    def split_samples(total, rank, world_size, num_workers, rotation):
        config = energon.WorkerConfig(rank=rank, world_size=world_size, num_workers=num_workers)
        return list(sharder.Sharder.split_samples_to_workers(0, total, config, rotation_offset=rotation))

    return sharder.Sharder, shard_workers, split_samples


def energon_boundaries(worker_offsets: list[int]) -> list[int]:
    # Energon gives an empty worker as [end]; ours as no slices.
    return worker_offsets if len(worker_offsets) > 1 else []


@pytest.mark.energon
@pytest.mark.parametrize("n", [*range(0, 40), 64, 100, 127])
def test_bit_reversal_matches_energon(energon_sharding, n) -> None:
    sharder = energon_sharding[0]
    assert bit_reversal_permutation(n) == list(sharder._generalized_bit_reversal(n))


@pytest.mark.energon
@FAST
@given(total=st.integers(0, 1000), world_size=world_sizes, num_workers=st.integers(0, 8), rotation=rotations)
def test_worker_sample_ranges_match_energon(energon_sharding, total, world_size, num_workers, rotation) -> None:
    _, _, split_samples = energon_sharding
    local = max(1, num_workers)
    ranges = worker_sample_ranges(total, world_size * local, rotation_offset=rotation)
    for rank in range(world_size):
        mine = ranges[rank * local : (rank + 1) * local]
        assert [mine[0][0], *(b for _, b in mine)] == split_samples(total, rank, world_size, num_workers, rotation)


@pytest.mark.energon
@FAST
@given(sizes=shard_sizes, world_size=world_sizes, num_workers=worker_counts, msps=msps_values, rotation=rotations)
def test_worker_slices_match_energon(energon_sharding, sizes, world_size, num_workers, msps, rotation) -> None:
    _, shard_workers, _ = energon_sharding
    starts = starts_of(sizes)
    for rank in range(world_size):
        mine = worker_slices(
            total_samples=starts[-1],
            shard_starts=starts,
            rank=rank,
            world_size=world_size,
            num_workers=num_workers,
            max_samples_per_sequence=msps,
            rotation_offset=rotation,
        )
        theirs = shard_workers(sizes, rank, world_size, num_workers, msps, rotation)
        assert [as_boundaries(w) for w in mine] == [energon_boundaries(w) for w in theirs]


@pytest.mark.energon
@settings(max_examples=40, deadline=None)
@given(sizes=shard_sizes_with_empty.filter(any), world_size=world_sizes, num_workers=worker_counts, msps=msps_values)
def test_worker_slices_match_energon_with_empty_shards(energon_sharding, sizes, world_size, num_workers, msps) -> None:
    _, shard_workers, _ = energon_sharding
    starts = starts_of(sizes)
    for rank in range(world_size):
        mine = worker_slices(
            total_samples=starts[-1],
            shard_starts=starts,
            rank=rank,
            world_size=world_size,
            num_workers=num_workers,
            max_samples_per_sequence=msps,
        )
        theirs = shard_workers(sizes, rank, world_size, num_workers, msps, 0)
        assert [as_boundaries(w) for w in mine] == [energon_boundaries(w) for w in theirs]


@pytest.mark.energon
@pytest.mark.parametrize(("length", "msps"), [(122, 9), (164, 8), (218, 5), (230, 16), (1000, 7), (4097, 13)])
def test_long_shards_match_energon(energon_sharding, length, msps) -> None:
    # Lengths where Energon's float truncation differs from exact floor division.
    _, shard_workers, _ = energon_sharding
    for num_workers in (0, 3):
        mine = worker_slices(
            total_samples=length,
            shard_starts=[0, length],
            rank=0,
            world_size=1,
            num_workers=num_workers,
            max_samples_per_sequence=msps,
        )
        theirs = shard_workers([length], 0, 1, num_workers, msps, 0)
        assert [as_boundaries(w) for w in mine] == [energon_boundaries(w) for w in theirs]


# ----------------------------------------------------------------------------------------------
# Properties (no Energon needed)
# ----------------------------------------------------------------------------------------------


@FAST
@given(sizes=shard_sizes_with_empty, world_size=world_sizes, num_workers=worker_counts, msps=msps_values, rotation=rotations)
def test_every_sample_exactly_once_and_no_slice_crosses_a_shard(sizes, world_size, num_workers, msps, rotation) -> None:
    starts = starts_of(sizes)
    per_worker = all_slices(sizes, world_size, num_workers, msps, rotation)
    assert len(per_worker) == world_size * max(1, num_workers)
    flat = [s for worker in per_worker for s in worker]
    # Slices are non-empty and, read worker by worker, tile [0, total) in order.
    assert all(a < b for a, b in flat)
    assert [a for a, _ in flat] == [0, *(b for _, b in flat)][: len(flat)]
    assert (flat[-1][1] if flat else 0) == starts[-1]
    # No slice crosses a shard boundary: its first and last sample lie in the same shard.
    for a, b in flat:
        assert bisect_right(starts, a) == bisect_right(starts, b - 1)
        if msps is not None:
            assert b - a <= 1.5 * msps + 1


@FAST
@given(sizes=shard_sizes_with_empty, product=st.integers(1, 12), msps=msps_values, rotation=rotations)
def test_same_partition_for_equal_worker_product(sizes, product, msps, rotation) -> None:
    topologies = [(ws, product // ws) for ws in range(1, product + 1) if product % ws == 0]
    topologies.append((product, 0))  # no worker processes: one worker per rank
    partitions = [all_slices(sizes, ws, nw, msps, rotation) for ws, nw in topologies]
    assert all(p == partitions[0] for p in partitions)


@FAST
@given(total=st.integers(0, 10_000), workers=st.integers(1, 64), rotation=rotations)
def test_worker_sample_ranges_are_balanced_and_contiguous(total, workers, rotation) -> None:
    ranges = worker_sample_ranges(total, workers, rotation_offset=rotation)
    assert len(ranges) == workers
    assert ranges[0][0] == 0 and ranges[-1][1] == total
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    lengths = [b - a for a, b in ranges]
    assert max(lengths) - min(lengths) <= 1
    assert sum(n == total // workers + 1 for n in lengths) == total % workers
    # Only the rotation modulo the worker count matters.
    assert ranges == worker_sample_ranges(total, workers, rotation_offset=rotation % workers)


@FAST
@given(lengths=st.lists(st.integers(0, 200), min_size=1, max_size=6), workers=st.integers(1, 16))
def test_rotation_keeps_blends_balanced(lengths, workers) -> None:
    # With Energon's rotation, the "+1" workers of each dataset continue where the previous
    # dataset's stopped, so over all datasets every worker's total differs by at most one.
    totals = [0] * workers
    for index, length in enumerate(lengths):
        rotation = rotation_offset_for(index, lengths, workers)
        assert 0 <= rotation < workers
        for worker, (a, b) in enumerate(worker_sample_ranges(length, workers, rotation_offset=rotation)):
            totals[worker] += b - a
    assert max(totals) - min(totals) <= 1
    assert sum(totals) == sum(lengths)


@FAST
@given(n=st.integers(0, 300))
def test_bit_reversal_is_a_permutation(n) -> None:
    perm = bit_reversal_permutation(n)
    assert sorted(perm) == list(range(n))
    if n and n & (n - 1) == 0:  # a power of two: the classic bit reversal
        bits = n.bit_length() - 1
        assert perm == [int(format(i, f"0{bits}b")[::-1] or "0", 2) for i in range(n)]


@FAST
@given(sizes=shard_sizes_with_empty, data=st.data(), msps=msps_values)
def test_slice_ranges_cover_any_range(sizes, data, msps) -> None:
    starts = starts_of(sizes)
    start = data.draw(st.integers(0, starts[-1]))
    end = data.draw(st.integers(start, starts[-1]))
    slices = slice_ranges(start, end, starts, msps)
    covered = [i for a, b in slices for i in range(a, b)]
    assert covered == list(range(start, end))
    assert all(bisect_right(starts, a) == bisect_right(starts, b - 1) for a, b in slices)


@FAST
@given(n=st.integers(0, 60), seed=st.integers(0, 2**64 - 1), epoch=st.integers(0, 10**6), k=st.integers(1, 4))
def test_epoch_slice_order_is_a_deterministic_multiset_permutation(n, seed, epoch, k) -> None:
    order = epoch_slice_order(n, seed=seed, epoch=epoch, shuffle_over_epochs=k)
    assert sorted(order) == sorted(list(range(n)) * k)
    assert all(type(i) is int for i in order)
    assert order == epoch_slice_order(n, seed=seed, epoch=epoch, shuffle_over_epochs=k)


def test_epoch_slice_order_varies_with_epoch_and_seed() -> None:
    n = 10
    by_epoch = {tuple(epoch_slice_order(n, seed=7, epoch=e)) for e in range(50)}
    by_seed = {tuple(epoch_slice_order(n, seed=s, epoch=0)) for s in range(50)}
    # 10! orders: 50 draws collide with probability ~ 50**2 / (2 * 10!) < 0.1 %; require most distinct.
    assert len(by_epoch) >= 45 and len(by_seed) >= 45
    # Not identity-biased either: slot 0 holds every slice for some seed.
    assert {epoch_slice_order(n, seed=s, epoch=3)[0] for s in range(200)} == set(range(n))


def test_epoch_slice_order_super_epochs() -> None:
    order = epoch_slice_order(5, seed=1, epoch=2, shuffle_over_epochs=3)
    assert len(order) == 15 and all(order.count(i) == 3 for i in range(5))
    assert order != epoch_slice_order(5, seed=1, epoch=3, shuffle_over_epochs=3)
    assert epoch_slice_order(0, seed=1, epoch=0) == []


# ----------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------


def _kwargs(**override):
    base = dict(
        total_samples=10,
        shard_starts=[0, 4, 10],
        rank=0,
        world_size=2,
        num_workers=2,
        max_samples_per_sequence=3,
    )
    base.update(override)
    return base


@pytest.mark.parametrize(
    ("override", "mentions"),
    [
        ({"max_samples_per_sequence": 0}, "max_samples_per_sequence"),
        ({"max_samples_per_sequence": -3}, "max_samples_per_sequence"),
        ({"world_size": 0}, "world_size"),
        ({"rank": 2}, "rank"),
        ({"rank": -1}, "rank"),
        ({"num_workers": -1}, "num_workers"),
        ({"total_samples": 11}, "shard_starts"),
        ({"shard_starts": [0, 6, 4, 10]}, "shard_starts"),
        ({"shard_starts": [1, 10]}, "shard_starts"),
    ],
)
def test_bad_arguments_raise_config_error(override, mentions) -> None:
    with pytest.raises(ConfigError) as info:
        worker_slices(**_kwargs(**override))
    message = str(info.value)
    assert mentions in message
    for label in ("expected:", "found:", "fix:"):
        assert label in message


def test_other_validation() -> None:
    for bad in (0, -2, 1.5, True, "1"):
        with pytest.raises(ConfigError, match="shuffle_over_epochs"):
            epoch_slice_order(3, seed=0, epoch=0, shuffle_over_epochs=bad)
    with pytest.raises(ConfigError, match="epoch"):
        epoch_slice_order(3, seed=0, epoch=-1)
    with pytest.raises(ConfigError, match="max_samples_per_sequence"):
        slice_ranges(0, 4, [0, 4], 0)
    with pytest.raises(ConfigError, match="past the last shard"):
        slice_ranges(0, 5, [0, 4], None)
    with pytest.raises(ConfigError, match="num_global_workers"):
        worker_sample_ranges(10, 0)
    with pytest.raises(ConfigError, match="dataset_index"):
        rotation_offset_for(3, [1, 2], 4)


# --------------------------------------------------------------------------------------------
# Slices: a worker's slices as their bounds
# --------------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 9), max_size=8), st.integers(0, 9))
def test_slices_behave_as_the_list_of_pairs(steps: list[int], first: int) -> None:
    bounds = list(itertools.accumulate(steps, initial=first)) if steps else []
    pairs = list(zip(bounds, bounds[1:]))
    got = Slices(bounds)
    assert len(got) == len(pairs) and list(got) == pairs and got == pairs and pairs == got
    assert [got[i] for i in range(-len(pairs), len(pairs))] == pairs + pairs
    assert got[1:] == pairs[1:] and got[::-1] == pairs[::-1]
    assert got.samples == sum(b - a for a, b in pairs)
    assert pickle.loads(pickle.dumps(got)) == got
    for out_of_range in (len(pairs), -len(pairs) - 1):
        with pytest.raises(IndexError):
            got[out_of_range]
    if pairs:
        assert got != pairs[:-1] and got != [*pairs[:-1], (pairs[-1][0], pairs[-1][1] + 1)]


def test_slice_ranges_drop_empty_shards_and_empty_cuts() -> None:
    # Shards of 3, 0, 0, 4 samples; msps 1 cuts 4 samples into 4 slices, and 3 into 3.
    starts = [0, 3, 3, 3, 7]
    assert slice_ranges(0, 7, starts, None) == [(0, 3), (3, 7)]
    assert slice_ranges(1, 7, starts, 1) == [(1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 7)]
    assert slice_ranges(3, 3, starts, None) == [] and len(slice_ranges(3, 3, starts, None)) == 0
