"""Hostile ``split.yaml`` / ``.info.json`` contents (issue 13, items 9 and 13).

A shard named twice would deliver its samples twice; a shard path that is absolute, climbs out
with ``..`` or is a URL would read files outside the dataset folder.  Both are refused with a
ConfigError naming the file, the split and the shard.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
from energon_lite_dev.synthetic import write_tar

from megatron_energon_lite import policy
from megatron_energon_lite.errors import ConfigError
from megatron_energon_lite.format.metadata import (
    SHARDS_OUTSIDE_ROOT_ENV,
    read_info,
    resolve_split,
)
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.format.split_reader import SplitReader

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def prepared(tmp_path: Path) -> Path:
    root = tmp_path / "ds"
    for shard in range(3):
        write_tar(root / f"shards/{shard}.tar", [(f"s{shard}_{i}", {"txt": b"x"}) for i in range(4)])
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1)
    return root


def _split(root: Path, train: list[str]) -> None:
    (root / ".nv-meta/split.yaml").write_text(json.dumps({"split_parts": {"train": train}}))


@pytest.mark.parametrize(
    "train, found",
    [
        (["shards/0.tar", "shards/1.tar", "shards/0.tar"], "'shards/0.tar' from [0] 'shards/0.tar' and again from [2] 'shards/0.tar'"),
        (["shards/{0..2}.tar", "shards/1.tar"], "'shards/1.tar' from [0] 'shards/{0..2}.tar' and again from [1] 'shards/1.tar'"),
        (["shards/{0..1}.tar", "shards/{1..2}.tar"], "'shards/1.tar' from [0] 'shards/{0..1}.tar' and again from [1] 'shards/{1..2}.tar'"),
        (["shards/{0,1,0}.tar"], "'shards/0.tar' from [0] 'shards/{0,1,0}.tar' and again from the same entry"),
    ],
)
def test_shard_named_twice_is_refused(prepared: Path, train: list[str], found: str) -> None:
    _split(prepared, train)
    with pytest.raises(ConfigError, match=r"names shard '?shards/[01].tar'? twice(.|\n)*split.yaml: split_parts.train(.|\n)*found: ") as error:
        SplitReader(prepared, "train")
    assert found in str(error.value)


def test_unbalanced_brace_pattern_names_the_file(prepared: Path) -> None:
    _split(prepared, ["shards/{0..2.tar"])
    with pytest.raises(ConfigError, match=r"invalid brace pattern(.|\n)*split.yaml: split_parts.train\[0\](.|\n)*shards/\{0..2.tar"):
        resolve_split(prepared, "train")


def test_distinct_shards_still_read_in_order(prepared: Path) -> None:
    _split(prepared, ["shards/2.tar", "shards/{0..1}.tar"])
    reader = SplitReader(prepared, "train")
    assert [s.name for s in reader.split.shards] == ["shards/2.tar", "shards/0.tar", "shards/1.tar"]
    assert [reader.read(i).key for i in range(len(reader))][:5] == ["s2_0", "s2_1", "s2_2", "s2_3", "s0_0"]


def _point_outside(root: Path, name: str) -> None:
    (root / ".nv-meta/.info.json").write_text(json.dumps({"energon_version": "x", "shard_counts": {name: 4}}))
    _split(root, [name])


@pytest.mark.parametrize("name", ["/tmp/outside.tar", "../outside.tar", "shards/../../outside.tar", "s3://bucket/outside.tar", ""])
def test_shard_outside_the_dataset_is_refused(prepared: Path, name: str) -> None:
    _point_outside(prepared, name)
    with pytest.raises(ConfigError, match=r"outside the dataset folder(.|\n)*\.nv-meta/\.info\.json: shard_counts(.|\n)*found: "):
        read_info(prepared)
    with pytest.raises(ConfigError, match="outside the dataset folder"):
        SplitReader(prepared, "train")


def test_opting_in_reads_a_shard_outside(prepared: Path) -> None:
    outside = prepared.parent / "outside.tar"
    shutil.copy(prepared / "shards/1.tar", outside)
    shutil.copy(prepared / "shards/1.tar.idx", prepared.parent / "outside.tar.idx")
    _point_outside(prepared, "../outside.tar")
    reader = SplitReader(prepared, "train", allow_outside_root=True)
    assert reader.read(0).key == "s1_0"


@pytest.mark.parametrize("how", ["env", "as_energon"])
def test_the_environment_or_energon_mode_reads_a_shard_outside_with_a_warning(
    prepared: Path, how: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    shutil.copy(prepared / "shards/1.tar", prepared.parent / "outside.tar")
    shutil.copy(prepared / "shards/1.tar.idx", prepared.parent / "outside.tar.idx")
    _point_outside(prepared, "../outside.tar")
    monkeypatch.setattr(policy, "_logged", set())
    with pytest.raises(ConfigError, match=f"set {SHARDS_OUTSIDE_ROOT_ENV}=1"):
        SplitReader(prepared, "train")
    given = policy.PLAIN
    if how == "env":
        monkeypatch.setenv(SHARDS_OUTSIDE_ROOT_ENV, "1")
    else:
        given = policy.ENERGON  # what a loader planned under the switch reads with
    with caplog.at_level(logging.WARNING, logger="megatron_energon_lite.energon_mode"):
        assert SplitReader(prepared, "train", policy=given).read(0).key == "s1_0"
    assert "reading shard '../outside.tar' from outside the dataset folder" in caplog.text


def test_non_string_shard_name_in_yaml_info(prepared: Path) -> None:
    (prepared / ".nv-meta/.info.json").unlink()
    (prepared / ".nv-meta/.info.yaml").write_text("shard_counts:\n  7: 4\n")
    with pytest.raises(ConfigError, match=r"not a string(.|\n)*\.info\.yaml(.|\n)*found: int 7"):
        read_info(prepared)
