"""Several items per message from a worker (``loader/handover/bundles.py``), delivered in the order of one per message.

In-process: :func:`bundled` and :class:`Interleave` driven by a simulation of torch's turns (one
request per worker in turn, results in request order, a worker skipped once its pass is over)
give the items in the order one-per-message would, raise a worker's error in its turn, and hold
few items however uneven the workers' bundles are.  With real workers: batches, saved states,
resumes, pass ends and a worker's error are those of the loader with bundles off, and those of
the loader without slabs when the bundles' pickles cross in slabs.
"""

from __future__ import annotations

import gc
import itertools
from collections import deque
from pathlib import Path

import pytest

from megatron_energon_lite import (
    DefaultTaskEncoder,
    WorkerConfig,
    get_loader,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
)
from megatron_energon_lite.loader.handover import bundles, slabs
from megatron_energon_lite.loader.handover.bundles import (
    BUNDLE_MS_ENV,
    MAX_BUNDLE_ITEMS,
    PASS_OVER,
    BundleLimits,
    Interleave,
    bundled,
)

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


class _Torch:
    """torch's side of the hand-over, simulated: workers are asked in turn (one request each, as
    the main process takes results), results come back in request order, and a worker whose
    bundles ran out is asked no more."""

    def __init__(self, workers: list) -> None:
        self.workers = [iter(w) for w in workers]
        self.active = [True] * len(workers)
        self.turns = itertools.cycle(range(len(workers)))

    def __iter__(self):
        return self

    def __next__(self):
        for _ in range(len(self.workers)):
            w = next(self.turns)
            if not self.active[w]:
                continue
            try:
                return next(self.workers[w])
            except StopIteration:
                self.active[w] = False
        raise StopIteration


def _one_per_message(workers: list[list]) -> list:
    """The order torch gives the workers' items sent one per message."""
    queues = [deque(items) for items in workers]
    order = []
    while any(queues):
        for q in queues:
            if q:
                order.append(q.popleft())
    return order


def _worker_items(w: int, count: int) -> list:
    return [(f"w{w}-{i}", w) for i in range(count)]


def _bundles(items: list, logical: int, limits: BundleLimits, seconds: float):
    return bundled(items, logical, carry=lambda entry: entry, size_of=lambda entry: 1, seconds=seconds, limits=limits, where=f"worker {logical}")


@pytest.mark.parametrize("counts", [(40, 40), (40, 13), (0, 7), (25, 30, 2)])
@pytest.mark.parametrize("seconds", [0.0, 1e9, "mixed"])
def test_items_come_in_the_order_of_one_per_message(counts: tuple[int, ...], seconds) -> None:
    """Bundles of one item (seconds 0), of as many as allowed (a long time) or both (a slow and a
    fast worker), uneven pass lengths included: the same order as one item per message."""
    items = [_worker_items(w, n) for w, n in enumerate(counts)]
    limits = BundleLimits(len(counts))
    per_worker = [(0.0 if w == 0 else 1e9) if seconds == "mixed" else seconds for w in range(len(counts))]
    stream = Interleave(_Torch([_bundles(items[w], w, limits, per_worker[w]) for w in range(len(counts))]), len(counts), 0, limits)
    assert list(stream) == _one_per_message(items)


def test_turns_start_with_the_worker_physical_worker_0_serves() -> None:
    """After a restore the workers are rotated: physical worker 0 serves logical worker 1."""
    items = [_worker_items(w, 5) for w in range(3)]
    limits = BundleLimits(3)
    rotated = [1, 2, 0]  # physical -> logical
    stream = Interleave(_Torch([_bundles(items[w], w, limits, 1e9) for w in rotated]), 3, 1, limits)
    assert list(stream) == _one_per_message([items[w] for w in rotated])


def test_few_items_wait_however_uneven_the_bundles() -> None:
    """A fast worker's bundles hold up to MAX_BUNDLE_ITEMS items, a slow one's one item: torch's
    turns make the main process take a bundle of each per round, yet the limits keep the fast
    worker's waiting items below a few bundles."""
    items = [_worker_items(0, 3000), _worker_items(1, 3000)]
    limits = BundleLimits(2)
    stream = Interleave(_Torch([_bundles(items[0], 0, limits, 1e9), _bundles(items[1], 1, limits, 0.0)]), 2, 0, limits)
    most = 0
    got = []
    for entry in stream:
        got.append(entry)
        most = max(most, max(len(p) for p in stream._pending))
    assert got == _one_per_message(items)
    assert most <= 2 * MAX_BUNDLE_ITEMS + 1, most


def _failing(items: list, at: int):
    for i, item in enumerate(items):
        if i == at:
            raise ValueError(f"broken item {item[0]}")
        yield item


def test_a_workers_error_comes_in_its_turn_and_ends_its_pass() -> None:
    """The items made before the error come first; the error is raised in that worker's turn (with
    its message); iteration goes on with the other worker, as torch's does."""
    items = [_worker_items(0, 10), _worker_items(1, 10)]
    limits = BundleLimits(2)
    stream = Interleave(_Torch([_bundles(_failing(items[0], 4), 0, limits, 1e9), _bundles(items[1], 1, limits, 1e9)]), 2, 0, limits)
    before = [next(stream) for _ in range(8)]
    assert before == _one_per_message([items[0][:4], items[1][:4]])
    with pytest.raises(ValueError, match="broken item w0-4"):
        next(stream)
    assert list(stream) == items[1][4:]


def test_the_last_bundle_ends_with_pass_over() -> None:
    limits = BundleLimits(1)
    bundles = list(_bundles(_worker_items(0, 5), 0, limits, 1e9))
    assert [len(b.entries) for b in bundles] == [1, 2, 3]  # 1, 2, then the last 2 items and PASS_OVER
    assert bundles[-1].entries[-1] is PASS_OVER


# --- with real workers -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def texts(prepared_text: Path) -> Path:
    """The shared prepared text dataset (tests/conftest.py: 3 shards x 37 samples): read-only."""
    return prepared_text


def _run(root: Path, monkeypatch: pytest.MonkeyPatch, bundle_ms: str, *, steps: int, restore: dict | None = None, task_encoder=None, workers: int = 2) -> tuple[list, list]:
    """Keys of ``steps`` batches and the state saved after each."""
    monkeypatch.setenv(BUNDLE_MS_ENV, bundle_ms)
    config = WorkerConfig(rank=0, world_size=1, num_workers=workers)
    dataset = get_train_dataset(root, batch_size=3, shuffle_buffer_size=5, max_samples_per_sequence=4, worker_config=config, task_encoder=task_encoder or DefaultTaskEncoder())
    loader = get_savable_loader(dataset)
    if restore is not None:
        loader.restore_state_rank(restore)
    keys, states = [], []
    it = iter(loader)
    for _ in range(steps):
        keys.append(next(it).__key__)
        states.append(loader.save_state_rank())
    del it, loader
    gc.collect()
    return keys, states


@pytest.mark.parametrize("workers", [2, 3])
def test_batches_and_states_equal_those_of_one_per_message(texts: Path, monkeypatch: pytest.MonkeyPatch, workers: int) -> None:
    """Over several passes (the workers' shares differ in length), every batch and every saved
    state is the same with bundles as without; a resume from a state saved mid-way, too."""
    keys, states = _run(texts, monkeypatch, "1000", steps=90, workers=workers)
    expected_keys, expected_states = _run(texts, monkeypatch, "0", steps=90, workers=workers)
    assert keys == expected_keys
    assert states == expected_states
    resumed, _ = _run(texts, monkeypatch, "1000", steps=30, restore=states[40], workers=workers)
    assert resumed == keys[41:71]


def test_bundles_through_slabs_give_the_batches_and_states_of_the_pipe(texts: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every bundle's pickles cross in a slab (the threshold lowered to a byte; the workers fork
    with it): batches and states are those of the loader without slabs, whose bundles go
    through the pipe."""
    read = []
    load = bundles.load_pickles_from_slab
    monkeypatch.setattr(bundles, "load_pickles_from_slab", lambda descriptor, lengths: read.append(len(lengths)) or load(descriptor, lengths))
    monkeypatch.setattr(slabs, "PICKLES_IN_SLAB_MIN_BYTES", 1)
    keys, states = _run(texts, monkeypatch, "1000", steps=90)
    assert len(read) >= 2 and sum(read) >= 60  # the bundles did cross in slabs
    monkeypatch.setenv(slabs.SLAB_MIB_ENV, "0")
    read.clear()
    expected_keys, expected_states = _run(texts, monkeypatch, "1000", steps=90)
    assert not read
    assert keys == expected_keys and states == expected_states


def test_one_pass_of_a_val_loader_is_the_same(texts: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def keys(bundle_ms: str) -> list:
        monkeypatch.setenv(BUNDLE_MS_ENV, bundle_ms)
        loader = get_loader(get_val_dataset(texts, split_part="train", batch_size=4, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=2)))
        result = [[k for k in b.__key__] for b in loader] + [["second pass"]] + [[k for k in b.__key__] for b in loader]
        del loader
        gc.collect()
        return result

    assert keys("1000") == keys("0")


def _reraise(exc, *args):
    raise exc


class _FailsOnce(DefaultTaskEncoder):
    """Raises at the 20th sample a worker encodes (the error handler stops the run)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = 0

    def encode_sample(self, sample):
        self.seen += 1
        if self.seen == 20:
            raise RuntimeError(f"broken sample {sample.__key__}")
        return super().encode_sample(sample)


@pytest.mark.parametrize("through_slabs", [False, True])
def test_a_workers_error_arrives_after_the_same_batches(texts: Path, monkeypatch: pytest.MonkeyPatch, through_slabs: bool) -> None:
    """Also when the bundles' pickles cross in slabs (the error travels beside them)."""
    if through_slabs:
        monkeypatch.setattr(slabs, "PICKLES_IN_SLAB_MIN_BYTES", 1)

    def until_error(bundle_ms: str) -> tuple[list, str]:
        monkeypatch.setenv(BUNDLE_MS_ENV, bundle_ms)
        config = WorkerConfig(rank=0, world_size=1, num_workers=2, global_error_handler=_reraise)
        loader = get_loader(get_train_dataset(texts, batch_size=3, shuffle_buffer_size=5, max_samples_per_sequence=4, worker_config=config, task_encoder=_FailsOnce()))
        keys = []
        with pytest.raises(Exception) as raised:
            for batch in loader:
                keys.append(batch.__key__)
        del loader
        gc.collect()
        return keys, str(raised.value)

    keys, message = until_error("1000")
    expected_keys, expected_message = until_error("0")
    assert keys == expected_keys and len(keys) >= 6
    assert "broken sample" in message and "broken sample" in expected_message
