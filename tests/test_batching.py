"""Batching helpers and Batch (samples.py), checked by construction and against Energon 7.4.1."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_energon_lite.errors import BatchMismatchError, ConfigError
from megatron_energon_lite.samples import (
    Batch,
    CaptioningSample,
    Sample,
    SourceInfo,
    TextSample,
    batch_list,
    batch_pad_stack,
    batch_stack,
    generic_batch,
)


def energon():
    return pytest.importorskip("megatron.energon")


def same(a: Any, b: Any) -> bool:
    """Deep equality that compares tensors by dtype, shape and values and containers by type."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a, b)
        )
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return type(a) is type(b) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return type(a) is type(b) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if dataclasses.is_dataclass(a):
        return type(a) is type(b) and all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    return a == b


# ---------------------------------------------------------------------------- by construction


def test_pad_stack_places_each_tensor_at_the_start_of_its_zero_filled_slot() -> None:
    values = [torch.arange(1, 7).reshape(2, 3), torch.full((3, 1), 9), torch.ones(1, 4, dtype=torch.int64)]
    out = batch_pad_stack(values)
    assert out.shape == (3, 3, 4)
    assert out.dtype == values[0].dtype
    for i, value in enumerate(values):
        rows, cols = value.shape
        assert torch.equal(out[i, :rows, :cols], value)
        mask = torch.ones(3, 4, dtype=torch.bool)
        mask[:rows, :cols] = False
        assert not out[i][mask].any()


def test_pad_stack_of_equal_shapes_is_a_stack_and_casts_to_the_first_dtype() -> None:
    values = [torch.rand(2, 2) for _ in range(3)]
    assert torch.equal(batch_pad_stack(values), torch.stack(values))
    mixed = [torch.tensor([1.5, 2.5]), torch.tensor([1, 2], dtype=torch.int32)]
    out = batch_pad_stack(mixed)
    assert out.dtype == torch.float32
    assert out.tolist() == [[1.5, 2.5], [1.0, 2.0]]


def test_pad_stack_rejects_mixed_ranks_and_empty_input() -> None:
    with pytest.raises(BatchMismatchError, match="same number of dimensions"):  # the data differ: a bad batch
        batch_pad_stack([torch.zeros(2), torch.zeros(2, 2)])
    with pytest.raises(BatchMismatchError, match="types NoneType, Tensor"):
        batch_pad_stack([torch.zeros(2), None])
    with pytest.raises(ConfigError, match="no values"):
        generic_batch([])


def test_batch_stack_and_batch_list() -> None:
    values = [torch.tensor([i, i + 1]) for i in range(3)]
    assert batch_stack(values).tolist() == [[0, 1], [1, 2], [2, 3]]
    items = ["a", "b"]
    assert batch_list(items) is items
    assert batch_list(("a", "b")) == ["a", "b"]


class Pair(NamedTuple):
    x: Any
    y: Any


@dataclasses.dataclass
class Plain:
    a: Any
    b: Any


def test_generic_batch_recurses_into_structures() -> None:
    values = [
        {"t": torch.ones(i + 1), "s": f"s{i}", "p": Pair(i, torch.full((2,), i)), "d": Plain(a=[i], b={"n": i})}
        for i in range(2)
    ]
    out = generic_batch(values)
    assert list(out) == ["t", "s", "p", "d"]
    assert out["t"].tolist() == [[1.0, 0.0], [1.0, 1.0]]
    assert out["s"] == ["s0", "s1"]
    assert isinstance(out["p"], Pair) and out["p"].x == [0, 1] and out["p"].y.tolist() == [[0, 0], [1, 1]]
    assert isinstance(out["d"], Plain) and out["d"].a == [[0], [1]] and out["d"].b == {"n": [0, 1]}


def test_generic_batch_of_samples_is_a_sample_with_batched_fields() -> None:
    samples = [TextSample(__key__=f"k{i}", __restore_key__=("r", i), text=f"t{i}") for i in range(3)]
    out = generic_batch(samples)
    assert type(out) is TextSample
    assert out.__key__ == ["k0", "k1", "k2"]
    assert out.text == ["t0", "t1", "t2"]
    assert out.__restore_key__ == [("r", 0), ("r", 1), ("r", 2)]


def test_generic_batch_names_the_missing_key() -> None:
    with pytest.raises(BatchMismatchError, match="'b'"):  # dicts are data: a bad batch
        generic_batch([{"a": 1, "b": 2}, {"a": 3}])
    with pytest.raises(ConfigError, match="'image'") as info:  # samples of two declared types: the code's
        generic_batch([CaptioningSample(__key__="a", image=None, caption="x"), TextSample(__key__="b", text="y")])
    assert not isinstance(info.value, BatchMismatchError)


@dataclasses.dataclass(kw_only=True, slots=True)
class ImageBatch(Batch):
    image: Any
    caption: list


@dataclasses.dataclass(kw_only=True, slots=True)
class ImageCaption(Sample):
    image: Any
    caption: str


def _image_samples(subflavors: list[Any], sources: list[Any]) -> list[ImageCaption]:
    return [
        ImageCaption(
            __key__=f"k{i}",
            __restore_key__=("Webdataset", i),
            __subflavors__=sf,
            __sources__=src,
            image=torch.full((1, i + 1), float(i)),
            caption=f"c{i}",
        )
        for i, (sf, src) in enumerate(zip(subflavors, sources))
    ]


def test_from_samples_collects_keys_subflavors_and_sources() -> None:
    src = [(SourceInfo("/d", i, "s.tar", (f"k{i}.jpg",)),) for i in range(3)]
    samples = _image_samples([{"a": 1}, None, {}], [src[0], None, src[2]])
    batch = ImageBatch.from_samples(samples)
    assert batch.__key__ == [s.__key__ for s in samples]
    assert batch.__subflavors__ == [{"a": 1}]  # only the samples with non-empty subflavors
    assert batch.__sources__ == src[0] + src[2]
    assert batch.caption == ["c0", "c1", "c2"]
    assert [t.tolist() for t in batch.image] == [s.image.tolist() for s in samples]
    none = ImageBatch.from_samples(_image_samples([None, None], [None, None]))
    assert none.__subflavors__ is None and none.__sources__ is None


def test_from_samples_overrides_and_errors() -> None:
    samples = _image_samples([None, None], [None, None])
    stacked = batch_pad_stack([s.image for s in samples])
    batch = ImageBatch.from_samples(samples, image=stacked)
    assert batch.image is stacked
    with pytest.raises(ConfigError, match="nope"):
        ImageBatch.from_samples(samples, nope=1)
    with pytest.raises(ConfigError, match="dataclasses"):
        ImageBatch.from_samples([{"image": 1}])


def test_generic_batch_uses_from_samples_of_batch_classes() -> None:
    batches = [ImageBatch(__key__=["a"], image=torch.zeros(1), caption=["x"]), ImageBatch(__key__=["b"], image=torch.ones(1), caption=["y"])]
    out = generic_batch(batches)
    assert type(out) is ImageBatch
    assert out.__key__ == [["a"], ["b"]]
    assert out.caption == [["x"], ["y"]]


def test_batch_derive_from_and_extend() -> None:
    base = ImageBatch.from_samples(_image_samples([{"a": 1}, None], [None, None]))
    derived = Batch.derive_from(base)
    assert type(derived) is Batch
    assert (derived.__key__, derived.__restore_key__, derived.__subflavors__, derived.__sources__) == (
        base.__key__,
        base.__restore_key__,
        base.__subflavors__,
        base.__sources__,
    )
    other = ImageBatch.derive_from(base, image="img", caption=["c"], __key__=["new"])
    assert other.__key__ == ["new"] and other.image == "img" and other.__subflavors__ == base.__subflavors__

    @dataclasses.dataclass(kw_only=True, slots=True)
    class Tokens(ImageBatch):
        tokens: list

    extended = Tokens.extend(base, tokens=[1, 2])
    assert extended.tokens == [1, 2] and extended.caption == base.caption and extended.__key__ == base.__key__
    with pytest.raises(ConfigError):
        Tokens.extend(TextSample(__key__="x", text="t"), tokens=[])


def test_batch_repr_is_compact() -> None:
    batch = ImageBatch(__key__=["a"], image=torch.zeros(3, 64, 64), caption=["x"])
    assert "shape=(3, 64, 64)" in str(batch)
    assert "0., 0." not in str(batch)
    assert "shape=(3, 64, 64)" in repr(Batch(__key__=["a"], __restore_key__=(torch.zeros(3, 64, 64),)))


def test_samples_module_stays_torch_free_with_batching() -> None:
    code = (
        "import sys, megatron_energon_lite; before = set(sys.modules); "
        "from megatron_energon_lite.samples import generic_batch, Batch; "
        "print(generic_batch([{'a': 'x'}, {'a': 'y'}])); "
        "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] in ('torch', 'numpy')))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.splitlines()
    assert out == ["{'a': ['x', 'y']}", "[]"]


# ---------------------------------------------------------------------------- against Energon


def _cases() -> list[list[Any]]:
    return [
        [torch.rand(3), torch.rand(3)],
        [torch.rand(2, 3), torch.rand(4, 1), torch.rand(1, 5)],
        [torch.tensor(1), torch.tensor(2)],
        [torch.ones(2, dtype=torch.int64), torch.ones(3, dtype=torch.int64)],
        [torch.tensor([True]), torch.tensor([False, True])],
        [torch.tensor([1.5, 2.5]), torch.tensor([1, 2, 3], dtype=torch.int32)],
        ["a", "b", "c"],
        [1, 2],
        [None, None],
        [np.zeros(2), np.ones(3)],
        [[1, 2], [3]],
        [{"x": torch.ones(2), "y": "s", "z": {"w": torch.zeros(1, i + 1)}} for i in range(3)],
        [Pair(torch.ones(i + 1), f"p{i}") for i in range(2)],
        [Plain(a=torch.ones(i + 2), b=i) for i in range(2)],
    ]


@pytest.mark.energon
@pytest.mark.parametrize("case", range(len(_cases())))
def test_generic_batch_matches_energon(case: int) -> None:
    e = energon()
    values = _cases()[case]
    assert same(generic_batch(values), e.generic_batch(values))


@pytest.mark.energon
@settings(max_examples=60, deadline=None)
@given(
    shapes=st.integers(0, 3).flatmap(
        lambda ndim: st.lists(st.tuples(*[st.integers(0, 4)] * ndim), min_size=1, max_size=5)
    ),
    dtype=st.sampled_from([torch.float32, torch.int64, torch.uint8, torch.bool]),
)
def test_pad_stack_matches_energon(shapes: list[tuple[int, ...]], dtype: torch.dtype) -> None:
    e = energon()
    gen = torch.Generator().manual_seed(len(shapes))
    values = [(torch.rand(shape, generator=gen) * 10).to(dtype) for shape in shapes]
    assert same(batch_pad_stack(values), e.batch_pad_stack(values))
    if all(s == shapes[0] for s in shapes):
        assert same(batch_stack(values), e.batch_stack(values))


@pytest.mark.energon
def test_batch_list_matches_energon() -> None:
    e = energon()
    values = ["a", torch.ones(1), None]
    assert batch_list(values) is values and e.batch_list(values) is values


@pytest.mark.energon
@pytest.mark.parametrize(
    "subflavors, with_sources",
    [([None, None, None], False), ([{"a": 1}, None, {"b": 2}], True), ([{}, {"a": 1}, {"a": 2}], False)],
)
def test_from_samples_matches_energon(subflavors: list[Any], with_sources: bool) -> None:
    e = energon()

    @e.edataclass
    class ESample(e.Sample):
        image: torch.Tensor
        caption: str

    @e.edataclass
    class EBatch(e.Batch):
        image: Any
        caption: list

    def sources(i: int) -> Any:
        return (SourceInfo("/d", i, "s.tar", (f"k{i}.jpg",)),) if with_sources and i != 1 else None

    ours = _image_samples(subflavors, [sources(i) for i in range(3)])
    theirs = [
        ESample(
            __key__=s.__key__,
            __restore_key__=s.__restore_key__,
            __subflavors__=s.__subflavors__,
            __sources__=s.__sources__,
            image=s.image,
            caption=s.caption,
        )
        for s in ours
    ]
    mine, ref = ImageBatch.from_samples(ours), EBatch.from_samples(theirs)
    for name in ("__key__", "__subflavors__", "__sources__", "image", "caption"):
        assert same(getattr(mine, name), getattr(ref, name)), name
    # Energon lists the restore keys; ours keeps them as given (a list too).
    assert list(mine.__restore_key__) == list(ref.__restore_key__)
