"""@edataclass: keyword-only slotted dataclasses, as Energon's decorator makes them."""

from __future__ import annotations

import dataclasses

import pytest

from megatron_energon_lite.edataclass import edataclass
from megatron_energon_lite.samples import Batch, Sample


def test_it_makes_keyword_only_slotted_dataclasses() -> None:
    @edataclass
    class Point:
        x: int
        y: int = 0

    p = Point(x=1)
    assert dataclasses.is_dataclass(p) and p == Point(x=1, y=0)
    assert Point.__slots__ == ("x", "y") and not hasattr(p, "__dict__")
    with pytest.raises(TypeError):
        Point(1, 2)


def test_fields_match_energons_decorator() -> None:
    energon = pytest.importorskip("megatron.energon.edataclass")

    def declare(decorator):
        @decorator
        class Probe:
            a: int
            b: str = "x"
            c: list = dataclasses.field(default_factory=list)

        return Probe

    ours, theirs = declare(edataclass), declare(energon.edataclass)
    describe = lambda cls: [(f.name, f.kw_only, f.default, f.init) for f in dataclasses.fields(cls)]  # noqa: E731
    assert describe(ours) == describe(theirs)
    assert ours.__slots__ == theirs.__slots__
    assert repr(ours(a=1)) == repr(theirs(a=1)).replace(theirs.__qualname__, ours.__qualname__)


def test_sample_and_batch_subclasses() -> None:
    @edataclass
    class MySample(Sample):
        caption: str
        weight: float = 1.0

    @edataclass
    class MyBatch(Batch):
        caption: list

    s = MySample(__key__="k1", caption="a cat")
    assert s.__restore_key__ == () and s.weight == 1.0 and not hasattr(s, "__dict__")
    assert [f.name for f in dataclasses.fields(MySample)][-2:] == ["caption", "weight"]
    batch = MyBatch.from_samples([s, MySample(__key__="k2", caption="a dog")])
    assert batch.__key__ == ["k1", "k2"] and batch.caption == ["a cat", "a dog"]
    derived = MySample.derive_from(s, caption="other")
    assert derived.__key__ == "k1" and derived.caption == "other"
