import numpy as np

from megatron_energon_lite.rng import rng_for, stage_id, worker_seed


def test_same_inputs_same_stream_and_counters_differ() -> None:
    a = rng_for(1, "shuffle", 5).integers(0, 2**31, 8)
    b = rng_for(1, "shuffle", 5).integers(0, 2**31, 8)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, rng_for(1, "shuffle", 6).integers(0, 2**31, 8))
    assert not np.array_equal(a, rng_for(1, "blend", 5).integers(0, 2**31, 8))
    assert not np.array_equal(a, rng_for(2, "shuffle", 5).integers(0, 2**31, 8))


def test_stage_id_is_stable_across_processes() -> None:
    import subprocess
    import sys

    other = subprocess.run([sys.executable, "-c", "from megatron_energon_lite.rng import stage_id; print(stage_id('shuffle'))"], capture_output=True, text=True, check=True)
    assert int(other.stdout) == stage_id("shuffle")


def test_worker_seed_matches_energon() -> None:
    import pytest

    worker = pytest.importorskip("megatron.energon.worker")
    config = worker.WorkerConfig(rank=0, world_size=1, num_workers=2, seed_offset=43)
    assert worker_seed(1, 43) == config.worker_seed(1)
    assert worker_seed(0, 43) == config.worker_seed(0)


def test_uniform_stream_is_a_function_of_the_counter() -> None:
    from megatron_energon_lite.rng import UniformStream

    stream = UniformStream(3, "shuffle", 1)
    forward = [stream.at(i) for i in range(3000)]
    backward = [UniformStream(3, "shuffle", 1).at(i) for i in reversed(range(3000))][::-1]
    assert forward == backward  # any order of access, any fresh object: the same draws
    assert all(0.0 <= x < 1.0 for x in forward) and len(set(forward)) == 3000
    assert UniformStream(3, "shuffle", 2).at(5) != forward[5] and UniformStream(4, "shuffle", 1).at(5) != forward[5]


def test_stratified_stream_covers_every_stratum_once_per_window() -> None:
    from megatron_energon_lite.rng import StratifiedUniformStream

    stream = StratifiedUniformStream(3, "blend", 0)
    window = StratifiedUniformStream.WINDOW
    draws = [stream.at(i) for i in range(3000)]
    assert draws == [StratifiedUniformStream(3, "blend", 0).at(i) for i in reversed(range(3000))][::-1]
    assert all(0.0 <= x < 1.0 for x in draws) and len(set(draws)) == 3000
    for start in range(0, 3000 - window + 1, window):
        assert sorted(int(x * window) for x in draws[start : start + window]) == list(range(window))
    # The order within a window is random: not the strata in order, and not the same in each window.
    strata = [[int(x * window) for x in draws[s : s + window]] for s in (0, window)]
    assert strata[0] != list(range(window)) and strata[0] != strata[1]
