"""shuffle_over_epochs None (no shuffling) and -1 (slices drawn with replacement), as Energon has them."""

from __future__ import annotations

from pathlib import Path

import pytest
from energon_lite_dev.synthetic import generate_text_dataset
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_energon_lite.errors import ConfigError
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.pipeline.load import SampleLoader
from megatron_energon_lite.pipeline.repeat import RepeatNode
from megatron_energon_lite.pipeline.sharding import (
    WITH_REPLACEMENT,
    SliceDraws,
    check_shuffle_over_epochs,
    combine_shuffle_over_epochs,
    epoch_slice_order,
    worker_slices,
)
from megatron_energon_lite.pipeline.source import SliceSource

FAST = settings(max_examples=100, deadline=None)
TEXT_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"


@FAST
@given(n=st.integers(0, 60), seed=st.integers(0, 2**32 - 1), epoch=st.integers(0, 10**6))
def test_none_reads_every_slice_once_per_epoch_in_order(n, seed, epoch) -> None:
    assert epoch_slice_order(n, seed=seed, epoch=epoch, shuffle_over_epochs=None) == list(range(n))


@FAST
@given(n=st.integers(1, 40), seed=st.integers(0, 2**32 - 1), epoch=st.integers(0, 1000), start=st.integers(0, 5000))
def test_with_replacement_draws_are_pure_functions_of_their_position(n, seed, epoch, start) -> None:
    draws = epoch_slice_order(n, seed=seed, epoch=epoch, shuffle_over_epochs=-1)
    assert isinstance(draws, SliceDraws) and len(draws) > 10**15
    picked = [draws[i] for i in range(start, start + 50)]
    assert all(type(d) is int and 0 <= d < n for d in picked)
    # Another object (a restored worker) computes any position without the ones before it.
    again = SliceDraws(n, seed=seed, epoch=epoch)
    assert [again[i] for i in reversed(range(start, start + 50))] == picked[::-1]


def test_with_replacement_is_uniform_repeats_slices_and_never_ends() -> None:
    n, draws = 10, epoch_slice_order(10, seed=3, epoch=0, shuffle_over_epochs=-1)
    first = [draws[i] for i in range(n)]
    assert len(set(first)) < n  # with replacement: repeats long before every slice was drawn
    counts = [0] * n
    for i in range(20000):
        counts[draws[i]] += 1
    assert all(abs(c - 2000) < 200 for c in counts)  # uniform (5 sigma is about 210)
    assert [draws[i] for i in range(50)] != [SliceDraws(n, seed=4, epoch=0)[i] for i in range(50)]
    assert draws[10**12] in range(n)  # there is no end
    with pytest.raises(ConfigError, match="never end"):
        list(draws)  # listing it would hang: it raises instead
    assert epoch_slice_order(0, seed=3, epoch=0, shuffle_over_epochs=-1) == []


def test_multipliers_combine_as_energon_does() -> None:
    assert combine_shuffle_over_epochs(2, 3) == 6
    assert combine_shuffle_over_epochs(None, 3) is None and combine_shuffle_over_epochs(-1, None) is None
    assert combine_shuffle_over_epochs(-1, 4) == WITH_REPLACEMENT and combine_shuffle_over_epochs(1, -1) == -1
    assert [check_shuffle_over_epochs(v) for v in (None, -1, 1, 7)] == [None, -1, 1, 7]
    with pytest.raises(ConfigError, match=r"-1 \(slices drawn with replacement"):
        check_shuffle_over_epochs(0, where="x.yaml: splits.train.shuffle_over_epochs_multiplier")


# --- Against Energon's loader on the same shards --------------------------------------------------

SHARDS, PER_SHARD, MSPS = 3, 6, 2


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("slice_order") / "text"
    generate_text_dataset(root, num_shards=SHARDS, samples_per_shard=PER_SHARD, max_words=8, seed=1, key_pattern="A{shard:02d}_{index:03d}")
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=TEXT_YAML)
    return root


def energon_keys(dataset: Path, multiplier, count: int) -> list[str]:
    energon = pytest.importorskip("megatron.energon")
    ds = energon.get_train_dataset(
        str(dataset), batch_size=None, shuffle_buffer_size=None, max_samples_per_sequence=MSPS,
        worker_config=energon.WorkerConfig(rank=0, world_size=1, num_workers=0),
        shuffle_over_epochs_multiplier=multiplier, parallel_shard_iters=1,
    )
    it = iter(energon.get_loader(ds))
    return [next(it).__key__ for _ in range(count)]


def our_slices(dataset: Path) -> list[tuple[int, int]]:
    total = SHARDS * PER_SHARD
    return worker_slices(total_samples=total, shard_starts=list(range(0, total + 1, PER_SHARD)), rank=0, world_size=1, num_workers=0, max_samples_per_sequence=MSPS)[0]


@pytest.mark.filterwarnings("ignore:.*pin_memory.*:UserWarning")
def test_none_reads_the_samples_in_dataset_order_like_energon(dataset: Path) -> None:
    """Energon's None: slices in order, one at a time (it needs parallel_shard_iters=1)."""
    count = 2 * SHARDS * PER_SHARD + 5  # two epochs and a bit
    expected = energon_keys(dataset, None, count)
    source = SliceSource(SampleLoader(dataset, "train"), our_slices(dataset), seed=0, parallel_slices=1, slice_order=lambda n, e, _seed: epoch_slice_order(n, seed=0, epoch=e, shuffle_over_epochs=None))
    node = RepeatNode(source)
    assert [node.next().__key__ for _ in range(count)] == expected


def runs_of_slices(keys: list[str], slices: list[tuple[int, int]], key_of: dict[str, int]) -> list[int]:
    """Cuts a stream (one slice open at a time) into the slice ids it read, whole slices only."""
    by_start = {start: s for s, (start, _) in enumerate(slices)}
    out, i = [], 0
    while i < len(keys):
        s = by_start[key_of[keys[i]]]
        start, end = slices[s]
        whole = [key_of[k] for k in keys[i : i + end - start]]
        assert whole == list(range(start, end))[: len(whole)], "a slice was not read whole and in order"
        out.append(s)
        i += end - start
    return out


@pytest.mark.filterwarnings("ignore:.*pin_memory.*:UserWarning")
def test_with_replacement_reads_whole_slices_drawn_with_replacement_like_energon(dataset: Path) -> None:
    """The same class of order as Energon's -1: whole slices, drawn with replacement, no epoch end."""
    total = SHARDS * PER_SHARD
    slices = our_slices(dataset)
    loader = SampleLoader(dataset, "train")
    key_of = {loader.load(i).__key__: i for i in range(total)}
    count = 4 * total
    theirs = runs_of_slices(energon_keys(dataset, -1, count), slices, key_of)
    draws = epoch_slice_order(len(slices), seed=5, epoch=0, shuffle_over_epochs=-1)
    ours = runs_of_slices([loader.load(i).__key__ for j in range(count) for i in range(*slices[draws[j]])][:count], slices, key_of)
    for drawn in (theirs, ours):
        assert len(drawn) >= count // MSPS - 1  # read far past one epoch without an end
        first_epoch = drawn[: len(slices)]
        assert len(set(first_epoch)) < len(slices)  # a slice came back before all were read
        assert set(drawn) <= set(range(len(slices)))


# --- Through get_train_dataset: needs build.py and source.py to use these orders (lead) ------------


def train_keys(dataset: Path, multiplier, count: int, **kwargs) -> list[str]:
    from megatron_energon_lite import WorkerConfig, get_loader, get_train_dataset

    ds = get_train_dataset(dataset, batch_size=None, shuffle_buffer_size=None, max_samples_per_sequence=MSPS, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), shuffle_over_epochs_multiplier=multiplier, **kwargs)
    it = iter(get_loader(ds))
    return [next(it).__key__ for _ in range(count)]


def test_validate_accepts_energons_multipliers(dataset: Path) -> None:
    from megatron_energon_lite import WorkerConfig, get_train_dataset

    for multiplier in (None, -1, 1, 3):
        get_train_dataset(dataset, batch_size=None, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), shuffle_over_epochs_multiplier=multiplier)
    for bad in (0, -2, 1.5):
        with pytest.raises(ConfigError, match="shuffle_over_epochs_multiplier"):
            get_train_dataset(dataset, batch_size=None, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), shuffle_over_epochs_multiplier=bad)


@pytest.mark.filterwarnings("ignore:.*pin_memory.*:UserWarning")
def test_loader_with_none_reads_like_energon(dataset: Path) -> None:
    count = 2 * SHARDS * PER_SHARD + 3
    assert train_keys(dataset, None, count) == energon_keys(dataset, None, count)


def test_loader_with_minus_one_never_ends_and_resumes(dataset: Path) -> None:
    from megatron_energon_lite import (
        WorkerConfig,
        get_savable_loader,
        get_train_dataset,
    )

    def make():
        return get_savable_loader(get_train_dataset(dataset, batch_size=None, shuffle_buffer_size=None, max_samples_per_sequence=MSPS, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), shuffle_over_epochs_multiplier=-1, repeat=False))

    loader = make()
    it = iter(loader)
    keys = [next(it).__key__ for _ in range(10)]
    state = loader.save_state_rank()
    keys += [next(it).__key__ for _ in range(4 * SHARDS * PER_SHARD)]  # far past one epoch, no end
    assert len(set(keys[: SHARDS * PER_SHARD])) < SHARDS * PER_SHARD  # slices came back early
    fresh = make()
    fresh.restore_state_rank(state)
    again = iter(fresh)
    assert [next(again).__key__ for _ in range(20)] == keys[10:30]
