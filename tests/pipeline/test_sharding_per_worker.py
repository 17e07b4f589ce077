"""worker_sample_range: one global worker's range in O(log W), equal to worker_sample_ranges' entry.

worker_slices computes only its rank's workers with it; these tests pin both to the full-list
reference (worker_sample_ranges + slice_ranges), whose boundaries match Energon's to the sample.
"""

from __future__ import annotations

import itertools
import random

import pytest

from megatron_energon_lite.errors import ConfigError
from megatron_energon_lite.pipeline.sharding import (
    slice_ranges,
    worker_sample_range,
    worker_sample_ranges,
    worker_slices,
)


def reference_worker_slices(
    *, total_samples, shard_starts, rank, world_size, num_workers, max_samples_per_sequence, rotation_offset=0, sample_range=None
):
    # The pre-change definition: all W ranges, keep this rank's, cut each into slices.
    local = max(1, num_workers)
    first, last = (0, total_samples) if sample_range is None else sample_range
    ranges = worker_sample_ranges(last - first, world_size * local, rotation_offset=rotation_offset)
    return [
        slice_ranges(first + a, first + b, shard_starts, max_samples_per_sequence)
        for a, b in ranges[rank * local : (rank + 1) * local]
    ]


# --------------------------------------------------------------------------------------------
# worker_sample_range == worker_sample_ranges(...)[g]
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", range(1, 71))
def test_every_worker_matches_the_full_list_exhaustively(workers: int) -> None:
    rng = random.Random(workers)
    totals = sorted({0, 1, max(workers - 1, 0), workers, workers + 1, 7 * workers + 3, *(rng.randrange(0, 50 * workers) for _ in range(3))})
    rotations = sorted({0, 1, workers - 1, workers + 5, -1, -workers - 3, rng.randrange(-1000, 1000)})
    for total, rotation in itertools.product(totals, rotations):
        expected = worker_sample_ranges(total, workers, rotation_offset=rotation)
        got = [worker_sample_range(g, total, workers, rotation_offset=rotation) for g in range(workers)]
        assert got == expected, (workers, total, rotation)


def test_default_rotation_is_zero() -> None:
    assert [worker_sample_range(g, 37, 10) for g in range(10)] == worker_sample_ranges(37, 10)


@pytest.mark.parametrize("workers", [1023, 1024, 1025, 4097, 32_767, 32_768, 32_769, 40_000])
def test_sampled_workers_match_the_full_list_for_large_w(workers: int) -> None:
    rng = random.Random(workers)
    for total in (workers - 1, 3 * workers + rng.randrange(workers), rng.randrange(10**9)):
        rotation = rng.randrange(-2 * workers, 2 * workers)
        expected = worker_sample_ranges(total, workers, rotation_offset=rotation)
        sampled = {0, 1, workers // 2, workers - 2, workers - 1, *(rng.randrange(workers) for _ in range(300))}
        for g in sorted(g for g in sampled if 0 <= g < workers):
            assert worker_sample_range(g, total, workers, rotation_offset=rotation) == expected[g], (workers, total, rotation, g)


def test_random_large_w_consistency() -> None:
    rng = random.Random(1234)
    for _ in range(8):
        workers = rng.randrange(1, 40_001)
        total = rng.choice([rng.randrange(workers + 1), rng.randrange(10**7)])
        rotation = rng.randrange(-workers, 3 * workers)
        expected = worker_sample_ranges(total, workers, rotation_offset=rotation)
        for g in (rng.randrange(workers) for _ in range(200)):
            assert worker_sample_range(g, total, workers, rotation_offset=rotation) == expected[g]


def test_consecutive_workers_tile_without_the_full_list() -> None:
    # Ranges of consecutive workers touch, and the last one ends at the total.
    workers, total, rotation = 4096 * 8, 100_000, 12_345
    ranges = [worker_sample_range(g, total, workers, rotation_offset=rotation) for g in range(workers - 64, workers)]
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert ranges[-1][1] == total
    assert {b - a for a, b in ranges} <= {total // workers, total // workers + 1}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"global_worker_id": -1},
        {"global_worker_id": 8},
        {"global_worker_id": True},
        {"global_worker_id": 1.0},
        {"total_samples": -1},
        {"num_global_workers": 0},
        {"rotation_offset": 1.5},
        {"rotation_offset": "1"},
    ],
)
def test_invalid_arguments_raise_config_error(kwargs) -> None:
    args = {"global_worker_id": 3, "total_samples": 100, "num_global_workers": 8, "rotation_offset": 0, **kwargs}
    rotation = args.pop("rotation_offset")
    with pytest.raises(ConfigError):
        worker_sample_range(**args, rotation_offset=rotation)


# --------------------------------------------------------------------------------------------
# worker_slices unchanged
# --------------------------------------------------------------------------------------------


def test_worker_slices_matches_reference_on_random_topologies() -> None:
    rng = random.Random(7)
    for _ in range(300):
        sizes = [rng.choice([0, rng.randrange(1, 60)]) for _ in range(rng.randrange(0, 15))]
        starts = [0, *itertools.accumulate(sizes)]
        total = starts[-1]
        world_size, num_workers = rng.randrange(1, 6), rng.randrange(0, 5)
        msps = rng.choice([None, rng.randrange(1, 20)])
        rotation = rng.randrange(-30, 60)
        lo = rng.randrange(total + 1)
        sample_range = rng.choice([None, (lo, rng.randrange(lo, total + 1))])
        for rank in range(world_size):
            kwargs = dict(
                total_samples=total,
                shard_starts=starts,
                rank=rank,
                world_size=world_size,
                num_workers=num_workers,
                max_samples_per_sequence=msps,
                rotation_offset=rotation,
                sample_range=sample_range,
            )
            got = worker_slices(**kwargs)
            assert got == reference_worker_slices(**kwargs), kwargs
            # Each worker's slices tile one range without gaps (the loader takes a worker's sample
            # count as last end - first start).
            local = max(1, num_workers)
            for w, slices in enumerate(got):
                first, last = (0, total) if sample_range is None else sample_range
                a, b = worker_sample_range(rank * local + w, last - first, world_size * local, rotation_offset=rotation)
                assert [s for s, _ in slices[1:]] == [e for _, e in slices[:-1]], kwargs
                assert (slices[-1][1] - slices[0][0] if slices else 0) == b - a, kwargs


@pytest.mark.parametrize("rank", [0, 1, 2047, 4094, 4095])
@pytest.mark.parametrize("rotation", [0, 17, 32_767])
def test_worker_slices_matches_reference_at_4096_ranks(rank: int, rotation: int) -> None:
    kwargs = dict(
        total_samples=100_000,
        shard_starts=list(range(0, 100_001, 10)),
        rank=rank,
        world_size=4096,
        num_workers=8,
        max_samples_per_sequence=None,
        rotation_offset=rotation,
    )
    assert worker_slices(**kwargs) == reference_worker_slices(**kwargs)
    kwargs.update(max_samples_per_sequence=2, sample_range=(1_000, 98_765))
    assert worker_slices(**kwargs) == reference_worker_slices(**kwargs)


def test_worker_slices_rejects_a_non_integer_rotation() -> None:
    with pytest.raises(ConfigError):
        worker_slices(
            total_samples=10,
            shard_starts=[0, 10],
            rank=0,
            world_size=1,
            num_workers=2,
            max_samples_per_sequence=None,
            rotation_offset=0.5,  # type: ignore[arg-type]
        )
