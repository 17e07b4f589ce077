"""Elastic resume of blends: every rank's state saved on (W1 x N1), restored on (W2 x N2).

For each blended dataset, the samples of its running epoch delivered before the save and those
the new topology delivers from what it carried over are that epoch exactly once; the exact
schedule keeps every dataset within one sample of its weight share at every global step, before
and after the change; the blend's per-dataset counts carry over.
"""

from __future__ import annotations

import itertools
import json
import random
from collections import Counter
from pathlib import Path

import pytest
from energon_lite_dev.prepared import PREPARED_BLEND_SIZES, PREPARED_BLEND_WEIGHTS
from energon_lite_dev.states import carried_datasets
from energon_lite_dev.synthetic import sized_keys, write_text_blend
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from megatron_energon_lite import (
    DefaultTaskEncoder,
    WorkerConfig,
    blend_report,
    get_savable_loader,
    get_train_dataset,
)

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

SIZES = PREPARED_BLEND_SIZES  # a: 24 and b: 39 samples, uneven shards
assert PREPARED_BLEND_WEIGHTS == {"a": 1, "b": 2}  # the checks below count on 1:2


@pytest.fixture(scope="module")
def blend(prepared_blend: Path) -> Path:
    """The shared prepared blend (tests/conftest.py): read-only, its folder too."""
    return prepared_blend


def all_keys(name: str) -> list[str]:
    return sized_keys(name, SIZES[name])


class CharCost(DefaultTaskEncoder):
    """blend_mode cost: a sample costs its number of characters."""

    def sample_cost(self, sample) -> int:
        return len(sample.text)


def _loader(path: Path, rank: int, world: int, workers: int, *, mode: str, batch: int = 2, shuffle: int | None = None):
    config = WorkerConfig(rank=rank, world_size=world, num_workers=workers)
    encoder = CharCost() if mode == "cost" else DefaultTaskEncoder()
    ds = get_train_dataset(
        path, batch_size=batch, shuffle_buffer_size=shuffle, max_samples_per_sequence=3, blend_mode=mode, task_encoder=encoder, worker_config=config
    )
    return get_savable_loader(ds)


def _in_lock_step(loaders, steps: int, stream: list[str], share_a: float) -> None:
    """``steps`` global steps (each rank's next batch, ranks in lock step) appended to ``stream``;
    after each, dataset a's count is within one sample of ``share_a`` of the stream."""
    iterators = [iter(loader) for loader in loaders]
    for _ in range(steps):
        for it in iterators:
            stream.extend(next(it).__key__)
        count_a = sum(key.startswith("a") for key in stream)
        assert abs(count_a - len(stream) * share_a) < 1, (len(stream), count_a)


def _carried(state) -> list[bool]:
    return carried_datasets(state, len(SIZES))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    old=st.tuples(st.integers(1, 3), st.integers(0, 2)),
    new_world=st.integers(1, 3),
    mode=st.sampled_from(["random", "exact", "cost"]),
    seed=st.integers(0, 10**6),
)
@example(old=(1, 0), new_world=3, mode="exact", seed=0)  # a rank whose positions never take dataset a
def test_each_dataset_finishes_its_running_epoch_once(blend: Path, old, new_world: int, mode: str, seed: int) -> None:
    # The same number of global workers moves the worker states (nothing is carried; see
    # test_the_same_global_workers_move_their_states in test_elastic.py), except in exact mode.
    assume(mode == "exact" and old != (new_world, 0) or old[0] * max(1, old[1]) != new_world)
    rng = random.Random(seed)
    before: list[str] = []
    states = []
    for rank in range(old[0]):
        loader = _loader(blend, rank, *old, mode=mode, batch=1)
        for batch in itertools.islice(loader, rng.randint(0, 6)):
            before += batch.__key__
        states.append(loader.save_state_rank())
    # New ranks without workers, one sample per batch: after each, the rank's state says whether
    # the sample's dataset still reads what it carried (its source starts the next epoch only
    # when asked for one more sample, so its last carried sample is still counted as carried).
    after: list[str] = []
    for rank in range(new_world):
        loader = _loader(blend, rank, new_world, 0, mode=mode, batch=1)
        # (Exact, 3 ranks, weights 1:2 of period 3: a rank's positions are one residue modulo 3
        # and take one dataset only; it gets none of the other's rest.)
        loader.restore_state_global(states)
        it = iter(loader)
        carried = _carried(loader.save_state_rank())
        for _ in range(10 * sum(map(sum, SIZES.values()))):  # far more than the carried samples
            if not any(carried):
                break
            (key,) = next(it).__key__
            carried = _carried(loader.save_state_rank())
            if carried["ab".index(key[0])]:
                after.append(key)
        assert not any(carried), f"rank {rank} still reads carried samples after {len(after)}"
    for name in SIZES:
        counts = Counter(k for k in before + after if k.startswith(name))
        repeated = sorted(k for k, n in counts.items() if n > 1)
        assert not repeated and sorted(counts) == all_keys(name), (name, repeated[:5], sorted(set(all_keys(name)) - set(counts))[:5])


# (1, 3): 3 workers x batch 2, the stride of a worker's positions, shares the factor 3 with the
# schedule's period: worker 1's positions are 2 and 0 modulo 3, both dataset b's, so it gets none
# of dataset a's rest and the others take it.
@pytest.mark.parametrize(("old", "new"), [((2, 2), (1, 2)), ((1, 0), (2, 1)), ((3, 1), (2, 0)), ((2, 1), (1, 3))])
def test_exact_blend_holds_its_weights_at_every_step_across_the_change(blend: Path, old, new) -> None:
    stream: list[str] = []
    saving = [_loader(blend, rank, *old, mode="exact") for rank in range(old[0])]
    _in_lock_step(saving, 4, stream, 1 / 3)
    states = [loader.save_state_rank() for loader in saving]
    restored = [_loader(blend, rank, *new, mode="exact") for rank in range(new[0])]
    for loader in restored:
        loader.restore_state_global(states)
    _in_lock_step(restored, 12, stream, 1 / 3)


@pytest.mark.parametrize("mode", ["random", "cost"])
def test_the_blend_counts_carry_over(blend: Path, mode: str) -> None:
    saving = [_loader(blend, rank, 2, 1, mode=mode) for rank in range(2)]
    for loader in saving:
        list(itertools.islice(loader, 3))
    states = [loader.save_state_rank() for loader in saving]
    restored = [_loader(blend, rank, 3, 2, mode=mode) for rank in range(3)]
    for loader in restored:
        loader.restore_state_global(states)
    saved_counts = [row["samples"] for row in blend_report(states)]
    assert sum(saved_counts) == 12
    assert [row["samples"] for row in blend_report([loader.save_state_rank() for loader in restored])] == saved_counts


def test_samples_waiting_in_a_shuffle_buffer_are_blended_again(blend: Path) -> None:
    saving = [_loader(blend, rank, 2, 1, mode="random", batch=1, shuffle=6) for rank in range(2)]
    before = [key for loader in saving for batch in itertools.islice(loader, 4) for key in batch.__key__]
    states = [loader.save_state_rank() for loader in saving]
    restored = _loader(blend, 0, 1, 0, mode="random", batch=1, shuffle=6)
    restored.restore_state_global(states)
    # Every key delivered before the save comes at most once more in the next full epoch's worth.
    after = [key for batch in itertools.islice(restored, 63) for key in batch.__key__]
    counts = Counter(before + after)
    assert set(all_keys("a") + all_keys("b")) >= set(counts)
    assert all(counts[k] >= 1 for k in before)


REPETITIONS = {"a": 1.5, "b": 2}  # a: every sample once, then a partial epoch of half each worker's


@pytest.fixture(scope="module")
def epochized(blend: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("elastic_blend") / "epochized.yaml"
    entries = "".join(f"      - {{repetitions: {REPETITIONS[name]}, path: {blend.parent / name}}}\n" for name in SIZES)
    path.write_text(f"__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend_epochized:\n{entries}")
    return path


def _epochized_loader(path: Path, rank: int, world: int, workers: int, *, mode: str, shuffle: int | None = None, repeat: bool = False):
    config = WorkerConfig(rank=rank, world_size=world, num_workers=workers)
    ds = get_train_dataset(
        path, batch_size=1, shuffle_buffer_size=shuffle, max_samples_per_sequence=3, blend_mode=mode, repeat=repeat, worker_config=config
    )
    return get_savable_loader(ds)


def _one_pass(path: Path, topology, mode: str, shuffle: int | None) -> Counter:
    """How often each key comes in one uninterrupted pass (repeat=False: the loader ends)."""
    return Counter(key for rank in range(topology[0]) for batch in _epochized_loader(path, rank, *topology, mode=mode, shuffle=shuffle) for key in batch.__key__)


def _check_pass(delivered: Counter, expected: Counter) -> None:
    """Dataset b (2 repetitions): every key exactly twice.  Dataset a (1.5): every key once or
    twice, as many in all as one uninterrupted pass of the saved topology delivers (its partial
    epoch takes the first half of each old worker's slices in that epoch's order, so which keys
    come twice may differ)."""
    for name in SIZES:
        got = {k: n for k, n in delivered.items() if k.startswith(name)}
        want = {k: n for k, n in expected.items() if k.startswith(name)}
        assert sorted(got) == all_keys(name), (name, sorted(set(all_keys(name)) - set(got))[:5])
        assert sum(got.values()) == sum(want.values()), (name, sum(got.values()), sum(want.values()))
        allowed = {2} if name == "b" else {1, 2}
        assert set(got.values()) <= allowed, (name, Counter(got.values()))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    old=st.tuples(st.integers(1, 3), st.integers(0, 2)),
    new=st.tuples(st.integers(1, 3), st.integers(0, 2)),
    mode=st.sampled_from(["random", "exact"]),
    shuffle=st.sampled_from([None, 4]),
    seed=st.integers(0, 10**6),
)
@example(old=(2, 1), new=(1, 3), mode="exact", shuffle=4, seed=1)
def test_blend_epochized_finishes_the_running_pass(epochized: Path, old, new, mode: str, shuffle, seed: int) -> None:
    assume(old != new)
    expected = _one_pass(epochized, old, mode, shuffle)
    steps = random.Random(seed).randint(0, sum(expected.values()) // old[0])
    before: list[str] = []
    states = []
    for rank in range(old[0]):
        loader = _epochized_loader(epochized, rank, *old, mode=mode, shuffle=shuffle)
        for batch in itertools.islice(loader, steps):
            before += batch.__key__
        states.append(loader.save_state_rank())
    after = []
    for rank in range(new[0]):
        loader = _epochized_loader(epochized, rank, *new, mode=mode, shuffle=shuffle)
        loader.restore_state_global(states)
        after += [key for batch in loader for key in batch.__key__]
    _check_pass(Counter(before + after), expected)


def test_a_carried_pass_moves_again_and_the_next_pass_is_the_new_topologys(epochized: Path) -> None:
    """2 x 1 saves; 3 x 0 restores and saves inside the pass it carried; 1 x 0 finishes that pass
    (repeat=False ends it there); with repeat=True the next pass is one pass of 1 x 0."""
    expected = _one_pass(epochized, (2, 1), "exact", None)
    total = sum(expected.values())
    states, delivered = [], []
    for rank in range(2):
        loader = _epochized_loader(epochized, rank, 2, 1, mode="exact", repeat=True)
        delivered += [key for batch in itertools.islice(loader, 20) for key in batch.__key__]
        states.append(loader.save_state_rank())
    middle = []
    for rank in range(3):
        loader = _epochized_loader(epochized, rank, 3, 0, mode="exact", repeat=True)
        loader.restore_state_global(states)
        delivered += [key for batch in itertools.islice(loader, 15) for key in batch.__key__]
        middle.append(loader.save_state_rank())
    assert any(_carried(state)[0] or _carried(state)[1] for state in middle)  # saved inside the carried pass
    last = _epochized_loader(epochized, 0, 1, 0, mode="exact", repeat=True)
    last.restore_state_global(middle)
    stream = [key for batch in itertools.islice(last, 2 * total - len(delivered)) for key in batch.__key__]
    _check_pass(Counter(delivered + stream[: total - len(delivered)]), expected)
    _check_pass(Counter(stream[total - len(delivered) :]), _one_pass(epochized, (1, 0), "exact", None))


@pytest.mark.parametrize("mode", ["random", "exact"])
def test_a_carried_pass_resumes_exactly_on_its_topology(epochized: Path, mode: str) -> None:
    """States saved inside the carried pass (its pass weights, the repeats' carried flag) and at
    its end restore exactly, through JSON, on the topology they were saved with."""
    states = []
    for rank in range(2):
        loader = _epochized_loader(epochized, rank, 2, 0, mode=mode, repeat=True)
        list(itertools.islice(loader, 9))
        states.append(loader.save_state_rank())
    total = sum(_one_pass(epochized, (2, 0), mode, None).values())
    carried = total - 2 * 9
    loader = _epochized_loader(epochized, 0, 1, 0, mode=mode, repeat=True)
    loader.restore_state_global(states)
    it = iter(loader)
    saved = {}
    stream = []
    for step in range(carried + 10):
        if step in (0, 7, carried - 1, carried):
            saved[step] = json.loads(json.dumps(loader.save_state_rank()))
        stream += next(it).__key__
    assert "pass_weights" in json.dumps(saved[7]) or mode == "random"
    for step, state in saved.items():
        again = _epochized_loader(epochized, 0, 1, 0, mode=mode, repeat=True)
        again.restore_state_rank(state)
        assert [key for batch in itertools.islice(again, len(stream) - step) for key in batch.__key__] == stream[step:], step


def test_an_exact_schedule_too_long_to_tabulate_moves_without_walking_its_period(tmp_path: Path) -> None:
    """Weights 0.3333333 : 0.6666667 have a period of 10**7 positions (not tabulated): the new
    workers' rates come from a window and their schedules step on from a saved cursor, so the
    restore does not walk the period (before, it did, per new worker: hours); the blend stays
    within one sample of its weights at every step across the change."""
    path = write_text_blend(tmp_path, SIZES, {"a": 0.3333333, "b": 0.6666667})
    stream: list[str] = []

    def run(loaders, steps: int) -> None:
        _in_lock_step(loaders, steps, stream, 0.3333333)

    saving = [_loader(path, rank, 2, 1, mode="exact") for rank in range(2)]
    run(saving, 5)
    states = [loader.save_state_rank() for loader in saving]
    restored = [_loader(path, rank, 3, 0, mode="exact") for rank in range(3)]
    for loader in restored:
        loader.restore_state_global(states)
    run(restored, 10)


def _blend_stage(state):
    """The Blend stage's state inside a worker's pipeline state."""
    if state.get("stage") == "Blend":
        return state
    for child in [state.get("source"), *(state.get("sources") or [])]:
        if isinstance(child, dict) and (found := _blend_stage(child)) is not None:
            return found
    return None


def test_two_elastic_restores_count_the_blended_items_once(blend: Path) -> None:
    """After an elastic restore every new worker's stream starts at the saved global position
    (its ``offset``); a second elastic restore counts that position once, not once per worker,
    so the exact schedule goes on where the stream is."""
    stream: list[str] = []
    loaders = [_loader(blend, rank, 2, 0, mode="exact") for rank in range(2)]
    for new_world in (3, 1):
        _in_lock_step(loaders, 3, stream, 1 / 3)
        states = [loader.save_state_rank() for loader in loaders]
        loaders = [_loader(blend, rank, new_world, 0, mode="exact") for rank in range(new_world)]
        for loader in loaders:
            loader.restore_state_global(states)
        for loader in loaders:
            assert _blend_stage(loader.save_state_rank()["worker_states"][0])["offset"] == len(stream)
    _in_lock_step(loaders, 12, stream, 1 / 3)
