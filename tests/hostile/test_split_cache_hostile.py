"""A split cache shipped with a dataset (its stamps made to match the files) may not say more than
the files: shards read twice, a val shard in training, a shard dropped, forged excludes or a
nested bomb are ignored with a warning (the files are read), and ``lint`` reports them."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from click.testing import CliRunner
from energon_lite_dev.synthetic import write_numbered_shards

from megatron_energon_lite.cli.main import cli
from megatron_energon_lite.format.metadata import resolve_split
from megatron_energon_lite.format.metadataset import LeafDataset
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.format.resolved import resolve_dataset
from megatron_energon_lite.format.split_cache import SPLIT_CACHE, cached_split

DATASET_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"
SPLITS = [("train", r"parts/data-[0-3]\.tar"), ("val", r"parts/data-4\.tar"), ("test", r"parts/data-5\.tar")]


@pytest.fixture()
def dataset(tmp_path: Path) -> Path:
    root = tmp_path / "ds"
    write_numbered_shards(root, shards=6, per_shard=3)
    prepare_dataset(root, split_parts=SPLITS, progress=False, dataset_yaml=DATASET_YAML)
    split = root / ".nv-meta/split.yaml"
    split.write_text(split.read_text().replace("exclude: []", "exclude:\n- parts/data-1.tar/000004"))
    prepare_dataset(root, split_parts=SPLITS, progress=False, dataset_yaml=DATASET_YAML, force_overwrite=True)
    return root


def _forge(root: Path, change) -> None:
    path = root / ".nv-meta" / SPLIT_CACHE
    data = json.loads(path.read_text())
    change(data["splits"]["train"], data)
    path.write_text(json.dumps(data))


FORGERIES = {
    "val shard in training": lambda t, d: (t["names"].append("parts/data-4.tar"), t["counts"].append(3)),
    "shard read twice": lambda t, d: (t["names"].append(t["names"][0]), t["counts"].append(t["counts"][0])),
    "shard dropped": lambda t, d: (t["names"].pop(), t["counts"].pop()),
    "shard hidden by a zero count": lambda t, d: t["counts"].__setitem__(0, 0),
    "order changed": lambda t, d: (t["names"].reverse(), t["counts"].reverse()),
    "exclude forged": lambda t, d: t["excluded_keys"].update({"parts/data-0.tar": ["000000", "000001"]}),
    "exclude dropped": lambda t, d: t["excluded_keys"].clear(),
    "warnings forged": lambda t, d: d.update(unknown_excludes=["parts/nothing.tar"]),
}


@pytest.mark.parametrize("forgery", FORGERIES)
def test_a_cache_that_says_more_than_the_files_is_ignored(dataset: Path, forgery: str, caplog: pytest.LogCaptureFixture) -> None:
    expected = resolve_split(dataset, "train")
    _forge(dataset, FORGERIES[forgery])
    with caplog.at_level(logging.WARNING):
        assert cached_split(dataset, "train", None) is None
    assert any(SPLIT_CACHE in r.getMessage() and "ignoring" in r.getMessage() for r in caplog.records)
    resolved = resolve_dataset(LeafDataset(path=str(dataset), split_part="train", where="test"), dataset_config=None, split_config=None, trust_dataset_code=False)
    assert (resolved.split.names, resolved.split.counts, resolved.split.excluded_keys) == (expected.names, expected.counts, expected.excluded_keys)


@pytest.mark.parametrize("forgery", [f for f in FORGERIES if f != "warnings forged"])
def test_lint_reports_a_cache_that_disagrees_with_the_files(dataset: Path, forgery: str) -> None:
    runner = CliRunner()
    assert runner.invoke(cli, ["lint", str(dataset), "--no-progress"]).exit_code == 0
    _forge(dataset, FORGERIES[forgery])
    result = runner.invoke(cli, ["lint", str(dataset), "--no-progress"])
    assert result.exit_code == 1
    assert f"{SPLIT_CACHE} split train" in result.output


def test_a_deeply_nested_cache_is_ignored_with_a_warning(dataset: Path, caplog: pytest.LogCaptureFixture) -> None:
    _forge(dataset, lambda t, d: d.update(deep="DEEP"))
    path = dataset / ".nv-meta" / SPLIT_CACHE
    path.write_text(path.read_text().replace('"DEEP"', "[" * 3000 + "]" * 3000))
    with caplog.at_level(logging.WARNING):
        assert cached_split(dataset, "train", None) is None
    assert any("nesting too deep" in r.getMessage() for r in caplog.records)
    assert resolve_split(dataset, "train").names == [f"parts/data-{i}.tar" for i in range(4)]
