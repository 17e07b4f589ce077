"""``batch_group_criterion`` and ``select_samples_to_pack`` run under the bad-sample guard.

A criterion that raises drops the sample it was grouping; a selection that raises drops the whole
packing buffer it was given (Energon 7.4.1's unit of failure for its pre-packer).  Both are
reported to the error handler with the sample keys, count against the failure tolerance, and
leave a state that resumes exactly.
"""

from __future__ import annotations

import io
import logging
import re
import tarfile
from pathlib import Path

import pytest
from resume import END, ListSource, check_resume_at_every_step, run

import megatron_energon_lite as lite
from megatron_energon_lite import (
    DefaultTaskEncoder,
    FatalSampleError,
    SkipSample,
    WorkerConfig,
    get_loader,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
    reraise_exception,
    stateless,
)
from megatron_energon_lite.errors import EnergonLiteError, StateError
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.pipeline.group import GroupBatchNode
from megatron_energon_lite.pipeline.guard import SampleGuard
from megatron_energon_lite.pipeline.pack import PackNode
from megatron_energon_lite.pipeline.repeat import RepeatNode

TEXT_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"
SHARDS, PER_SHARD = 4, 8
KEYS = [f"s{shard}_{i:02d}" for shard in range(SHARDS) for i in range(PER_SHARD)]
#: The criterion fails on this sample; the selection fails on the buffer that holds BAD_BUFFER_KEY.
BAD_KEY = "s3_05"
BAD_BUFFER_KEY = "s1_01"
BUFFER = 4
#: In a sequential pass (validation, no workers) buffers are runs of BUFFER samples in key order.
BAD_BUFFER = KEYS[KEYS.index(BAD_BUFFER_KEY) // BUFFER * BUFFER :][:BUFFER]


# --- a real dataset, written with tarfile --------------------------------------------------------
@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hook_guard") / "text"
    (root / "parts").mkdir(parents=True)
    for shard in range(SHARDS):
        with tarfile.open(root / f"parts/data-{shard}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for key in KEYS[shard * PER_SHARD : (shard + 1) * PER_SHARD]:
                data = f"text of {key}".encode()
                info = tarfile.TarInfo(f"{key}.txt")
                info.size, info.mtime, info.mode = len(data), 0, 0o644
                tar.addfile(info, io.BytesIO(data))
    prepare_dataset(root, split_parts=[("train", "parts/.*"), ("val", "parts/.*")], progress=False, num_workers=1, dataset_yaml=TEXT_YAML)
    return root


# --- the task encoders ---------------------------------------------------------------------------
class HookLogic:
    """What the failing hooks do, shared by our task encoders and (in the comparisons) Energon's.

    Packing keeps every sample alone (a pack is the sample), so the criterion sees sample keys.
    """

    bad_key: str | None = BAD_KEY
    bad_buffer_key: str | None = BAD_BUFFER_KEY
    skip = False  # raise SkipSample instead of an error

    def _fail(self) -> None:
        # No key in the message: the key in the reports must come from the loader.
        raise SkipSample() if self.skip else ValueError("the hook broke")

    def _select(self, samples):
        if any(s.__key__ == self.bad_buffer_key for s in samples):
            self._fail()
        return [[s] for s in samples]

    def _criterion(self, sample):
        if sample.__key__ == self.bad_key:
            self._fail()
        return int(sample.__key__[-1]) % 2, 3  # two groups (odd / even), batches of 3


class FailingEncoder(HookLogic, DefaultTaskEncoder):
    def __init__(self, *, skip: bool = False, bad_key: str | None = BAD_KEY, bad_buffer_key: str | None = BAD_BUFFER_KEY) -> None:
        super().__init__()
        self.skip, self.bad_key, self.bad_buffer_key = skip, bad_key, bad_buffer_key

    def select_samples_to_pack(self, samples):
        return self._select(samples)

    @stateless
    def pack_selected_samples(self, samples):
        return samples[0]

    @stateless
    def batch_group_criterion(self, sample):
        return self._criterion(sample)


class StrictEncoder(FailingEncoder):
    """The raise policy: the first failure stops the run."""

    __default_failure_tolerance__ = 1


class GroupingOnly(HookLogic, DefaultTaskEncoder):
    bad_buffer_key = None

    def batch_group_criterion(self, sample):
        return self._criterion(sample)


class PackingOnly(HookLogic, DefaultTaskEncoder):
    bad_key = None

    def select_samples_to_pack(self, samples):
        return self._select(samples)

    def pack_selected_samples(self, samples):
        return samples[0]


def config(workers: int, **kwargs) -> WorkerConfig:
    return WorkerConfig(rank=0, world_size=1, num_workers=workers, **kwargs)


def val_loader(dataset: Path, workers: int, encoder=None, **config_kwargs):
    ds = get_val_dataset(dataset, worker_config=config(workers, **config_kwargs), batch_size=None, packing_buffer_size=BUFFER, task_encoder=encoder or FailingEncoder())
    return get_loader(ds)


def train_loader(dataset: Path, workers: int, encoder=None):
    ds = get_train_dataset(dataset, worker_config=config(workers), batch_size=None, shuffle_buffer_size=5, max_samples_per_sequence=3, packing_buffer_size=BUFFER, task_encoder=encoder or FailingEncoder())
    return get_savable_loader(ds)


def skip_messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "skipping " in r.getMessage()]


# --- (a) the skip policy -------------------------------------------------------------------------
@pytest.mark.parametrize("workers", [0, 2])
def test_skip_policy_drops_the_sample_and_the_buffer_and_names_them(dataset: Path, workers: int, caplog: pytest.LogCaptureFixture) -> None:
    loader = val_loader(dataset, workers)
    with caplog.at_level(logging.WARNING):
        batches = [list(batch.__key__) for batch in loader]
    keys = [key for batch in batches for key in batch]
    messages = skip_messages(caplog)
    assert len(messages) == 2 and loader.skipped_samples == 2, messages
    (criterion,) = [m for m in messages if f"skipping sample {BAD_KEY} " in m]
    assert "ValueError: the hook broke" in criterion
    (buffer,) = [m for m in messages if m is not criterion]
    # The buffer's report names every sample of the buffer by key, and their files in the sources.
    listed = re.search(r"skipping (\d+) samples \[([^\]]*)\]", buffer)
    assert listed is not None, buffer
    named = listed[2].split(", ")
    assert int(listed[1]) == BUFFER and BAD_BUFFER_KEY in named and len(named) == BUFFER, buffer
    assert all(f"'{key}.txt'" in buffer for key in named)
    report = loader.skip_report()  # the same two skips, listed with the hook that failed
    assert report["skipped"] == 2 and report["samples"] == 1 + BUFFER
    assert sorted((entry["stage"], entry["samples"]) for entry in report["listed"]) == sorted([("batch_group_criterion", 1), ("select_samples_to_pack", BUFFER)])
    assert {entry["key"] for entry in report["listed"]} == {BAD_KEY, named[0]}
    if workers == 0:
        assert named == BAD_BUFFER
    assert len(keys) == len(set(keys)), "a sample was delivered twice"
    assert sorted(keys) == sorted(set(KEYS) - {BAD_KEY} - set(named))
    assert all(len(batch) <= 3 and len({int(k[-1]) % 2 for k in batch}) == 1 for batch in batches)


def test_skip_sample_drops_silently(dataset: Path, caplog: pytest.LogCaptureFixture) -> None:
    loader = val_loader(dataset, 0, FailingEncoder(skip=True))
    with caplog.at_level(logging.WARNING):
        keys = [key for batch in loader for key in batch.__key__]
    assert skip_messages(caplog) == [] and loader.skipped_samples == 0  # a decision, not a failure
    assert sorted(keys) == sorted(set(KEYS) - {BAD_KEY} - set(BAD_BUFFER))


def test_handler_gets_the_sample_and_the_buffer(dataset: Path) -> None:
    seen: list = []

    def handler(exc, sample, sources):
        seen.append((type(exc).__name__, [s.__key__ for s in sample] if isinstance(sample, list) else sample.__key__, sources is not None))

    list(val_loader(dataset, 0, global_error_handler=handler))
    assert seen == [("ValueError", BAD_BUFFER, True), ("ValueError", BAD_KEY, True)]


# --- (b) the raise policy ------------------------------------------------------------------------
@pytest.mark.parametrize("workers", [0, 2])
def test_tolerance_stops_at_the_criterion_naming_the_sample(dataset: Path, workers: int) -> None:
    loader = val_loader(dataset, workers, StrictEncoder(bad_buffer_key=None))
    with pytest.raises(FatalSampleError) as info:
        list(loader)
    assert isinstance(info.value, EnergonLiteError)
    message = str(info.value)
    assert "batch_group_criterion" in message and repr(BAD_KEY) in message and "the hook broke" in message


def test_tolerance_stops_at_the_selection_naming_the_buffer(dataset: Path) -> None:
    with pytest.raises(FatalSampleError) as info:
        list(val_loader(dataset, 0, StrictEncoder(bad_key=None)))
    message = str(info.value)
    assert "select_samples_to_pack" in message and all(repr(key) in message for key in BAD_BUFFER), message


class SelectionTolerance1(FailingEncoder):
    """Only the selection hook is strict: its own tolerance applies, not pack_selected_samples'."""

    @stateless(failure_tolerance=1)
    def select_samples_to_pack(self, samples):
        return self._select(samples)


def test_the_selection_hook_has_its_own_tolerance(dataset: Path) -> None:
    with pytest.raises(FatalSampleError, match="select_samples_to_pack"):
        list(val_loader(dataset, 0, SelectionTolerance1(bad_key=None)))


@pytest.mark.parametrize(("bad_key", "bad_buffer_key", "names"), [(BAD_KEY, None, [BAD_KEY]), (None, BAD_BUFFER_KEY, BAD_BUFFER)])
def test_reraise_handler_keeps_the_error_and_names_the_samples(dataset: Path, bad_key, bad_buffer_key, names) -> None:
    """Energon's reraise_exception: the hook's own exception stops the run (its type kept), with a
    note that names the hook and the sample(s)."""
    loader = val_loader(dataset, 0, FailingEncoder(bad_key=bad_key, bad_buffer_key=bad_buffer_key), global_error_handler=reraise_exception)
    with pytest.raises(ValueError, match="the hook broke") as info:
        list(loader)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    if hasattr(info.value, "add_note"):  # Python 3.11+
        assert ("batch_group_criterion" if bad_key else "select_samples_to_pack") in notes
        assert all(repr(key) in notes for key in names), notes


# --- (c) exact save / restore around the skips ---------------------------------------------------
@pytest.mark.parametrize("workers", [0, 2])
def test_state_after_a_skip_resumes_exactly(dataset: Path, workers: int) -> None:
    steps = 30  # several epochs: each one skips the bad sample and the bad buffer again
    loader = train_loader(dataset, workers)
    it = iter(loader)
    states, batches, skipped = [loader.save_state_rank()], [], [0]
    for _ in range(steps):
        batches.append(list(next(it).__key__))
        states.append(loader.save_state_rank())
        skipped.append(loader.skipped_samples)
    after_skip = [k for k in range(1, steps) if skipped[k] > skipped[k - 1]]
    assert len(after_skip) >= 2, skipped  # both hooks failed at least once
    assert all(BAD_KEY not in batch for batch in batches)
    checked = range(steps) if workers == 0 else sorted({0, *after_skip[:3], *(k - 1 for k in after_skip[:3])})
    for k in checked:
        fresh = train_loader(dataset, workers)
        fresh.restore_state_rank(states[k])
        assert [list(b.__key__) for _, b in zip(range(steps - k), fresh)] == batches[k:], f"resuming after step {k} diverged"


# --- the stages alone ----------------------------------------------------------------------------
WORDS = ["a", "bb", "ccc", "dddd", "e", "ff", "ggggg", "h", "iii", "jj", "k"]


class Recorder:
    def __init__(self) -> None:
        self.calls: list = []

    def __call__(self, exc, item, sources) -> None:
        self.calls.append([m["__key__"] for m in item] if isinstance(item, list) else item["__key__"])


def criterion(bad: str | None = "k3", skip: bool = False):
    def fn(item, index):
        if item["__key__"] == bad:
            raise SkipSample() if skip else KeyError("no group")
        return len(item["value"]) % 2, 2

    return fn


def select(bad: str | None = "k5", skip: bool = False):
    def fn(items, index):
        if any(item["__key__"] == bad for item in items):
            raise SkipSample() if skip else RuntimeError("cannot pack")
        return [[item] for item in items]

    return fn


def batcher(items, index):
    return {"value": [m["value"] for m in items], "keys": [m["__key__"] for m in items]}


def join(members, index):
    return {"value": "|".join(m["value"] for m in members), "keys": [m["__key__"] for m in members]}


@pytest.mark.parametrize("skip", [False, True])
def test_group_node_drops_the_failing_sample_and_resumes(skip: bool) -> None:
    handler = Recorder()
    node = GroupBatchNode(ListSource(WORDS), criterion(skip=skip), batcher, batch_size=None, guard=SampleGuard(handler, stage="batch"))
    keys = [k for event in run(node, 10) if event is not END for k in event[1]["keys"]]
    assert sorted(keys) == sorted(f"k{i}" for i in range(len(WORDS)) if i != 3)
    assert handler.calls == ([] if skip else ["k3"])
    assert node.get_state()["criterion_failures"] == 0 and node.get_state()["inputs"] == len(WORDS)
    check_resume_at_every_step(lambda: GroupBatchNode(RepeatNode(ListSource(WORDS)), criterion(skip=skip), batcher, batch_size=None, guard=SampleGuard(Recorder(), stage="batch")), steps=25)


@pytest.mark.parametrize("skip", [False, True])
def test_pack_node_drops_the_failing_buffer_and_resumes(skip: bool) -> None:
    handler = Recorder()
    node = PackNode(ListSource(WORDS), 4, select(skip=skip), join, guard=SampleGuard(handler, stage="pack_selected_samples"))
    keys = [k for event in run(node, 12) if event is not END for k in event[1]["keys"]]
    assert keys == [f"k{i}" for i in range(len(WORDS)) if not 4 <= i < 8]
    assert handler.calls == ([] if skip else [["k4", "k5", "k6", "k7"]])
    assert node.get_state()["left_out"] == 0  # a failed buffer is reported, not "left out"
    check_resume_at_every_step(lambda: PackNode(RepeatNode(ListSource(WORDS)), 3, select(skip=skip), join, guard=SampleGuard(Recorder(), stage="pack")), steps=25)


def test_criterion_and_selection_count_their_own_failures() -> None:
    group = GroupBatchNode(ListSource(WORDS), criterion(bad="k0"), batcher, batch_size=None, guard=SampleGuard(Recorder(), tolerance=5, stage="batch"))
    assert group.criterion_guard.tolerance == 5 and group.criterion_guard.stage == "batch_group_criterion"
    group.reset({**group.get_state(), "criterion_failures": 4})
    with pytest.raises(FatalSampleError, match="batch_group_criterion failed on 5 samples in a row"):
        group.next()
    pack = PackNode(ListSource(WORDS), 2, select(bad="k0"), join, guard=SampleGuard(Recorder(), tolerance=2, stage="pack"))
    assert pack.select_guard.stage == "select_samples_to_pack"
    pack.reset({**pack.get_state(), "select_failures": 1})
    with pytest.raises(FatalSampleError, match="select_samples_to_pack failed on 2 samples in a row") as info:
        pack.next()
    assert "'k0'" in str(info.value) and "'k1'" in str(info.value)


def test_states_without_the_new_counters_still_restore() -> None:
    group = GroupBatchNode(ListSource(WORDS), criterion(), batcher, batch_size=None)
    pack = PackNode(ListSource(WORDS), 4, select(), join)
    for node, key in ((group, "criterion_failures"), (pack, "select_failures")):
        node.next()
        state = node.get_state()
        rest = run(node, 3)
        older = {k: v for k, v in state.items() if k != key}
        node.reset(older)
        assert run(node, 3) == rest


def test_a_selection_that_fails_only_on_replay_is_a_state_error() -> None:
    calls = []

    def flaky(items, index):
        calls.append(index)
        if len(calls) > 1:
            raise RuntimeError("changed its mind")
        return [[item] for item in items]

    node = PackNode(ListSource(WORDS), 4, flaky, join)
    node.next()
    with pytest.raises(StateError, match="deterministic") as info:
        node.reset(node.get_state())
    assert "'k0'" in str(info.value) and "changed its mind" in str(info.value)


# --- Energon 7.4.1 and Energon mode --------------------------------------------------------------
@pytest.mark.energon
@pytest.mark.filterwarnings("ignore:.*pin_memory.*:UserWarning")
def test_buffer_failure_matches_energon_also_in_energon_mode(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    energon = pytest.importorskip("megatron.energon")
    from megatron_energon_lite import energon_mode

    class TheirEncoder(HookLogic, energon.DefaultTaskEncoder):
        bad_key = None

        def select_samples_to_pack(self, samples):
            return self._select(samples)

        def pack_selected_samples(self, samples):
            return samples[0]

    def run_with(module, encoder) -> tuple[list, list]:
        seen: list = []

        def handler(exc, sample, sources):
            seen.append([s.__key__ for s in sample] if isinstance(sample, list) else sample.__key__)

        wc = module.WorkerConfig(rank=0, world_size=1, num_workers=0, global_error_handler=handler)
        ds = module.get_val_dataset(dataset, worker_config=wc, batch_size=2, packing_buffer_size=BUFFER, task_encoder=encoder)
        return [list(b.__key__) for b in module.get_loader(ds)], seen

    theirs = run_with(energon, TheirEncoder())
    assert theirs[1] == [BAD_BUFFER]
    assert run_with(lite, PackingOnly()) == theirs
    monkeypatch.setattr(energon_mode, "_enabled", True)
    assert run_with(lite, PackingOnly()) == theirs


@pytest.mark.energon
@pytest.mark.filterwarnings("ignore:.*pin_memory.*:UserWarning")
def test_criterion_failure_is_reported_like_energons_but_the_sample_is_dropped(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Energon 7.4.1 reports the same sample to the handler, then (a bug: group_batch_dataset.py,
    ``__iter__`` reads ``bucket_key`` after the handled error) adds it to the previous sample's
    bucket.  We drop it, as the handler's contract says, in Energon mode too."""
    energon = pytest.importorskip("megatron.energon")
    from megatron_energon_lite import energon_mode

    class TheirEncoder(HookLogic, energon.DefaultTaskEncoder):
        bad_buffer_key = None

        def batch_group_criterion(self, sample):
            key, _ = self._criterion(sample)
            return key, None  # Energon: a fixed batch_size and a size from the criterion are exclusive

    def run_with(module, encoder, batch_size) -> tuple[list, list]:
        seen: list = []
        wc = module.WorkerConfig(rank=0, world_size=1, num_workers=0, global_error_handler=lambda exc, sample, sources: seen.append(sample.__key__))
        ds = module.get_val_dataset(dataset, worker_config=wc, batch_size=batch_size, task_encoder=encoder)
        return [k for b in module.get_loader(ds) for k in b.__key__], seen

    their_keys, their_seen = run_with(energon, TheirEncoder(), 3)
    assert their_seen == [BAD_KEY] and BAD_KEY in their_keys
    monkeypatch.setattr(energon_mode, "_enabled", True)
    our_keys, our_seen = run_with(lite, GroupingOnly(), None)
    assert our_seen == their_seen
    assert sorted(our_keys) == sorted(set(their_keys) - {BAD_KEY})
