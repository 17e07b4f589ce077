"""A start-up summary shipped with a dataset (its stamps made to match the files) may not say more
than the files: counts for more or fewer shards than the split file lists, a shard hidden by a
zero count, forged warnings or a nested bomb are ignored with a warning (the files are read), and
``lint`` reports them.  Shards and excludes cannot be forged: they are read from the split file."""

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


# The summary holds only counts (the names and excludes are the split file's): a count more or
# less than the split has shards, or one that hides a shard, cannot be served.
FORGERIES = {
    "count for a shard more": lambda t, d: t["counts"].append([3, 1]),
    "count for a shard less": lambda t, d: t["counts"][-1].__setitem__(1, t["counts"][-1][1] - 1),
    "shard hidden by a zero count": lambda t, d: t["counts"].insert(0, [0, 1]) or t["counts"][-1].__setitem__(1, t["counts"][-1][1] - 1),
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
