"""``energon_lite_dev.resume.check_loader_resume`` itself: it passes on a loader that resumes
exactly, with and without workers and across pass ends, and fails, naming the step, on loaders
whose resume is broken (a skipped batch, a state ignored or from another step, a state that is
not plain JSON or changes after it was returned, a make_loader that is not deterministic).
Worker processes are gone when it returns, also when it fails."""

from __future__ import annotations

import itertools
import multiprocessing
from pathlib import Path

import pytest
from energon_lite_dev.prepared import PREPARED_TEXT
from energon_lite_dev.resume import END, batch_identity, check_loader_resume

from megatron_energon_lite import DefaultTaskEncoder, WorkerConfig, get_savable_loader, get_train_dataset, get_val_dataset

ALL_KEYS = {f"{shard:04d}_{index:06d}" for shard in range(PREPARED_TEXT["num_shards"]) for index in range(PREPARED_TEXT["samples_per_shard"])}


def train(root: Path, workers: int, **kwargs):
    config = WorkerConfig(rank=0, world_size=1, num_workers=workers, seed_offset=kwargs.pop("seed_offset", 0))
    settings = dict(batch_size=4, shuffle_buffer_size=5, max_samples_per_sequence=4, worker_config=config)
    return get_savable_loader(get_train_dataset(root, **{**settings, **kwargs}))


class Proxy:
    """A loader with some methods replaced by a subclass; the rest is the real loader's."""

    def __init__(self, loader) -> None:
        self.loader = loader

    def __getattr__(self, name: str):
        return getattr(self.loader, name)

    def __iter__(self):
        return iter(self.loader)


class SkipsABatchAfterRestore(Proxy):
    restored = False

    def restore_state_rank(self, state) -> None:
        self.loader.restore_state_rank(state)
        self.restored = True

    def __iter__(self):
        it = iter(self.loader)
        if self.restored:
            self.restored = False
            next(it)
        yield from it


class IgnoresTheState(Proxy):
    def restore_state_rank(self, state) -> None:
        pass


class SavesOneStepLate(Proxy):
    """save_state_rank() returns the state of the call before (the first time: the current one)."""

    previous = None

    def save_state_rank(self) -> dict:
        state = self.loader.save_state_rank()
        previous, self.previous = self.previous, state
        return state if previous is None else previous


@pytest.fixture
def no_new_processes():
    before = {p.pid for p in multiprocessing.active_children()}
    yield
    left = [p for p in multiprocessing.active_children() if p.pid not in before]
    assert not left, f"worker processes left running: {left}"


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loader_that_resumes_exactly_passes(prepared_text: Path, workers: int, no_new_processes) -> None:
    stream = check_loader_resume(lambda: train(prepared_text, workers), 12, at=None if workers == 0 else (0, 1, 5, 12))
    assert len(stream) == 12 and END not in stream
    for step, (restore_key, keys) in enumerate(stream):
        assert restore_key[:2] == ("Worker", step % max(workers, 1)) and len(keys) == 4 and set(keys) <= ALL_KEYS
    assert stream == [batch_identity(batch) for _, batch in zip(range(12), train(prepared_text, workers))]


@pytest.mark.parametrize("workers", [0, 2])
def test_pass_ends_are_steps_and_resume_too(prepared_text: Path, workers: int, no_new_processes) -> None:
    """111 samples in batches of 10 (the last of a pass has 1): 12 batches and an END per pass."""

    def make():
        config = WorkerConfig(rank=0, world_size=1, num_workers=workers)
        return get_savable_loader(get_val_dataset(prepared_text, split_part="train", batch_size=10, worker_config=config))

    stream = check_loader_resume(make, 30, at=(0, 5, 12, 13, 20, 26, 30))
    assert [k for k, event in enumerate(stream) if event == END] == [12, 25]
    assert stream[13:25] == stream[:12]  # validation: every pass is the same
    assert sorted(key for _, keys in stream[:12] for key in keys) == sorted(ALL_KEYS)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_restore_that_skips_a_batch_fails_naming_the_step(prepared_text: Path, workers: int, no_new_processes) -> None:
    with pytest.raises(AssertionError, match=r"state saved after step 3 of 8 diverged at step 3 \(0 steps after the restore\)\n  expected: .*\n  found:    ") as raised:
        check_loader_resume(lambda: SkipsABatchAfterRestore(train(prepared_text, workers)), 8, at=(3, 5))
    # The expected identity is the one the uninterrupted run gave at step 3, the found one step 4's.
    stream = check_loader_resume(lambda: train(prepared_text, workers), 8, at=(8,))
    expected, found = str(raised.value).split("\n")[1:3]
    assert str(stream[3][1]) in expected and str(stream[4][1]) in found


def test_a_loader_that_ignores_the_state_fails(prepared_text: Path) -> None:
    check_loader_resume(lambda: IgnoresTheState(train(prepared_text, 0)), 6, at=(0,))  # nothing to restore at 0
    with pytest.raises(AssertionError, match="state saved after step 2 of 6 diverged at step 2"):
        check_loader_resume(lambda: IgnoresTheState(train(prepared_text, 0)), 6, at=(0, 2))


def test_a_state_from_another_step_fails(prepared_text: Path) -> None:
    with pytest.raises(AssertionError, match="state saved after step 1 of 6 diverged at step 1"):
        check_loader_resume(lambda: SavesOneStepLate(train(prepared_text, 0)), 6)


class Tagged(DefaultTaskEncoder):
    """Tags every batch's keys with its own number: each loader gives other keys."""

    def __init__(self, tag: int) -> None:
        super().__init__()
        self.tag = tag

    def encode_batch(self, batch):
        batch.__key__ = [f"{key}#{self.tag}" for key in batch.__key__]
        return batch


def test_a_make_loader_that_is_not_deterministic_is_named(prepared_text: Path) -> None:
    tags = itertools.count()
    with pytest.raises(AssertionError, match=r"after step 0 of 6 diverged at step 0(.|\n)*is make_loader\(\) deterministic"):
        check_loader_resume(lambda: train(prepared_text, 0, task_encoder=Tagged(next(tags))), 6, at=(0,))


class TupleInState(Proxy):
    def save_state_rank(self) -> dict:
        return {**self.loader.save_state_rank(), "extra": (1, 2)}


class ObjectInState(Proxy):
    def save_state_rank(self) -> dict:
        return {**self.loader.save_state_rank(), "extra": object()}


class OneStateObject(Proxy):
    """Returns the same dict every time, updated in place."""

    state: dict = {}

    def save_state_rank(self) -> dict:
        self.state.clear()
        self.state.update(self.loader.save_state_rank())
        return self.state


@pytest.mark.parametrize(
    ("proxy", "message"),
    [(TupleInState, "does not survive a JSON round trip"), (ObjectInState, "is not JSON"), (OneStateObject, r"changed after save_state_rank\(\) returned it")],
)
def test_a_state_that_is_not_a_plain_snapshot_fails(prepared_text: Path, proxy: type, message: str) -> None:
    proxy.state = {}
    with pytest.raises(AssertionError, match=message):
        check_loader_resume(lambda: proxy(train(prepared_text, 0)), 4)


class RebuildsOtherSamples(Proxy):
    """restore_sample() of the key with every sample index moved on by one."""

    def restore_sample(self, restore_key):
        moved = tuple((part[0], (part[1] + 1) % len(ALL_KEYS)) if isinstance(part, tuple) and len(part) == 2 and isinstance(part[1], int) else part for part in restore_key)
        assert moved != restore_key
        return self.loader.restore_sample(moved)


@pytest.mark.parametrize("workers", [0, 2])
def test_restore_samples_rebuilds_every_batch(prepared_text: Path, workers: int, no_new_processes) -> None:
    check_loader_resume(lambda: train(prepared_text, workers), 6, at=(3,), restore_samples=True)


def test_restore_samples_fails_on_another_batch(prepared_text: Path) -> None:
    with pytest.raises(AssertionError, match=r"restore_sample\(.*\) rebuilt another batch than step 0's"):
        check_loader_resume(lambda: RebuildsOtherSamples(train(prepared_text, 0)), 4, at=(0,), restore_samples=True, identity=lambda batch: list(batch.__key__))


def test_a_custom_identity_is_recorded_and_compared(prepared_text: Path) -> None:
    stream = check_loader_resume(lambda: train(prepared_text, 0), 5, identity=lambda batch: (list(batch.__key__), list(batch.text)))
    assert all(len(keys) == len(texts) == 4 for keys, texts in stream)


def test_bad_arguments(prepared_text: Path) -> None:
    with pytest.raises(ValueError, match="steps"):
        check_loader_resume(lambda: train(prepared_text, 0), 0)
    with pytest.raises(ValueError, match=r"at= holds 7"):
        check_loader_resume(lambda: train(prepared_text, 0), 6, at=(1, 7))
    with pytest.raises(TypeError, match="identity="):
        batch_identity([1, 2])
    assert batch_identity({"__key__": ("a", "b"), "__restore_key__": ["Worker", 0, ["x", 1]]}) == (("Worker", 0, ("x", 1)), ["a", "b"])
