"""source_info: Energon's module path for SourceInfo and its two helpers."""

from __future__ import annotations

from megatron_energon_lite.samples import SourceInfo as SamplesSourceInfo
from megatron_energon_lite.samples import TextSample
from megatron_energon_lite.source_info import (
    SourceInfo,
    add_source_info,
    get_source_info,
)

A = SourceInfo(dataset_path="/a", index=1, shard_name="a.tar", file_names=("1.txt",))
B = SourceInfo(dataset_path="/b", index="k", shard_name="b.tar", file_names=("k.txt",))


def test_it_is_the_samples_class() -> None:
    assert SourceInfo is SamplesSourceInfo


def test_add_and_get_on_samples_dicts_and_lists() -> None:
    sample = TextSample(__key__="k", text="t")
    assert get_source_info(sample) is None
    assert add_source_info(sample, A) is sample and get_source_info(sample) == [A]
    add_source_info(sample, B)
    assert sample.__sources__ == (A, B)
    crude = add_source_info({"__key__": "k"}, B)
    assert crude["__sources__"] == (B,) and get_source_info(crude) == [B]
    assert get_source_info([sample, crude]) == [A, B, B]
    assert get_source_info([]) is None and get_source_info(42) is None
