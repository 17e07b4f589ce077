"""A task encoder that overrides Energon's ``build_*`` methods keeps every guarantee of the default one.

The loader composes every pipeline from the same stage recipes (``pipeline/build.py``); Energon's
``build_*`` methods take its steps. So a pass-through override (``return super().build_batch(...)``)
gives the very same pipeline as the default encoder: the same batches and states, the same
checkpoint fingerprint, an exact blend within one sample of its weights, and a state that
``restore_state_global`` moves to another topology. A composition of its own keeps the spec's blend
mode and elastic resume; a stage that is not one of the loader's recipes is named at build time.
"""

from __future__ import annotations

import itertools
import logging
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from golden_pipeline import make_data

from megatron_energon_lite import WorkerConfig, get_savable_loader, get_train_dataset
from megatron_energon_lite.errors import ConfigError, NotSupportedError
from megatron_energon_lite.pipeline.node import Node, PassThroughNode
from megatron_energon_lite.energon.task_encoder import DefaultTaskEncoder
from megatron_energon_lite.energon.wrappers import MapDataset, SavableDataset

WEIGHTS = {"A": Fraction(2, 3), "B": Fraction(1, 3)}


class PassThroughBatch(DefaultTaskEncoder):
    def build_batch(self, dataset, **kwargs):
        return super().build_batch(dataset, **kwargs)


class PassThroughEncode(DefaultTaskEncoder):
    def build_encode_sample(self, dataset, **kwargs):
        return super().build_encode_sample(dataset, **kwargs)


class PassThroughTrain(DefaultTaskEncoder):
    def build_train_datasets(self, **kwargs):
        return super().build_train_datasets(**kwargs)


def _upper(sample: Any) -> Any:
    sample.text = sample.text.upper()
    return sample


class ExtraMap(DefaultTaskEncoder):
    """A composition of its own: one more map after encode_sample."""

    def build_encode_sample(self, dataset, *, worker_config):
        return MapDataset(super().build_encode_sample(dataset, worker_config=worker_config), _upper, worker_config=worker_config)


class Opaque(SavableDataset):
    """A dataset class of the user's own, around the composed pipeline."""

    def __init__(self, inner: SavableDataset) -> None:
        self.inner = inner
        self.worker_config = inner.worker_config

    def build_worker(self, local_worker_id: int, runtime: Any = None) -> Node:
        return self.inner.build_worker(local_worker_id, runtime)

    def worker_length(self, local_worker_id: int) -> int:
        return self.inner.worker_length(local_worker_id)

    def config(self) -> dict[str, Any]:
        return {"type": "Opaque", "inner": self.inner.config()}


class OpaqueWrapper(DefaultTaskEncoder):
    def build_batch(self, dataset, **kwargs):
        return Opaque(super().build_batch(dataset, **kwargs))


class TallyNode(PassThroughNode[Any]):
    """A stage of the user's own on the base node contract: counts the batches (its state); it
    does not implement the elastic protocol."""

    tag = "Tally"

    def __init__(self, source: Node) -> None:
        super().__init__(source)
        self.seen = 0

    def next(self) -> Any:
        item = self.source.next()
        self.seen += 1
        return item

    def get_state(self) -> dict[str, Any]:
        return {"stage": self.tag, "seen": self.seen, "source": self.source.get_state()}

    def reset(self, state: dict[str, Any] | None = None) -> None:
        self.source.reset(None if state is None else state["source"])
        self.seen = 0 if state is None else state["seen"]


class Tallied(Opaque):
    """The composed pipeline under a TallyNode; the recipe moves to another topology."""

    def build_worker(self, local_worker_id: int, runtime: Any = None) -> Node:
        return TallyNode(self.inner.build_worker(local_worker_id, runtime))

    def with_topology(self, worker_config: WorkerConfig) -> Tallied:
        return Tallied(self.inner.with_topology(worker_config))


class TalliedWrapper(DefaultTaskEncoder):
    def build_batch(self, dataset, **kwargs):
        return Tallied(super().build_batch(dataset, **kwargs))


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_data(tmp_path_factory.mktemp("overrides"))


def _loader(data: Path, task_encoder: Any, *, rank: int = 0, world: int = 1, workers: int = 2):
    ds = get_train_dataset(
        data / "blend_exact.yaml",
        batch_size=3,
        shuffle_buffer_size=None,
        max_samples_per_sequence=3,
        task_encoder=task_encoder,
        worker_config=WorkerConfig(rank=rank, world_size=world, num_workers=workers),
    )
    return get_savable_loader(ds)


def _keys(loader, steps: int) -> list[list[str]]:
    return [list(batch.__key__) for batch in itertools.islice(loader, steps)]


def _exact_within_one(stream: list[str]) -> None:
    counts = dict.fromkeys(WEIGHTS, 0)
    for n, key in enumerate(stream, start=1):
        counts[key[0]] += 1
        for name, weight in WEIGHTS.items():
            assert abs(counts[name] - weight * n) <= 1, (n, counts)


@pytest.mark.parametrize("encoder", [PassThroughBatch, PassThroughEncode, PassThroughTrain], ids=lambda c: c.__name__)
def test_a_pass_through_override_gives_the_default_pipeline(data: Path, encoder: type) -> None:
    default, override = _loader(data, DefaultTaskEncoder()), _loader(data, encoder())
    assert {k: v for k, v in override.savable_dataset.config().items() if k != "task_encoder"} == {
        k: v for k, v in default.savable_dataset.config().items() if k != "task_encoder"
    }
    assert override.savable_dataset.config()["blend_mode"] == "exact"
    batches = _keys(override, 12)
    assert batches == _keys(default, 12)
    _exact_within_one([key for batch in batches for key in batch])
    state = override.save_state_rank()
    assert {k: v for k, v in state.items() if k != "config"} == {k: v for k, v in default.save_state_rank().items() if k != "config"}


@pytest.mark.parametrize("encoder", [PassThroughBatch, PassThroughTrain], ids=lambda c: c.__name__)
def test_a_pass_through_override_resumes_on_another_topology(data: Path, encoder: type) -> None:
    def resumed(task_encoder_class: type) -> list[list[str]]:
        saved = _loader(data, task_encoder_class(), workers=2)
        _keys(saved, 5)
        states = [saved.save_state_rank()]
        moved = _loader(data, task_encoder_class(), workers=1)
        moved.restore_state_global(states)
        return _keys(moved, 8)

    assert resumed(encoder) == resumed(DefaultTaskEncoder)


def test_a_composition_of_its_own_keeps_the_exact_blend_and_elastic_resume(data: Path) -> None:
    loader = _loader(data, ExtraMap())
    config = loader.savable_dataset.config()
    assert config["blend_mode"] == "exact" and "composition" in config  # its own pipeline, in the fingerprint
    batches = _keys(loader, 12)
    keys = [key for batch in batches for key in batch]
    _exact_within_one(keys)
    assert keys == [key for batch in _keys(_loader(data, DefaultTaskEncoder()), 12) for key in batch]
    state = loader.save_state_rank()
    moved = _loader(data, ExtraMap(), workers=1)
    moved.restore_state_global([state])
    texts = [text for batch in itertools.islice(moved, 4) for text in batch.text]
    assert texts and all(text == text.upper() for text in texts)


def _restored_here_but_refused_on_another_topology(data: Path, encoder: type, named: str) -> None:
    loader = _loader(data, encoder())
    _keys(loader, 3)
    state = loader.save_state_rank()
    same = _loader(data, encoder())
    same.restore_state_rank(state)  # the same topology restores exactly
    assert _keys(same, 4) == _keys(loader, 4)
    moved = _loader(data, encoder(), workers=1)
    with pytest.raises(NotSupportedError, match=named):
        moved.restore_state_global([state])


def test_a_stage_of_the_users_own_is_named_at_build_time_and_refused_on_another_topology(data: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="megatron_energon_lite.loader"):
        _loader(data, OpaqueWrapper())
    assert "Opaque" in caplog.text and "restore_state_global" in caplog.text
    _restored_here_but_refused_on_another_topology(data, OpaqueWrapper, "Opaque")


def test_a_node_without_the_elastic_protocol_is_named_when_moved_to_another_topology(data: Path) -> None:
    """Its recipe moves, but its stage holds state of its own that elastic resume cannot divide:
    refused, naming the stage (a pass-through stage is not elastic unless it says so)."""
    _restored_here_but_refused_on_another_topology(data, TalliedWrapper, r"Tally stage \(TallyNode\)")


class WithoutRuntime(Opaque):
    """A dataset class of the user's own written before pipelines got their runtime."""

    def build_worker(self, local_worker_id: int) -> Node:  # type: ignore[override]
        return self.inner.build_worker(local_worker_id)


class WithoutRuntimeWrapper(DefaultTaskEncoder):
    def build_batch(self, dataset, **kwargs):
        return WithoutRuntime(super().build_batch(dataset, **kwargs))


def test_a_stage_of_the_users_own_that_drops_the_runtime_is_refused_at_build_time(data: Path) -> None:
    """Its inputs would run without the loader's skip sink, clock and cache pool: said at once,
    naming the class, instead of a TypeError in a worker."""
    with pytest.raises(ConfigError, match=r"(?s)WithoutRuntime\.build_worker does not take the worker pipeline's runtime.*runtime=None"):
        _loader(data, WithoutRuntimeWrapper())


def test_a_weight_schedule_is_refused_by_an_override_of_build_train_datasets(data: Path, tmp_path: Path) -> None:
    """Energon's LoadedDataset holds one number per dataset: a schedule could not reach the
    override, so it is refused instead of silently becoming a constant weight."""
    path = tmp_path / "scheduled.yaml"
    path.write_text(f"__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n      - {{weight: {{step: {{0: 1, 10: 2}}}}, path: {data / 'A'}}}\n      - {{weight: 1, path: {data / 'B'}}}\n")
    with pytest.raises(ConfigError, match=r"(?s)weight schedule cannot be handed.*blend\[0\]"):
        get_train_dataset(path, batch_size=3, shuffle_buffer_size=None, max_samples_per_sequence=3, task_encoder=PassThroughTrain(), worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0))
