"""epochs.py: EpochIndex, the hashed permutation, MultiEpochResampler, IdentityEpochWrapper.

The length rules and the per-epoch seeds are BioNeMo's (research/megatron_data.md 4.2, 4.6)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_energon_lite import (
    ConfigError,
    EpochIndex,
    IdentityEpochWrapper,
    MultiEpochResampler,
)
from megatron_energon_lite.epochs import permute
from megatron_energon_lite.errors import IndexTypeError, SampleIndexError


class Recorder:
    """A dataset of ``length`` items that returns the index it is asked for."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index):
        return index


def test_epoch_index_is_a_named_tuple() -> None:
    index = EpochIndex(3, 7)
    assert (index.epoch, index.idx) == (3, 7) and tuple(index) == (3, 7)


# --------------------------------------------------------------------------------- permutation


def test_permute_is_a_bijection_for_every_length_up_to_600() -> None:
    for length in range(1, 601):
        for seed in (0, 1, 42, 2**40 + 3):
            assert sorted(permute(np.arange(length), length, seed).tolist()) == list(range(length)), (length, seed)
        # The int form (the resampler's) is the same permutation.
        for seed in (0, 42):
            assert sorted(permute(i, length, seed) for i in range(length)) == list(range(length)), (length, seed)


def test_permute_int_and_array_forms_agree() -> None:
    for length, seed in ((2, 5), (97, 1), (1000, 123456789), (4097, 2**31 - 2)):
        assert permute(np.arange(length), length, seed).tolist() == [permute(i, length, seed) for i in range(length)]


def test_permute_depends_on_the_seed_and_shuffles() -> None:
    orders = {tuple(permute(np.arange(100), 100, seed).tolist()) for seed in range(20)}
    assert len(orders) == 20
    assert tuple(range(100)) not in orders


def test_permute_length_one_and_errors() -> None:
    assert permute(0, 1, 99) == 0
    with pytest.raises(SampleIndexError, match="0 <= index < 10"):
        permute(10, 10, 0)
    with pytest.raises(IndexError):
        permute(-1, 10, 0)
    with pytest.raises(ConfigError, match="invalid permutation length"):
        permute(0, 0, 0)


def test_permute_huge_length_stays_in_range() -> None:
    length = 10**12
    rng = np.random.default_rng(0)
    indices = rng.integers(0, length, size=200)
    out = permute(indices, length, 7)
    assert ((out >= 0) & (out < length)).all()
    assert len(set(out.tolist())) == len(set(indices.tolist()))  # injective on the sample
    assert out.tolist() == [permute(int(i), length, 7) for i in indices]


# ----------------------------------------------------------------------------------- resampler


def test_lengths_follow_bionemo() -> None:
    assert len(MultiEpochResampler(Recorder(100), num_epochs=3)) == 300
    assert len(MultiEpochResampler(Recorder(100))) == 100
    by_samples = MultiEpochResampler(Recorder(100), num_samples=275)
    assert len(by_samples) == 275 and by_samples.num_epochs == 3
    with pytest.raises(IndexError, match="0 <= index < 300"):
        MultiEpochResampler(Recorder(100), num_epochs=3)[300]
    with pytest.raises(ConfigError, match="not both"):
        MultiEpochResampler(Recorder(100), num_epochs=2, num_samples=10)
    with pytest.raises(ConfigError, match="num_epochs"):
        MultiEpochResampler(Recorder(100), num_epochs=0)
    with pytest.raises(IndexTypeError):
        MultiEpochResampler(Recorder(100))["3"]


def test_epoch_seeds_are_bionemos() -> None:
    # Verified against BioNeMo in research/megatron_data.md 4.2.
    assert MultiEpochResampler(Recorder(10), num_epochs=3, seed=42).epoch_seeds.tolist() == [191664963, 1662057957, 1405681631]


def test_without_shuffle_indices_come_in_order() -> None:
    resampler = MultiEpochResampler(Recorder(4), num_samples=10, shuffle=False)
    assert [resampler[i] for i in range(10)] == [EpochIndex(e, i) for e in range(3) for i in range(4)][:10]


def test_each_epoch_visits_every_index_once_in_its_own_order() -> None:
    length, epochs = 37, 4
    resampler = MultiEpochResampler(Recorder(length), num_epochs=epochs, seed=5)
    seen = [resampler[i] for i in range(len(resampler))]
    orders = []
    for epoch in range(epochs):
        part = seen[epoch * length : (epoch + 1) * length]
        assert all(index.epoch == epoch for index in part)
        assert sorted(index.idx for index in part) == list(range(length))
        orders.append(tuple(index.idx for index in part))
    assert len(set(orders)) == epochs


def test_last_epoch_is_cut_short() -> None:
    resampler = MultiEpochResampler(Recorder(10), num_samples=25, seed=42)
    last = [resampler[i] for i in range(20, 25)]
    assert all(index.epoch == 2 for index in last) and len({index.idx for index in last}) == 5


def test_a_length_one_dataset_shuffles_without_error() -> None:
    resampler = MultiEpochResampler(Recorder(1), num_epochs=3, shuffle=True)
    assert [resampler[i] for i in range(3)] == [EpochIndex(0, 0), EpochIndex(1, 0), EpochIndex(2, 0)]


def test_a_virtual_length_of_10_to_the_12() -> None:
    resampler = MultiEpochResampler(Recorder(10**9), num_epochs=1000, seed=1)
    assert len(resampler) == 10**12
    rng = np.random.default_rng(3)
    for i in rng.integers(0, 10**12, size=200).tolist():
        index = resampler[i]
        assert index.epoch == i // 10**9 and 0 <= index.idx < 10**9


@settings(max_examples=30, deadline=None)
@given(length=st.integers(1, 300), epochs=st.integers(1, 3), seed=st.integers(0, 2**31 - 2))
def test_any_length_and_seed_is_a_permutation_per_epoch(length: int, epochs: int, seed: int) -> None:
    resampler = MultiEpochResampler(Recorder(length), num_epochs=epochs, seed=seed)
    for epoch in range(epochs):
        assert sorted(resampler[epoch * length + i].idx for i in range(length)) == list(range(length))


def test_identity_wrapper_round_trip() -> None:
    wrapped = IdentityEpochWrapper(list(range(10)))
    assert len(wrapped) == 10
    assert wrapped[EpochIndex(5, 3)] == 3 and wrapped[4] == 4
    resampler = MultiEpochResampler(wrapped, num_epochs=3, seed=0)
    values = [resampler[i] for i in range(30)]
    for epoch in range(3):
        assert sorted(values[epoch * 10 : (epoch + 1) * 10]) == list(range(10))
    with pytest.raises(IndexError, match="0 <= index < 10"):
        wrapped[EpochIndex(0, 10)]
