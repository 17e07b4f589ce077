"""map_view.py: get_map_dataset on real prepared datasets: same index -> same sample everywhere,
exact blend counts, epoch-aware randomness, resuming with Megatron-style and torch samplers."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import itertools
import json
import pickle
import random
import subprocess
import sys
import tarfile
from collections import Counter
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from energon_lite_dev.synthetic import (
    generate_captioning_dataset,
    sized_keys,
    write_text_blend,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler

from megatron_energon_lite import (
    ConfigError,
    DatasetError,
    DefaultTaskEncoder,
    EpochIndex,
    MultiEpochResampler,
    SampleDecoder,
    SkipSample,
    TextSample,
    WorkerConfig,
    get_map_dataset,
    get_savable_loader,
    get_train_dataset,
    stateless,
)
from megatron_energon_lite.manifest import read_manifest
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.map_view import blend_counts, blend_order

SHARDS, PER_SHARD = 3, 6
SIZES = {"A": [4, 3], "B": [5], "C": [2, 2]}  # 7, 5 and 4 samples
LENGTHS = {name: sum(sizes) for name, sizes in SIZES.items()}

# A task encoder module both this process and a fresh one import (it must be the same code).
AUGMENT_MODULE = '''
import dataclasses
import torch
from megatron_energon_lite import DefaultTaskEncoder, SampleDecoder


class Augment(DefaultTaskEncoder):
    """Appends two numbers drawn from current_rng and one from current_torch_generator."""

    decoder = SampleDecoder(image_decode="torchrgb8")

    def encode_sample(self, sample):
        rng = self.current_rng
        first, second = rng.integers(1 << 30), rng.integers(1 << 30)  # successive draws of one stream
        noise = int(torch.randint(1 << 30, (1,), generator=self.current_torch_generator))
        if hasattr(sample, "caption"):
            return dataclasses.replace(sample, caption=f"{sample.caption}|{first}|{second}|{noise}")
        return dataclasses.replace(sample, text=f"{sample.text}|{first}|{second}|{noise}")
'''


@pytest.fixture(scope="module")
def captions(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("map_view") / "captions"
    generate_captioning_dataset(root, num_shards=SHARDS, samples_per_shard=PER_SHARD, image_size=(8, 6), seed=3)
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1)
    (root / ".nv-meta/dataset.yaml").write_text(
        "sample_type:\n  __module__: megatron.energon\n  __class__: CaptioningSample\nfield_map:\n  image: jpg\n  caption: txt\n"
    )
    return root


@pytest.fixture(scope="module")
def texts(tmp_path_factory) -> Path:
    """Prepared TextSample datasets A, B, C (keys from ``sized_keys``) and blend.yaml (1:2:3)."""
    return write_text_blend(tmp_path_factory.mktemp("map_view_texts"), SIZES, {"A": 1, "B": 2, "C": 3})


@pytest.fixture(scope="module")
def augment(tmp_path_factory):
    folder = tmp_path_factory.mktemp("augment_module")
    (folder / "map_view_augment.py").write_text(AUGMENT_MODULE)
    sys.path.insert(0, str(folder))
    try:
        import map_view_augment

        yield folder, map_view_augment.Augment
    finally:
        sys.path.remove(str(folder))


class Uint8(DefaultTaskEncoder):
    decoder = SampleDecoder(image_decode="torchrgb8")


def caption_key(split_index: int) -> str:
    """The generator's key of split sample ``split_index`` (shards in order, key_pattern's default)."""
    return f"{split_index // PER_SHARD:04d}_{split_index % PER_SHARD:06d}"


def tar_image(root: Path, split_index: int) -> torch.Tensor:
    """The JPEG of a sample, read with tarfile and decoded with Pillow (CHW uint8): the oracle."""
    shard = sorted((root / "shards").glob("*.tar"))[split_index // PER_SHARD]
    with tarfile.open(shard) as tar:
        data = tar.extractfile(f"{caption_key(split_index)}.jpg").read()
    array = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    return torch.from_numpy(array.copy()).permute(2, 0, 1)


def write(base: Path, name: str, text: str) -> Path:
    path = base.parent / name
    path.write_text(text)
    return path


def blend_yaml(texts: Path, name: str, entries: str, kind: str = "blend") -> Path:
    return write(texts, name, f"__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    {kind}:\n{entries}")


def digest(sample) -> list:
    return [sample.__key__, hashlib.sha256(sample.image.numpy().tobytes()).hexdigest(), sample.caption]


# ------------------------------------------------------------------------------ one dataset


def test_index_i_is_split_sample_i(captions: Path) -> None:
    view = get_map_dataset(captions, task_encoder=Uint8())
    assert len(view) == SHARDS * PER_SHARD
    for i in range(len(view)):
        sample = view[i]
        assert sample.__key__ == caption_key(i)
        assert torch.equal(sample.image, tar_image(captions, i))
    assert view[np.int64(4)].__key__ == caption_key(4)


def test_python_iteration_stops_at_the_length(captions: Path) -> None:
    # No __iter__: Python reads indices until an IndexError, which the view's error also is.
    assert [sample.__key__ for sample in get_map_dataset(captions)] == [caption_key(i) for i in range(SHARDS * PER_SHARD)]


def test_same_index_same_bytes_in_process_and_in_a_fresh_process(captions: Path, augment) -> None:
    folder, augment_cls = augment
    view = get_map_dataset(captions, task_encoder=augment_cls(), seed=11)
    indices = [EpochIndex(0, 0), EpochIndex(0, 7), EpochIndex(2, 7), EpochIndex(1, 17)]
    here = [digest(view[index]) for index in indices]
    assert here == [digest(view[index]) for index in indices]
    script = (
        f"import sys, json, hashlib; sys.path.insert(0, {str(folder)!r})\n"
        "from map_view_augment import Augment\n"
        "from megatron_energon_lite import get_map_dataset, EpochIndex\n"
        f"view = get_map_dataset({str(captions)!r}, task_encoder=Augment(), seed=11)\n"
        f"out = [view[EpochIndex(*i)] for i in {[tuple(i) for i in indices]!r}]\n"
        "print(json.dumps([[s.__key__, hashlib.sha256(s.image.numpy().tobytes()).hexdigest(), s.caption] for s in out]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == here


def test_dataloader_with_two_workers_gives_the_same_batches(captions: Path, augment) -> None:
    _, augment_cls = augment
    view = get_map_dataset(captions, task_encoder=augment_cls())
    resampler = MultiEpochResampler(view, num_epochs=2, seed=4)
    expected = [view.collate([resampler[i] for i in range(start, start + 4)]) for start in range(0, len(resampler), 4)]
    got = list(DataLoader(resampler, batch_size=4, num_workers=2, collate_fn=view.collate))
    assert len(got) == len(expected) == 9
    for a, b in zip(got, expected):
        assert a.__key__ == b.__key__ and a.caption == b.caption
        assert torch.equal(a.image, b.image) and a.image.shape == (4, 3, 6, 8)


def test_pickling_sends_the_arguments_only(texts: Path) -> None:
    view = get_map_dataset(texts, num_samples=200_000)  # two index arrays of 1.8 MB
    data = pickle.dumps(view)
    assert len(data) < 20_000
    again = pickle.loads(data)
    assert len(again) == 200_000
    assert [again[i].__key__ for i in (0, 1, 99_999, 199_999)] == [view[i].__key__ for i in (0, 1, 99_999, 199_999)]


def test_subset_and_num_samples_of_one_dataset(captions: Path) -> None:
    view = get_map_dataset(captions, subset={"absolute_range": (2, 9)})
    assert [view[i].__key__ for i in range(len(view))] == [caption_key(i) for i in range(2, 9)]
    wrapped = get_map_dataset(captions, subset={"absolute_range": (2, 9)}, num_samples=10)
    assert len(wrapped) == 10 and [wrapped[i].__key__ for i in (6, 7, 9)] == [caption_key(8), caption_key(2), caption_key(4)]


def test_yaml_subset_and_subflavors_apply(texts: Path) -> None:
    path = write(texts, "subset_subflavors.yaml", "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    path: ./A\n    subset: {range: [2, 6]}\n    subflavors: {source: a}\n")
    view = get_map_dataset(path)
    assert [view[i].__key__ for i in range(len(view))] == sized_keys("A", SIZES["A"])[2:6]
    assert view[0].__subflavors__ == {"source": "a"}


def test_key_excludes_are_left_out_of_the_index(tmp_path: Path) -> None:
    path = write_text_blend(tmp_path, {"D": [4, 4]}, {"D": 1})
    root = path.parent / "D"
    split_path = root / ".nv-meta/split.yaml"
    config = yaml.safe_load(split_path.read_text())
    config["exclude"] = ["shards/001.tar/D1_002", "shards/000.tar/D0_000"]
    split_path.write_text(yaml.safe_dump(config))
    view = get_map_dataset(root)
    keys = sized_keys("D", [4, 4])
    assert len(view) == 6
    assert [view[i].__key__ for i in range(6)] == [k for k in keys if k not in ("D1_002", "D0_000")]


def test_a_crude_jsonl_is_cooked(tmp_path: Path) -> None:
    from energon_lite_dev.synthetic import write_jsonl

    from megatron_energon_lite import Cooker, basic_sample_keys, stateless
    from megatron_energon_lite.format.jsonl import write_jsonl_index

    write_jsonl(tmp_path / "records.jsonl", [{"text": f"record {i}"} for i in range(5)])
    write_jsonl_index(tmp_path / "records.jsonl")

    @stateless
    def cook(crude: dict) -> TextSample:
        return TextSample(**basic_sample_keys(crude), text=crude["json"]["text"].upper())

    class Encoder(DefaultTaskEncoder):
        cookers = [Cooker(cook)]

    view = get_map_dataset(tmp_path / "records.jsonl", task_encoder=Encoder())
    assert [view[i].text for i in range(5)] == [f"RECORD {i}" for i in range(5)]


def test_megatron_indexed_leaves_give_token_samples(texts: Path) -> None:
    from megatron_energon_lite import TokensSample
    from megatron_energon_lite.format.indexed import IndexedWriter

    rng = np.random.default_rng(5)
    docs = [rng.integers(0, 50000, size=int(rng.integers(1, 20))).astype(np.uint16) for _ in range(9)]
    writer = IndexedWriter(texts.parent / "tokens_document", dtype=np.uint16)
    for doc in docs:
        writer.add_document(doc)
    writer.finalize()
    path = blend_yaml(texts, "with_tokens.yaml", "      - {weight: 1, path: ./A}\n      - {weight: 1, path: ./tokens_document}\n")
    view = get_map_dataset(path)
    samples = [view[i] for i in range(len(view))]
    assert len(view) == 7 + 9 and view.counts == (8, 8)
    tokens = [s for s in samples if isinstance(s, TokensSample)]
    assert [s.tokens.tolist() for s in tokens] == [d.tolist() for d in docs[:8]]  # documents in file order
    assert [s.__key__ for s in samples if not isinstance(s, TokensSample)] == sized_keys("A", SIZES["A"]) + sized_keys("A", SIZES["A"])[:1]


# ------------------------------------------------------------------------------------ blends


def leaf_of(key: str) -> str:
    return key[0]


@pytest.mark.parametrize(
    ("weights", "num_samples", "expected"),
    [
        # Worked by hand: quotas w/sum * total, floors, then the largest remainders (ties: first).
        ((1, 2, 3), None, (3, 5, 8)),  # 16 = 7+5+4: 2.67, 5.33, 8 -> 2, 5, 8 + A
        ((1, 2, 3), 20, (3, 7, 10)),  # 3.33, 6.67, 10 -> 3, 6, 10 + B
        ((1, 2, 3), 7, (1, 2, 4)),  # 1.17, 2.33, 3.5 -> 1, 2, 3 + C
        ((1, 1, 2), 10, (3, 2, 5)),  # 2.5, 2.5, 5 -> 2, 2, 5 + A (tie with B)
        ((1, 1, 1), 100, (34, 33, 33)),
        ((5, 0.5, 1), 13, (10, 1, 2)),  # 10, 1, 2 exactly
    ],
)
def test_blend_counts_are_exact(texts: Path, weights, num_samples, expected) -> None:
    entries = "".join(f"      - {{weight: {w}, path: ./{name}}}\n" for name, w in zip("ABC", weights))
    view = get_map_dataset(blend_yaml(texts, f"weights_{'_'.join(map(str, weights))}.yaml", entries), num_samples=num_samples)
    keys = [view[i].__key__ for i in range(len(view))]
    assert len(view) == sum(expected)
    assert tuple(Counter(map(leaf_of, keys))[name] for name in "ABC") == expected
    for name in "ABC":  # each dataset is read in its own order 0, 1, 2, ... wrapping around
        own = [k for k in keys if leaf_of(k) == name]
        assert own == list(itertools.islice(itertools.cycle(sized_keys(name, SIZES[name])), len(own)))


def test_default_blend_length_is_the_sum_of_the_lengths(texts: Path) -> None:
    view = get_map_dataset(texts)
    assert len(view) == sum(LENGTHS.values())
    assert view.counts == (3, 5, 8)


def test_blend_epochized_takes_floor_of_repetitions(texts: Path) -> None:
    entries = "      - {repetitions: 2, path: ./A}\n      - {repetitions: 0.5, path: ./B}\n      - {repetitions: 1, path: ./C}\n"
    path = blend_yaml(texts, "epochized.yaml", entries, kind="blend_epochized")
    view = get_map_dataset(path)
    keys = [view[i].__key__ for i in range(len(view))]
    assert Counter(map(leaf_of, keys)) == {"A": 14, "B": 2, "C": 4}  # 2*7, floor(0.5*5), 4
    assert [k for k in keys if leaf_of(k) == "A"] == sized_keys("A", SIZES["A"]) * 2
    with pytest.raises(ConfigError, match="num_samples does not apply to a blend_epochized"):
        get_map_dataset(path, num_samples=10)


def test_blend_positions_follow_megatrons_greedy_rule() -> None:
    # research/megatron_data.md 2.10, weights 0.3/0.7: first picks 1,0,1,1,0,1,1,0,1,1,0,1.
    order = blend_order([0.3, 0.7], blend_counts([Fraction(3, 10), Fraction(7, 10)], 1000))
    assert order[:12].tolist() == [1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 0, 1]
    assert np.bincount(order).tolist() == [300, 700]
    # 0.5/0.25/0.25 over 997: quotas 498.5, 249.25, 249.25 -> 498, 249, 249 + the first (Megatron's
    # counts too); first picks 0,1,2,0,0,1,2,0.
    counts = blend_counts([Fraction(1, 2), Fraction(1, 4), Fraction(1, 4)], 997)
    assert counts == [499, 249, 249]
    assert blend_order([0.5, 0.25, 0.25], counts)[:8].tolist() == [0, 1, 2, 0, 0, 1, 2, 0]


@settings(max_examples=60, deadline=None)
@given(
    raw=st.lists(st.integers(1, 1000), min_size=1, max_size=8),
    total=st.integers(1, 3000),
)
def test_every_prefix_stays_within_two_samples_of_the_weights(raw: list[int], total: int) -> None:
    weights = [Fraction(r, sum(raw)) for r in raw]
    counts = blend_counts(weights, total)
    assert sum(counts) == total
    assert all(abs(c - w * total) < 1 for c, w in zip(counts, weights))
    order = blend_order([float(w) for w in weights], counts)
    assert np.bincount(order, minlength=len(raw)).tolist() == counts
    taken = np.cumsum(np.eye(len(raw), dtype=np.int64)[order], axis=0)
    n = np.arange(1, total + 1)[:, None]
    deviation = np.abs(taken - np.array([float(w) for w in weights])[None, :] * n)
    assert deviation.max() < 2


# ------------------------------------------------------------------------------- randomness


def test_epochs_change_what_hooks_draw_and_nothing_else(texts: Path, augment) -> None:
    _, augment_cls = augment
    view = get_map_dataset(texts, task_encoder=augment_cls(), seed=3)
    for i in range(len(view)):
        first, again, other = view[EpochIndex(0, i)], view[EpochIndex(0, i)], view[EpochIndex(1, i)]
        assert first.text == again.text and view[i].text == first.text
        assert first.__key__ == other.__key__
        assert first.text != other.text
        text, a, b, noise = first.text.split("|")
        assert text == other.text.split("|")[0] and a != b  # successive draws continue one stream
    reseeded = get_map_dataset(texts, task_encoder=augment_cls(), seed=4)
    assert reseeded[0].text != view[0].text


def test_restore_seeds_hooks_are_seeded_per_epoch_index(texts: Path) -> None:
    class Seeded(DefaultTaskEncoder):
        @stateless(restore_seeds=True)
        def encode_sample(self, sample):
            return dataclasses.replace(sample, text=f"{sample.text}|{torch.randint(1 << 30, (1,)).item()}|{random.random()}")

    view = get_map_dataset(texts, task_encoder=Seeded())
    outer = torch.get_rng_state()
    assert view[EpochIndex(0, 2)].text == view[EpochIndex(0, 2)].text
    assert view[EpochIndex(0, 2)].text != view[EpochIndex(1, 2)].text
    assert torch.equal(outer, torch.get_rng_state())  # the caller's state is restored


def test_the_same_hook_draws_reproducibly_in_the_streaming_loader(texts: Path, augment) -> None:
    _, augment_cls = augment

    def loader():
        dataset = get_train_dataset(texts.parent / "A", batch_size=2, task_encoder=augment_cls(), worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0))
        return get_savable_loader(dataset)

    first = loader()
    stream = iter(first)
    head = [next(stream).text for _ in range(3)]
    state = first.save_state_rank()
    tail = [next(stream).text for _ in range(4)]  # 7 samples per pass: the second pass draws anew
    texts_seen = [t for batch in head + tail for t in batch]
    assert all(len(t.split("|")) == 4 for t in texts_seen)
    assert len({t.split("|", 1)[1] for t in texts_seen}) == len(texts_seen)  # every call its own numbers
    restored = loader()
    restored.restore_state_rank(state)
    assert [batch.text for _, batch in zip(range(4), restored)] == tail  # (worker seed, sample index) again


def test_getitem_never_seeds_global_rngs(captions: Path, augment, monkeypatch) -> None:
    _, augment_cls = augment
    view = get_map_dataset(captions, task_encoder=augment_cls())
    view[0]  # noqa: B018  (files opened, decoders imported)

    def forbidden(*args, **kwargs):
        raise AssertionError("a global RNG was seeded")

    for target, name in ((torch, "manual_seed"), (torch.cuda, "manual_seed"), (torch.cuda, "manual_seed_all"), (np.random, "seed"), (random, "seed")):
        monkeypatch.setattr(target, name, forbidden)
    state = torch.get_rng_state()
    for i in range(5):
        view[EpochIndex(i, i)]  # noqa: B018
    assert torch.equal(state, torch.get_rng_state())


# ---------------------------------------------------------------------------------- resuming


def megatron_pretraining_sampler(total: int, consumed: int, micro_batch: int, rank: int, ranks: int):
    """Megatron's MegatronPretrainingSampler, as described in research/megatron_data.md 4.5:
    walks range(consumed, total) in global batches and yields this rank's slice."""
    batch = []
    for index in range(consumed, total):
        batch.append(index)
        if len(batch) == micro_batch * ranks:
            yield batch[rank * micro_batch : (rank + 1) * micro_batch]
            batch = []


def keys_of(view, batches) -> list[list[str]]:
    return [view.collate([view[i] for i in batch]).__key__ for batch in batches]


def test_resume_by_consumed_samples_with_a_megatron_sampler(texts: Path) -> None:
    ranks, micro = 2, 3
    view = get_map_dataset(texts, num_samples=60)
    whole = {rank: keys_of(view, megatron_pretraining_sampler(60, 0, micro, rank, ranks)) for rank in range(ranks)}
    for step in (1, 4, 9):
        consumed = step * micro * ranks  # what Megatron saves
        rebuilt = get_map_dataset(texts, num_samples=60)
        for rank in range(ranks):
            assert keys_of(rebuilt, megatron_pretraining_sampler(60, consumed, micro, rank, ranks)) == whole[rank][step:]


def test_resume_with_distributed_sampler_by_skipping_consumed_batches(texts: Path) -> None:
    view = get_map_dataset(texts)

    def batches(dataset, rank: int, epoch: int, skip: int) -> list[list[str]]:
        sampler = DistributedSampler(dataset, num_replicas=2, rank=rank, shuffle=True, seed=7)
        sampler.set_epoch(epoch)
        return keys_of(dataset, itertools.islice(BatchSampler(sampler, 2, drop_last=False), skip, None))

    for rank in range(2):
        whole = batches(view, rank, 1, 0)
        assert batches(get_map_dataset(texts), rank, 1, 3) == whole[3:]


def test_resume_with_a_resampler_and_a_sampler_from_the_consumed_index(texts: Path) -> None:
    resampler = MultiEpochResampler(get_map_dataset(texts), num_epochs=3, seed=1)
    whole = [resampler[i].__key__ for i in range(len(resampler))]
    # Counts 3, 5, 8 of 1:2:3 over 16: A's first 3 keys, all of B, C's 4 keys twice; every epoch.
    per_epoch = Counter(sized_keys("A", SIZES["A"])[:3] + sized_keys("B", SIZES["B"]) + sized_keys("C", SIZES["C"]) * 2)
    assert [Counter(whole[e * 16 : (e + 1) * 16]) for e in range(3)] == [per_epoch] * 3
    assert whole[:16] != whole[16:32]
    again = MultiEpochResampler(get_map_dataset(texts), num_epochs=3, seed=1)
    assert [again[i].__key__ for i in range(21, len(again))] == whole[21:]


# ------------------------------------------------------------------------------------ errors


def test_index_errors_name_the_length(texts: Path) -> None:
    view = get_map_dataset(texts)
    with pytest.raises(IndexError, match=r"length 16(.|\n)*0 <= index < 16(.|\n)*found: 16"):
        view[16]
    with pytest.raises(ConfigError, match="0 <= index < 16"):
        view[-1]
    with pytest.raises(ConfigError, match="negative epoch"):
        view[EpochIndex(-1, 0)]
    for bad in ("1", 1.5, (0, 1), True, None):
        with pytest.raises(TypeError, match="an int or an EpochIndex"):
            view[bad]


def test_task_encoders_that_pack_or_group_are_refused(texts: Path) -> None:
    class Packing(DefaultTaskEncoder):
        def select_samples_to_pack(self, samples):
            return [samples]

        def pack_selected_samples(self, samples):
            return samples[0]

    class Grouping(DefaultTaskEncoder):
        def batch_group_criterion(self, sample):
            return len(sample.text), 2

    for encoder in (Packing(), Grouping()):
        with pytest.raises(ConfigError, match="streaming loader"):
            get_map_dataset(texts, task_encoder=encoder)


def test_hooks_that_skip_or_yield_several_outputs_fail_clearly(texts: Path) -> None:
    class Skipping(DefaultTaskEncoder):
        def encode_sample(self, sample):
            raise SkipSample()

    class Twice(DefaultTaskEncoder):
        def encode_sample(self, sample):
            yield sample
            yield sample

    with pytest.raises(DatasetError, match="cannot skip an index") as failure:
        get_map_dataset(texts, task_encoder=Skipping())[3]
    assert any("map view index EpochIndex(epoch=0, idx=3)" in note for note in failure.value.__notes__)
    with pytest.raises(ConfigError, match="yielded 2 outputs"):
        get_map_dataset(texts, task_encoder=Twice())[0]


def test_unknown_arguments_are_refused(texts: Path) -> None:
    with pytest.raises(ConfigError, match="unknown keyword argument 'shuffle_buffer_size'"):
        get_map_dataset(texts, shuffle_buffer_size=10)
    with pytest.raises(ConfigError, match="num_samples"):
        get_map_dataset(texts, num_samples=0)


def test_collate_batches_like_the_task_encoder(texts: Path) -> None:
    @dataclasses.dataclass
    class Pair:
        keys: list
        lengths: torch.Tensor

    class Encoder(DefaultTaskEncoder):
        def batch(self, samples):
            return Pair([s.__key__ for s in samples], torch.tensor([len(s.text) for s in samples]))

        def encode_batch(self, batch):
            return dataclasses.replace(batch, lengths=batch.lengths * 10)

    view = get_map_dataset(texts, task_encoder=Encoder())
    batch = view.collate([view[0], view[1]])
    assert batch.keys == [view[0].__key__, view[1].__key__]
    assert batch.lengths.tolist() == [10 * len(view[0].text), 10 * len(view[1].text)]


def test_a_loop_over_the_view_writes_a_manifest_of_indices(prepared_blend: Path, tmp_path: Path) -> None:
    view = get_map_dataset(prepared_blend)
    steps = [[5, 0, 17], [40, 2, 33], [9, 61, 12]]
    manifest = view.manifest(tmp_path / "m")
    for step, indices in enumerate(steps):
        manifest.add(step, indices)
    manifest.close()
    read = list(read_manifest(tmp_path / "m"))
    assert [s.step for s in read] == [0, 1, 2]
    for step, indices in zip(read, steps):
        samples = step.samples(rank=0)
        assert [(s.dataset, s.split_index) for s in samples] == [view.locate(i) for i in indices]
        for sample, index in zip(samples, indices):
            assert sample.dataset_path == str(prepared_blend.parent / ("a" if sample.dataset == 0 else "b"))
            assert view[index].__key__ == f"{'ab'[sample.dataset]}{int(sample.shard[len('shards/'):-len('.tar')])}_{sample.index_in_shard:03d}"
