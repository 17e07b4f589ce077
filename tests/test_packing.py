"""Packing and length grouping through the loader, with exact save/restore."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from energon_lite_dev.resume import batch_identity, check_loader_resume
from energon_lite_dev.synthetic import prepared_text_dataset

from megatron_energon_lite import (
    ConfigError,
    DefaultTaskEncoder,
    Sample,
    TextSample,
    WorkerConfig,
    get_loader,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
    stateless,
)

SEQ = 64


def tokenize(text: str) -> list[int]:
    """A byte-level tokenizer: one token per UTF-8 byte (no downloads in tests)."""
    return list(text.encode("utf-8"))


@dataclasses.dataclass
class Tokens(Sample):
    tokens: Any = None


@dataclasses.dataclass
class Packed(Sample):
    tokens: Any = None  # (SEQ,) int64, padded with 0
    cu_seqlens: Any = None  # sequence boundaries inside the pack
    keys: Any = None


class PackingEncoder(DefaultTaskEncoder):
    @stateless
    def encode_sample(self, sample: TextSample) -> Tokens:
        tokens = tokenize(sample.text)[:SEQ]
        return Tokens(__key__=sample.__key__, __restore_key__=sample.__restore_key__, __subflavors__=sample.__subflavors__, __sources__=sample.__sources__, tokens=tokens)

    def select_samples_to_pack(self, samples: list[Tokens]) -> list[list[Tokens]]:
        groups: list[list[Tokens]] = []
        for sample in sorted(samples, key=lambda s: -len(s.tokens)):
            for group in groups:
                if sum(len(m.tokens) for m in group) + len(sample.tokens) <= SEQ:
                    group.append(sample)
                    break
            else:
                groups.append([sample])
        return groups

    @stateless
    def pack_selected_samples(self, samples: list[Tokens]) -> Packed:
        tokens = torch.zeros(SEQ, dtype=torch.int64)
        bounds, offset = [0], 0
        for sample in samples:
            tokens[offset : offset + len(sample.tokens)] = torch.tensor(sample.tokens)
            offset += len(sample.tokens)
            bounds.append(offset)
        return Packed(__key__="+".join(s.__key__ for s in samples), __restore_key__=(), __subflavors__=None, __sources__=(), tokens=tokens, cu_seqlens=torch.tensor(bounds), keys=[s.__key__ for s in samples])


class GroupingEncoder(DefaultTaskEncoder):
    @stateless
    def batch_group_criterion(self, sample: TextSample):
        words = len(sample.text.split())
        return ("short", 4) if words < 10 else ("long", 2)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return prepared_text_dataset(tmp_path_factory.mktemp("packing") / "text", split_ratio=(2, 2, 0), num_shards=4, samples_per_shard=15, min_words=1, max_words=20, seed=5)


def config(workers: int) -> WorkerConfig:
    return WorkerConfig(rank=0, world_size=1, num_workers=workers)


def packed_train(dataset: Path, workers: int, **kwargs):
    settings = dict(worker_config=config(workers), batch_size=3, shuffle_buffer_size=5, max_samples_per_sequence=4, packing_buffer_size=8, task_encoder=PackingEncoder())
    settings.update(kwargs)
    return get_train_dataset(dataset, **settings)


def test_one_pass_packs_every_sample_once_within_the_length(dataset: Path) -> None:
    packs = list(get_loader(packed_train(dataset, 0, repeat=False, batch_size=None, shuffle_buffer_size=None)))
    keys = [k for p in packs for k in p.keys]
    assert sorted(keys) == sorted(set(keys)) and len(keys) == 30
    for p in packs:
        assert int(p.cu_seqlens[-1]) <= SEQ and p.tokens.shape == (SEQ,)
        assert len(p.cu_seqlens) == len(p.keys) + 1


def _keys(batch) -> list:
    return [list(k) for k in batch.keys] if isinstance(batch.keys[0], list) else list(batch.keys)


@pytest.mark.parametrize("workers", [0, 2])
def test_packing_resumes_at_every_step(dataset: Path, workers: int) -> None:
    check_loader_resume(lambda: get_savable_loader(packed_train(dataset, workers)), 16, at=None if workers == 0 else (0, 1, 4, 9, 16), identity=lambda b: (batch_identity(b), _keys(b)))


def test_restore_sample_rebuilds_a_packed_batch(dataset: Path) -> None:
    loader = get_savable_loader(packed_train(dataset, 2))
    batch = [b for _, b in zip(range(3), loader)][-1]
    rebuilt = loader.restore_sample(batch.__restore_key__)
    assert _keys(rebuilt) == _keys(batch) and torch.equal(rebuilt.tokens, batch.tokens)


@pytest.mark.parametrize("workers", [0, 2])
def test_grouped_batches_resume_at_every_step(dataset: Path, workers: int) -> None:
    def make():
        return get_savable_loader(get_train_dataset(dataset, worker_config=config(workers), batch_size=None, shuffle_buffer_size=5, max_samples_per_sequence=4, task_encoder=GroupingEncoder()))

    def grouped(batch):
        words = [len(t.split()) for t in batch.text]
        assert len(batch.text) == (4 if words[0] < 10 else 2) and len({w < 10 for w in words}) == 1
        return batch_identity(batch)

    check_loader_resume(make, 20, at=None if workers == 0 else (0, 3, 11, 20), identity=grouped)


def test_validation_flushes_partial_groups_at_the_end(dataset: Path) -> None:
    ds = get_val_dataset(dataset, worker_config=config(0), batch_size=None, task_encoder=GroupingEncoder())
    batches = list(get_loader(ds))
    keys = [k for b in batches for k in b.__key__]
    assert len(keys) == 30 and len(set(keys)) == 30
    dropped = get_val_dataset(dataset, worker_config=config(0), batch_size=None, batch_drop_last=True, task_encoder=GroupingEncoder())
    assert all(len(b.__key__) in (2, 4) for b in get_loader(dropped))


def test_packing_needs_the_packing_hooks(dataset: Path) -> None:
    with pytest.raises(ConfigError, match="packing_buffer_size needs a task encoder that packs"):
        packed_train(dataset, 0, task_encoder=DefaultTaskEncoder())


def test_restore_sample_rebuilds_a_grouped_batch(dataset: Path) -> None:
    loader = get_savable_loader(get_train_dataset(dataset, worker_config=config(2), batch_size=None, shuffle_buffer_size=5, max_samples_per_sequence=4, task_encoder=GroupingEncoder()))
    batch = [b for _, b in zip(range(5), loader)][-1]
    rebuilt = loader.restore_sample(batch.__restore_key__)
    assert list(rebuilt.__key__) == list(batch.__key__) and list(rebuilt.text) == list(batch.text)


class PoppingPackingEncoder(PackingEncoder):
    """Energon's documented PackingCaptioningTaskEncoder: sorts its argument and pops from it."""

    def select_samples_to_pack(self, samples: list[Tokens]) -> list[list[Tokens]]:
        samples.sort(key=lambda s: len(s.tokens))
        groups = []
        while samples:
            group, used = [], 0
            while samples and used + len(samples[0].tokens) <= SEQ:
                sample = samples.pop(0)
                group.append(sample)
                used += len(sample.tokens)
            groups.append(group or [samples.pop(0)])
        return groups


class DroppingPackingEncoder(PackingEncoder):
    """Packs only the shortest half of each buffer; the rest is left out (Energon drops it)."""

    def select_samples_to_pack(self, samples: list[Tokens]) -> list[list[Tokens]]:
        ordered = sorted(samples, key=lambda s: (len(s.tokens), s.__key__))
        return [[s] for s in ordered[: len(ordered) // 2]]


@pytest.mark.parametrize("workers", [0, 2])
def test_energons_popping_packer_packs_and_resumes(dataset: Path, workers: int) -> None:
    packs = list(get_loader(packed_train(dataset, 0, repeat=False, batch_size=None, shuffle_buffer_size=None, task_encoder=PoppingPackingEncoder())))
    keys = [k for p in packs for k in p.keys]
    assert len(keys) == 30 and len(set(keys)) == 30

    check_loader_resume(lambda: get_savable_loader(packed_train(dataset, workers, task_encoder=PoppingPackingEncoder())), 8, at=(0, 3, 8), identity=lambda b: (batch_identity(b), _keys(b)))


def test_a_packer_that_leaves_samples_out_drops_them_with_a_warning(dataset: Path, caplog) -> None:
    caplog.set_level("WARNING", logger="megatron_energon_lite.pipeline.pack")
    ds = packed_train(dataset, 0, repeat=False, batch_size=None, shuffle_buffer_size=None, task_encoder=DroppingPackingEncoder())
    packs = list(get_loader(ds))
    # 30 samples in buffers of 8, 8, 8, 6: half of each is packed.
    assert len(packs) == 4 + 4 + 4 + 3 and all(len(p.keys) == 1 for p in packs)
    warnings = [r.getMessage() for r in caplog.records if "select_samples_to_pack left" in r.getMessage()]
    assert warnings and "left 4 of 8 samples" in warnings[0] and "4 dropped so far" in warnings[0]
    assert "8 dropped so far" in warnings[-1]


class DictEncoder(DefaultTaskEncoder):
    """Returns plain dicts without __restore_key__, for model(**batch)."""

    @stateless
    def encode_sample(self, sample: TextSample) -> dict:
        return {"length": torch.tensor(len(sample.text)), "first": torch.tensor(ord(sample.text[0]))}

    def batch(self, samples: list[dict]) -> dict:
        return {"length": torch.stack([s["length"] for s in samples]), "first": torch.stack([s["first"] for s in samples])}


@pytest.mark.parametrize("workers", [0, 2])
def test_dict_batches_have_no_restore_key_entry_and_still_restore(dataset: Path, workers: int) -> None:
    def model(length, first):
        return length + first

    def make():
        return get_savable_loader(get_train_dataset(dataset, worker_config=config(workers), batch_size=3, shuffle_buffer_size=5, max_samples_per_sequence=4, task_encoder=DictEncoder()))

    def lengths(batch):
        assert type(batch) is dict and set(batch) == {"length", "first"}
        model(**batch)
        return batch["length"].tolist(), batch["first"].tolist()

    # restore_samples: restore_sample rebuilds each batch (by the loader's last_restore_key).
    check_loader_resume(make, 6, at=(2,), identity=lengths, restore_samples=True)


class DictGroupingEncoder(DictEncoder):
    """Groups plain dicts (without __restore_key__): the group buffer saves their keys."""

    @stateless
    def batch_group_criterion(self, sample: dict):
        return ("short", 4) if int(sample["length"]) < 60 else ("long", 2)


def test_grouped_dict_items_resume_exactly(dataset: Path) -> None:
    def make():
        return get_savable_loader(get_train_dataset(dataset, worker_config=config(0), batch_size=None, shuffle_buffer_size=5, max_samples_per_sequence=4, task_encoder=DictGroupingEncoder()))

    def lengths(batch):
        assert set(batch) == {"length", "first"}
        return batch["length"].tolist()

    check_loader_resume(make, 10, at=(1, 4, 7), identity=lengths)
