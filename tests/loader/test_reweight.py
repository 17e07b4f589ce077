"""Weight edits at resume (loader/reweight.py): a state restored into a blend whose weights or
datasets changed continues each kept dataset's stream where it stopped, with the new mix.

The property: a kept dataset's samples, per worker, in the order the run before the save and the
run after it delivered them, are a prefix of what the uninterrupted run (the old weights, never
saved) delivers of that dataset on that worker. Each worker reads its slices of a dataset in an
order that does not depend on the weights, so that holds exactly, and with it the running
epoch's samples come once each, none skipped. An added dataset starts as in a fresh run of the
new blend; a removed one delivers nothing more.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from energon_lite_dev.states import carried_datasets
from energon_lite_dev.synthetic import sized_keys, write_text_blend
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from megatron_energon_lite import DefaultTaskEncoder, WorkerConfig, get_savable_loader, get_train_dataset
from megatron_energon_lite.errors import StateError
from megatron_energon_lite.loader.env_settings import WEIGHT_EDIT_ENV

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

SIZES = {"a": [7, 5, 9, 3], "b": [11, 4, 8, 6, 10], "c": [6, 6]}
#: The blends the tests switch between: name -> {dataset: weight}.
BLENDS = {
    "ab": {"a": 1, "b": 2},
    # (Exact mode: a period of 5 shares no factor with the 4 positions of a round of 2 workers x
    # batch 2, so each worker takes both datasets; see docs/guide/blending.md.)
    "ab_reweighted": {"a": 3, "b": 2},
    "ab_scaled": {"a": 2, "b": 4},
    "abc": {"a": 1, "b": 2, "c": 2},
    "ac": {"c": 1, "a": 1},
    "b_only": {"b": 1},
}


@pytest.fixture(scope="module")
def blends(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("reweight")
    write_text_blend(base, SIZES, {"a": 1, "b": 1, "c": 1})
    paths = {}
    for name, weights in BLENDS.items():
        entries = "".join(f"      - {{weight: {w}, path: {d}}}\n" for d, w in weights.items())
        paths[name] = base / f"{name}.yaml"
        paths[name].write_text(f"__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n{entries}")
    return paths


def _loader(path: Path, *, workers: int, mode: str, rank: int = 0, world: int = 1, shuffle: int | None = None, batch: int = 2):
    ds = get_train_dataset(
        path, batch_size=batch, shuffle_buffer_size=shuffle, max_samples_per_sequence=3, blend_mode=mode,
        worker_config=WorkerConfig(rank=rank, world_size=world, num_workers=workers),
    )
    return get_savable_loader(ds)


def _run(loader, steps: int) -> list[tuple[int, str]]:
    """(worker, key) of every sample of the next ``steps`` batches."""
    out = []
    for batch in itertools.islice(loader, steps):
        out += [(loader.last_worker_id, key) for key in batch.__key__]
    return out


def _by_source(stream) -> dict[tuple[int, str], list[str]]:
    """Per (worker, dataset), its samples in delivery order."""
    found = defaultdict(list)
    for worker, key in stream:
        found[worker, key[0]].append(key)
    return found


_ref_cache: dict = {}


def _reference(path: Path, workers: int, mode: str, steps: int) -> dict[tuple[int, str], list[str]]:
    key = (path, workers, mode, steps)
    if key not in _ref_cache:
        _ref_cache[key] = _by_source(_run(_loader(path, workers=workers, mode=mode), steps))
    return _ref_cache[key]


EDITS = [("ab", "ab_reweighted"), ("ab", "abc"), ("abc", "ac"), ("abc", "b_only")]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    edit=st.sampled_from(EDITS),
    workers=st.sampled_from([0, 2]),
    mode=st.sampled_from(["random", "exact"]),
    before=st.integers(0, 14),
)
@example(edit=("ab", "abc"), workers=2, mode="exact", before=7)
@example(edit=("abc", "ac"), workers=0, mode="random", before=5)
def test_a_weight_edit_continues_each_datasets_stream_where_it_stopped(blends, edit, workers: int, mode: str, before: int) -> None:
    old, new = edit
    saving = _loader(blends[old], workers=workers, mode=mode)
    delivered = _run(saving, before)
    state = saving.save_state_rank()
    restored = _loader(blends[new], workers=workers, mode=mode)
    restored.restore_state_rank(state, allow_weight_edit=True)
    after = _run(restored, 90)  # 180 samples: every kept dataset runs past its first epoch
    uninterrupted = _reference(blends[old], workers, mode, 300)
    fresh = _reference(blends[new], workers, mode, 300)
    streams = _by_source(delivered + after)
    started = {worker for worker, _ in delivered}  # the others were saved before their first batch: they start fresh
    for (worker, name), keys in streams.items():
        if worker not in started:
            assert keys == fresh[worker, name][: len(keys)], (worker, name)
        elif name in BLENDS[old] and name in BLENDS[new]:
            assert keys == uninterrupted[worker, name][: len(keys)], (worker, name)
        elif name in BLENDS[new]:  # added: as in a fresh run of the new blend
            assert keys == fresh[worker, name][: len(keys)], (worker, name)
    assert not any(key[0] not in BLENDS[new] for _, key in after), "a removed dataset delivered samples"
    for name in BLENDS[new]:
        assert sum(k[0] == name for _, k in after) > 0, name
    # Every kept dataset finished its running epoch exactly once (the prefix above) and more.
    for name in set(BLENDS[old]) & set(BLENDS[new]):
        keys = [k for _, k in delivered + after if k[0] == name]
        assert len(set(keys)) == sum(SIZES[name]), name


@pytest.mark.parametrize("workers", [0, 2])
def test_exact_mode_holds_the_new_weights_from_the_restore_on(blends, workers: int) -> None:
    saving = _loader(blends["ab"], workers=workers, mode="exact")
    _run(saving, 6)  # whole rounds: every worker delivered 6 / max(1, workers) batches
    restored = _loader(blends["ab_reweighted"], workers=workers, mode="exact")
    restored.restore_state_rank(saving.save_state_rank(), allow_weight_edit=True)
    after = [key for _, key in _run(restored, 40)]
    for n in range(1, len(after) + 1):
        share_a = sum(key[0] == "a" for key in after[:n])
        assert abs(share_a - n * 3 / 5) < 1, (n, after[:n])


def test_without_the_opt_in_the_refusal_names_each_change_and_the_opt_in(blends, monkeypatch) -> None:
    monkeypatch.delenv(WEIGHT_EDIT_ENV, raising=False)
    saving = _loader(blends["abc"], workers=0, mode="random")
    _run(saving, 3)
    state = saving.save_state_rank()
    restored = _loader(blends["ac"], workers=0, mode="random")
    with pytest.raises(StateError) as caught:
        restored.restore_state_rank(state)
    message = str(caught.value)
    # Shares: the weights normalised (1:2:2 -> 1:1).
    assert "/c (split train): share 0.4 -> 0.5" in message
    assert "/a (split train): share 0.2 -> 0.5" in message
    assert "/b (split train): removed (share 0.4)" in message
    assert "the datasets' order changed" in message
    assert "allow_weight_edit=True" in message and WEIGHT_EDIT_ENV in message
    ab = _loader(blends["ab"], workers=0, mode="random")
    _run(ab, 1)
    with pytest.raises(StateError, match="c \\(split train\\): added \\(share 0.4\\)"):
        _loader(blends["abc"], workers=0, mode="random").restore_state_rank(ab.save_state_rank())



def test_weights_scaled_together_are_not_an_edit(blends) -> None:
    edited = blends["ab"].with_name("edited_in_place.yaml")
    edited.write_text(blends["ab"].read_text())
    saving = _loader(edited, workers=0, mode="random")
    _run(saving, 2)
    edited.write_text(blends["ab_scaled"].read_text())  # 2:4, the same shares as 1:2
    _loader(edited, workers=0, mode="random").restore_state_rank(saving.save_state_rank())


def test_the_environment_variable_opts_in(blends, monkeypatch, caplog) -> None:
    saving = _loader(blends["ab"], workers=0, mode="random")
    _run(saving, 3)
    state = saving.save_state_rank()
    monkeypatch.setenv(WEIGHT_EDIT_ENV, "1")
    restored = _loader(blends["abc"], workers=0, mode="random")
    with caplog.at_level(logging.INFO, logger="megatron_energon_lite.loader"):
        restored.restore_state_rank(state)
    (line,) = [r.getMessage() for r in caplog.records if "weight edit at resume" in r.getMessage()]
    assert "/c (split train): added (share 0.4)" in line
    # An explicit False wins over the variable.
    with pytest.raises(StateError, match="weights or datasets changed"):
        _loader(blends["abc"], workers=0, mode="random").restore_state_rank(state, allow_weight_edit=False)


def test_the_log_line_summarises_the_edit(blends, caplog) -> None:
    saving = _loader(blends["abc"], workers=0, mode="exact", shuffle=5, batch=1)
    _run(saving, 4)
    state = saving.save_state_rank()
    restored = _loader(blends["ac"], workers=0, mode="exact", shuffle=5, batch=1)
    with caplog.at_level(logging.INFO, logger="megatron_energon_lite.loader"):
        restored.restore_state_rank(state, allow_weight_edit=True)
    lines = [r.getMessage() for r in caplog.records if "weight edit at resume" in r.getMessage()]
    assert len(lines) == 1
    (line,) = lines
    assert "/c (split train): share 0.4 -> 0.5" in line and "/b (split train): removed (share 0.4)" in line
    assert "exact schedule of the new weights starts at global position" in line
    # The shuffle buffer's samples of b were dropped (and counted); the others wait on.
    waiting = _shuffle_buffer(state)
    dropped = sum(key[1] == 1 for key in waiting)
    assert f"{dropped} sample(s) of removed datasets waiting in buffers dropped" in line if dropped else "dropped" not in line
    kept = [key for key in _shuffle_buffer(restored.save_state_rank()) if True]
    assert sorted(tuple(k[2:]) for k in kept) == sorted(tuple(k[2:]) for k in waiting if k[1] != 1)


def _shuffle_buffer(state) -> list:
    node = state["worker_states"][0]
    while node.get("stage") != "Shuffle":
        node = node["source"]
    return node["buffer"]


@pytest.mark.parametrize("mode", ["random", "exact"])
def test_a_weight_edit_with_an_elastic_restore(blends, mode: str) -> None:
    """Saved on 2 ranks x 1 worker over a:b, restored on 3 ranks x 0 workers over a:b:c with new
    weights: every sample of a's and b's running epochs comes once over the two runs (as in
    test_elastic_blend.py: a new rank reads what it carried over until its state says it is done)."""
    saving = [_loader(blends["ab"], workers=1, world=2, rank=rank, mode=mode, batch=1) for rank in range(2)]
    before = [key for rank, loader in enumerate(saving) for _, key in _run(loader, 4 + rank)]
    states = [loader.save_state_rank() for loader in saving]
    after: list[str] = []
    for rank in range(3):
        loader = _loader(blends["abc"], workers=0, world=3, rank=rank, mode=mode, batch=1)
        loader.restore_state_global(states, allow_weight_edit=True)
        it = iter(loader)
        carried = carried_datasets(loader.save_state_rank(), 3)
        for _ in range(400):
            if not any(carried[:2]):
                break
            (key,) = next(it).__key__
            carried = carried_datasets(loader.save_state_rank(), 3)
            if key[0] in "ab" and carried["ab".index(key[0])]:
                after.append(key)
        assert not any(carried[:2]), f"rank {rank} still reads carried samples"
    for name in "ab":
        counts = Counter(k for k in before + after if k[0] == name)
        assert max(counts.values()) == 1 and len(counts) == sum(SIZES[name]), name


@pytest.mark.parametrize(("mode", "why"), [("cost", "blend_mode cost balances the costs")])
def test_cost_mode_refuses_a_weight_edit_with_the_reason(blends, mode: str, why: str) -> None:
    class Cost(DefaultTaskEncoder):
        def sample_cost(self, sample) -> int:
            return len(sample.text)

    def loader(path):
        return get_savable_loader(get_train_dataset(path, batch_size=2, blend_mode=mode, task_encoder=Cost(), worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0)))

    saving = loader(blends["ab"])
    _run(saving, 2)
    with pytest.raises(StateError, match=why):
        loader(blends["ab_reweighted"]).restore_state_rank(saving.save_state_rank(), allow_weight_edit=True)


def test_a_changed_blend_mode_is_not_a_weight_edit(blends) -> None:
    saving = _loader(blends["ab"], workers=0, mode="random")
    _run(saving, 2)
    with pytest.raises(StateError, match="blend_mode: saved 'random', now 'exact'"):
        _loader(blends["ab_reweighted"], workers=0, mode="exact").restore_state_rank(saving.save_state_rank(), allow_weight_edit=True)


def test_an_elastic_restore_that_puts_buffered_samples_back_starts_the_new_schedule_there(blends) -> None:
    """Exact mode with shuffle buffers: the elastic restore blends the buffered samples again,
    so the new stream starts before the saved workers' positions; the new weights' schedule
    starts there too (it was asked for a past position) and holds them from there."""
    saving = [_loader(blends["ab"], workers=0, world=4, rank=rank, mode="exact", shuffle=6) for rank in range(4)]
    for loader in saving:
        _run(loader, 3)
    states = [loader.save_state_rank() for loader in saving]
    restored = [_loader(blends["ab_reweighted"], workers=0, world=2, rank=rank, mode="exact", shuffle=6) for rank in range(2)]
    for loader in restored:
        loader.restore_state_global(states, allow_weight_edit=True)
    blended = [_blend_stage(loader.save_state_rank()["worker_states"][0]) for loader in restored]
    assert {b["mix_from"] for b in blended} == {b["offset"] for b in blended}, blended  # the new stream's start
    keys = [key for loader in restored for _, key in _run(loader, 10)]
    assert {key[0] for key in keys} == {"a", "b"}


def _blend_stage(state):
    if state.get("stage") == "Blend":
        return state
    return _blend_stage(state["source"])


class PairPacker(DefaultTaskEncoder):
    """Packs neighbours of a 5-sample buffer in pairs (a buffer of 5 stays open after a pack)."""

    def select_samples_to_pack(self, samples):
        return [samples[i : i + 2] for i in range(0, len(samples), 2)]

    def pack_selected_samples(self, samples):
        return dataclasses.replace(samples[0], __key__=",".join(s.__key__ for s in samples), text=" | ".join(s.text for s in samples))


def test_an_open_packing_buffer_refuses_a_weight_edit(blends) -> None:
    def loader(path):
        ds = get_train_dataset(path, batch_size=None, packing_buffer_size=5, task_encoder=PairPacker(), blend_mode="random", worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0))
        return get_savable_loader(ds)

    saving = loader(blends["ab"])
    list(itertools.islice(saving, 1))  # one pack of a buffer of three
    with pytest.raises(StateError, match="packing buffer open"):
        loader(blends["ab_reweighted"]).restore_state_rank(saving.save_state_rank(), allow_weight_edit=True)


def test_blend_epochized_refuses_an_edit_with_the_reason(blends) -> None:
    paths = []
    for name, reps in (("epochized_1", 1), ("epochized_2", 2)):
        path = blends["ab"].with_name(f"{name}.yaml")
        path.write_text(
            "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend_epochized:\n"
            f"      - {{repetitions: {reps}, path: a}}\n      - {{repetitions: 1, path: b}}\n"
        )
        paths.append(path)
    saving = _loader(paths[0], workers=0, mode="random")
    _run(saving, 2)
    with pytest.raises(StateError, match="(?s)a blend_epochized pass reads each dataset a fixed number of times.*restore into the blend and the data the state was saved with"):
        _loader(paths[1], workers=0, mode="random").restore_state_rank(saving.save_state_rank(), allow_weight_edit=True)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(edit=st.sampled_from(EDITS), workers=st.sampled_from([0, 2]), mode=st.sampled_from(["random", "exact"]), before=st.integers(1, 12))
@example(edit=("abc", "ac"), workers=2, mode="exact", before=5)
def test_with_a_shuffle_buffer_each_dataset_loses_and_repeats_nothing(blends, edit, workers: int, mode: str, before: int) -> None:
    """With a shuffle buffer above the blend the delivery order changes with the weights, but
    what each worker took from each kept dataset is still the uninterrupted run's sequence of
    that dataset: delivered before the save, delivered after it, or waiting in the buffer at the
    end, each exactly once."""
    old, new = edit
    saving = _loader(blends[old], workers=workers, mode=mode, shuffle=5)
    delivered = _run(saving, before)
    state = saving.save_state_rank()
    restored = _loader(blends[new], workers=workers, mode=mode, shuffle=5)
    restored.restore_state_rank(state, allow_weight_edit=True)
    after = _run(restored, 30)
    taken = _by_source(delivered + after)
    names = list(BLENDS[new])
    for worker, worker_state in enumerate(restored.save_state_rank()["worker_states"]):
        for key in _shuffle_buffer({"worker_states": [worker_state]}) if worker_state is not None else ():
            name = names[key[1]]
            taken[worker, name].append(sized_keys(name, SIZES[name])[key[-1]])
    sources = _reference(blends[old], workers, "random", 300)  # a dataset's order on a worker: the same in every blend
    started = {worker for worker, _ in delivered}
    for (worker, name), keys in taken.items():
        if worker in started and name in BLENDS[old] and name in BLENDS[new]:  # (a removed one's buffered samples were dropped)
            assert sorted(keys) == sorted(sources[worker, name][: len(keys)]), (worker, name)


def test_ranks_restoring_their_own_states_start_the_new_exact_schedule_together(blends) -> None:
    """restore_state_rank on each of 2 ranks (1 worker each): every rank finds the same round,
    so the global stream holds the new weights from the restore on."""
    saving = [_loader(blends["ab"], workers=1, world=2, rank=rank, mode="exact") for rank in range(2)]
    iterators = [iter(loader) for loader in saving]
    for _ in range(3):
        for it in iterators:
            next(it)
    states = [loader.save_state_rank() for loader in saving]
    restored = [_loader(blends["ab_reweighted"], workers=1, world=2, rank=rank, mode="exact") for rank in range(2)]
    for loader, state in zip(restored, states):
        loader.restore_state_rank(state, allow_weight_edit=True)
    stream: list[str] = []
    iterators = [iter(loader) for loader in restored]
    for _ in range(10):
        for it in iterators:  # ranks in lock step: one global step
            stream.extend(next(it).__key__)
        share_a = sum(key[0] == "a" for key in stream)
        assert abs(share_a - len(stream) * 3 / 5) < 1, (len(stream), stream)


def test_a_weight_edit_renumbers_the_saved_skip_list(blends) -> None:
    """Skip lists name samples by dataset index: after abc -> ac (c first now, b removed), the
    skipped sample of c is dataset 0 and the one of b is gone (nothing of b is read)."""
    saving = _loader(blends["abc"], workers=0, mode="random")
    saving.restore_state_rank(None, skip_samples=[{"dataset": 2, "index": 0}, {"dataset": 1, "index": 1}])
    _run(saving, 2)
    state = saving.save_state_rank()
    assert [(s["dataset"], s["path"].rsplit("/", 1)[-1]) for s in state["sample_skips"]["samples"]] == [(2, "c"), (1, "b")]
    restored = _loader(blends["ac"], workers=0, mode="random")
    restored.restore_state_rank(state, allow_weight_edit=True)
    after = restored.save_state_rank()["sample_skips"]["samples"]
    assert [(s["dataset"], s["index"], s["path"].rsplit("/", 1)[-1]) for s in after] == [(0, 0, "c")]
