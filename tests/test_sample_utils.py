"""Sample printing: the same text as Energon's sample_utils for the same values."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from megatron_energon_lite.edataclass import edataclass
from megatron_energon_lite.sample_utils import (
    default_get_batch_keys,
    format_sample_compact,
    format_sample_detailed,
)
from megatron_energon_lite.samples import CaptioningSample, SourceInfo


@dataclasses.dataclass
class Probe:
    n: int
    nested: dict


@edataclass
class Holder:
    child: Probe
    children: list


class Unknown:
    def __repr__(self) -> str:
        return "<unknown-probe>" * 20


SAMPLES = [
    {
        "scalars": {"i": -3, "f": 2.5, "b": False, "n": None},
        "plain_str": "hi",
        "multiline_str": "line1\nline2",
        "primitive_seq": (1, 2, "x"),
        "tensor": torch.tensor([0.0, 2.0]),
        "big_tensor": torch.arange(100).reshape(10, 10),
        "empty_tensor": torch.zeros(0),
        "bool_tensor": torch.tensor([True, False]),
        "array": np.array([1, 2, 3], dtype=np.int64),
        "big_array": np.arange(20.0),
        "empty_array": np.zeros((0,)),
        "str_array": np.array(["a", "b"]),
        "dataclass": Probe(n=9, nested={"a": 1}),
        "unknown": Unknown(),
        "long_str": "x" * 1500,
        "long_list": list(range(30)),
        "long_dict": {i: i for i in range(40)},
        (1, 2): "tuple key",
        "np_scalar": np.float32(1.5),
        "bytes": b"abc" * 100,
        "__key__": "k" * 80,
    },
    "hi",
    5,
    None,
    [1, [2, [3, [4, [5]]]]],
    Holder(child=Probe(n=1, nested={"x": {"y": {"z": {"w": 1}}}}), children=[Probe(n=2, nested={})]),
    torch.ones(3, dtype=torch.bfloat16),
    np.zeros((2, 2), dtype=np.complex64),
    ("x" * 60,),
    CaptioningSample(
        __key__="s/0", image=torch.zeros(3, 4, 4), caption="a caption",
        __sources__=(SourceInfo(dataset_path="/d", index=0, shard_name="s.tar", file_names=("0.jpg", "0.txt")),),
    ),
]  # fmt: skip


@pytest.mark.parametrize("index", range(len(SAMPLES)))
def test_output_equals_energons(index: int) -> None:
    theirs = pytest.importorskip("megatron.energon.sample_utils")
    sample = SAMPLES[index]
    assert format_sample_detailed(sample) == theirs.format_sample_detailed(sample)
    assert format_sample_detailed(sample, indent="  ") == theirs.format_sample_detailed(sample, indent="  ")
    for options in ({}, {"depth": 1}, {"depth": 0}, {"max_items": 2, "max_str_len": 5}):
        assert format_sample_compact(sample, **options) == theirs.format_sample_compact(sample, **options), options


def test_detailed_output_reads_as_yaml() -> None:
    text = format_sample_detailed({"a": {"b": 1}, "t": torch.tensor([1.0, 3.0]), "d": Probe(n=1, nested={})})
    assert text.splitlines() == [
        "a:",
        "  b: 1",
        "t: Tensor(shape=torch.Size([2]), dtype=torch.float32, device=cpu, min=1.0, max=3.0, values=[1.0, 3.0])",
        "d:",
        "  Probe:",
        "    n: 1",
        "    nested: {}",
    ]
    assert format_sample_detailed("plain") == "plain"  # no YAML document end marker


def test_compact_output_cuts_strings_and_depth() -> None:
    assert format_sample_compact({"a": "x" * 60, "__key__": "y" * 60}) == "{a: '" + "x" * 50 + "...', __key__: '" + "y" * 60 + "'}"
    assert format_sample_compact([[[[1]]]]) == "[[[[...]]]]"
    assert format_sample_compact(np.zeros((2, 3))) == "np.ndarray(shape=(2, 3), dtype=float64)"


def test_batch_keys() -> None:
    assert default_get_batch_keys({"__key__": ["a", "b"]}) == ["a", "b"]
    assert default_get_batch_keys([{"keys": ["x"]}]) == ["x"]
    assert default_get_batch_keys(CaptioningSample(__key__="k", image=None, caption="")) is None  # a str, not a list
    assert default_get_batch_keys({"x": 1}) is None
