"""Two loaders in one process do not see each other's runtime or policy (issue 35 item 5): each
worker pipeline gets its loader's cache pool and skip sink through its runtime
(``pipeline/runtime.py``), and what differs under ``as_energon`` is decided when a dataset is
planned and travels with its spec (``policy.py``)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from energon_lite_dev.synthetic import write_tar

from megatron_energon_lite import (
    DefaultTaskEncoder,
    NoCachePool,
    WorkerConfig,
    energon_mode,
    get_loader,
    get_train_dataset,
    policy,
)
from megatron_energon_lite.decode import TRUST_PICKLE_ENV, UntrustedDataError
from megatron_energon_lite.errors import SkipSink
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.pipeline.runtime import Runtime

NO_WORKERS = WorkerConfig(rank=0, world_size=1, num_workers=0)


class Watching(DefaultTaskEncoder):
    """Notes the cache pool each encode_sample call sees; fails on the samples whose index in
    their shard is a multiple of ``fail_every``."""

    def __init__(self, fail_every: int, *, pool: bool = True) -> None:
        super().__init__()
        self.fail_every = fail_every
        self.pool = pool
        self.pools: list = []
        self.failed: list[str] = []

    def encode_sample(self, sample):
        if self.pool:
            self.pools.append(self.cache)
        if int(sample.__key__[-6:]) % self.fail_every == 0:
            self.failed.append(sample.__key__)
            raise ValueError("bad on purpose")
        return sample


def _dataset(root: Path, task_encoder):
    return get_train_dataset(root, batch_size=2, shuffle_buffer_size=None, max_samples_per_sequence=None, worker_config=NO_WORKERS, task_encoder=task_encoder)


def test_two_loaders_in_turns_keep_their_own_cache_pool_and_skips(prepared_text: Path) -> None:
    first, second = Watching(fail_every=5), Watching(fail_every=7)
    pools = NoCachePool(), NoCachePool()
    loaders = [get_loader(_dataset(prepared_text, te), cache_pool=pool) for te, pool in zip((first, second), pools)]
    streams = [iter(loader) for loader in loaders]
    for _ in range(30):  # one batch of each, in turns, in this process
        for stream in streams:
            next(stream)
    for te, pool, loader in zip((first, second), pools, loaders):
        assert te.pools and all(seen is pool for seen in te.pools)
        assert te.failed and loader.skipped_samples == len(te.failed)
        assert sorted(entry["key"] for entry in loader.skip_report()["listed"]) == sorted(te.failed)
        assert {entry["stage"] for entry in loader.skip_report()["listed"]} == {"encode_sample"}


def test_a_pipeline_built_with_a_runtime_sends_its_skips_there_and_one_without_logs_them(prepared_text: Path, caplog: pytest.LogCaptureFixture) -> None:
    te = Watching(fail_every=4, pool=False)
    recipe = _dataset(prepared_text, te)
    runtimes = Runtime(skips=SkipSink()), Runtime(skips=SkipSink())
    pipelines = [recipe.build_worker(0, runtime) for runtime in runtimes]
    alone = recipe.build_worker(0)
    for _ in range(10):
        for pipeline in pipelines:
            pipeline.next()
    failures = len(te.failed)
    with caplog.at_level("WARNING"):
        alone.next()
        alone.next()
    taken = [runtime.skips.take() for runtime in runtimes]
    assert taken[0][0] and [r.key for r in taken[0][0]] == [r.key for r in taken[1][0]]  # the same samples, each its own
    assert len(taken[0][0]) + len(taken[1][0]) == failures
    assert all(runtime.skips.take() == ((), 0) for runtime in runtimes)
    assert "skipping sample" in caplog.text and " at encode_sample " in caplog.text  # without a sink: logged here


@pytest.fixture
def pickled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """TextSample.text holds an unpickled dict (a pkl part); no opt-in from the environment."""
    monkeypatch.delenv(TRUST_PICKLE_ENV, raising=False)
    monkeypatch.setattr(policy, "_logged", set())
    root = tmp_path / "pickled"
    write_tar(root / "shard_000.tar", [(f"k{i:03d}", {"pkl": pickle.dumps({"i": i}), "txt": b"x"}) for i in range(6)])
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1)
    (root / ".nv-meta/dataset.yaml").write_text("sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: pkl\n")
    return root


def test_the_policy_is_decided_when_a_dataset_is_planned_and_stays_with_it(pickled: Path) -> None:
    """A dataset planned under as_energon unpickles as Energon does, also after the switch is
    off again and next to a plain one, which refuses."""
    energon_mode.enable()
    try:
        as_energon = _dataset(pickled, DefaultTaskEncoder())
    finally:
        energon_mode.disable()
    plain = _dataset(pickled, DefaultTaskEncoder())
    assert as_energon.spec.policy == policy.ENERGON and plain.spec.policy == policy.PLAIN
    assert as_energon.config() == plain.config()  # the same fingerprint: states move between them
    energon_loader, plain_loader = get_loader(as_energon), get_loader(plain)
    assert energon_loader.policy == policy.ENERGON and plain_loader.policy == policy.PLAIN
    energons = iter(energon_loader)
    assert _unpickled(next(energons))
    with pytest.raises(UntrustedDataError):
        next(iter(plain_loader))
    assert _unpickled(next(energons))


def _unpickled(batch) -> bool:
    return batch.text == {"i": [int(key[1:]) for key in batch.__key__]}  # the batched dicts
