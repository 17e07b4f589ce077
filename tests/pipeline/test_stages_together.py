"""A train-like and a val-like chain of stages resume exactly at every step."""

from __future__ import annotations

from resume import END, ListSource, check_resume_at_every_step

from megatron_energon_lite.errors import SkipSample
from megatron_energon_lite.pipeline.batch import BatchNode
from megatron_energon_lite.pipeline.concat import ConcatNode
from megatron_energon_lite.pipeline.filter import FilterNode
from megatron_energon_lite.pipeline.guard import SampleGuard
from megatron_energon_lite.pipeline.map import MapNode
from megatron_energon_lite.pipeline.passes import PassNode
from megatron_energon_lite.pipeline.repeat import RepeatNode


def quiet(stage: str) -> SampleGuard:
    return SampleGuard(lambda *a: None, stage=stage)


def split(item: dict, index: int):
    if item["value"] % 5 == 0:
        raise SkipSample()
    for j in range(item["value"] % 3):
        yield {"value": item["value"] * 10 + j}


def collate(items: list, index: int) -> dict:
    if index % 4 == 3:
        raise ValueError("every fourth batch is broken")
    return {"values": [item["value"] for item in items], "index": index}


def test_train_like_chain() -> None:
    def make():
        source = RepeatNode(ListSource(list(range(11))))
        encoded = MapNode(FilterNode(source, lambda item, i: item["value"] != 7, guard=quiet("filter")), split, guard=quiet("encode"))
        return PassNode(BatchNode(encoded, 3, collate, guard=quiet("batch")), 4)

    events = check_resume_at_every_step(make, steps=30)
    assert END in events


def test_val_like_chain() -> None:
    def make():
        concat = ConcatNode([ListSource([1, 2, 4]), ListSource([8, 11, 13, 14])])
        return PassNode(BatchNode(MapNode(concat, split, guard=quiet("encode")), 2, collate, drop_last=True, guard=quiet("batch")), 3, restart=True)

    events = check_resume_at_every_step(make, steps=20)
    assert events.count(END) >= 2
