"""``energon-lite info`` / ``lint`` on metadataset YAMLs, the YAMLs in configs/ and examples/blend_mix.py."""

import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from energon_lite_dev.synthetic import generate_jsonl, generate_text_dataset

from megatron_energon_lite.cli.main import cli
from megatron_energon_lite.format.indexed import IndexedWriter
from megatron_energon_lite.format.metadataset import load_blend_plan
from megatron_energon_lite.format.prepare import prepare_dataset

REPO = Path(__file__).resolve().parents[2]
TEXT_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"
V2_HEADER = "__module__: megatron.energon\n__class__: MetadatasetV2\n"


def _run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def _text_dataset(root: Path, per_shard: int, seed: int) -> Path:
    """3 shards of ``per_shard`` samples: 2 shards in train, 1 in val."""
    generate_text_dataset(root, num_shards=3, samples_per_shard=per_shard, max_words=8, seed=seed)
    prepare_dataset(root, split_ratio=(2, 1, 0), progress=False, num_workers=1, dataset_yaml=TEXT_YAML)
    return root


@pytest.fixture(scope="module")
def blend_dir(tmp_path_factory) -> Path:
    """Datasets a (train 20, val 10), b (train 12) and c (train 8), a nested mix.yaml and blend.yaml.

    blend.yaml, train: a 5 (first half: 10 samples), mix.yaml 3 (b 2 : c 1), b 2 again, c 0.
    Effective weights: a 50%, b 30% * 2/3 = 20%, c 10%, b 20%, c 0%.
    """
    root = tmp_path_factory.mktemp("blend")
    _text_dataset(root / "a", 10, seed=1)
    _text_dataset(root / "b", 6, seed=2)
    _text_dataset(root / "c", 4, seed=3)
    (root / "mix.yaml").write_text(V2_HEADER + "splits:\n  train:\n    blend:\n      - {weight: 2, path: b}\n      - {weight: 1, path: c}\n")
    (root / "blend.yaml").write_text(
        V2_HEADER
        + """splits:
  train:
    blend:
      - {weight: 5, path: a, subset: {range: [0%, 50%]}}
      - {weight: 3, path: mix.yaml}
      - {weight: 2, path: b, subflavors: {source: again}}
      - {weight: 0, path: c}
  val:
    path: a
"""
    )
    return root


def _line(output: str, *parts: str) -> str:
    """The one output line that contains every part."""
    lines = [line for line in output.splitlines() if all(part in line for part in parts)]
    assert len(lines) == 1, (parts, output)
    return lines[0]


def _cells(output: str, entry: str) -> list[str]:
    """The table row of the leaf at key path ``entry``, split into its columns."""
    rows = [line.strip() for line in output.splitlines() if line.strip().startswith(entry + "  ")]
    assert len(rows) == 1, (entry, output)
    return re.split(r"\s{2,}", rows[0])


def test_info_lists_each_leaf_with_weight_and_samples(blend_dir: Path) -> None:
    result = _run("info", str(blend_dir / "blend.yaml"))
    assert result.exit_code == 0, result.output
    assert "split train: blend of 5 datasets, blend_mode random (default)" in result.output
    assert re.split(r"\s{2,}", _line(result.output, "entry  ", "weight").strip()) == ["entry", "dataset", "split", "weight", "samples", "subset", "subflavors"]
    assert _cells(result.output, "splits.train.blend[0]") == ["splits.train.blend[0]", "a", "train", "50.0%", "10", "[0, 10) of 20", "-"]
    assert _cells(result.output, "mix.yaml: splits.train.blend[0]") == ["mix.yaml: splits.train.blend[0]", "b", "train", "20.0%", "12", "-", "-"]
    assert _cells(result.output, "mix.yaml: splits.train.blend[1]") == ["mix.yaml: splits.train.blend[1]", "c", "train", "10.0%", "8", "-", "-"]
    assert _cells(result.output, "splits.train.blend[2]") == ["splits.train.blend[2]", "b", "train", "20.0%", "12", "-", "source=again"]
    assert _cells(result.output, "splits.train.blend[3]") == ["splits.train.blend[3]", "c", "train", "0.0%", "8", "-", "-"]
    assert "split val: one dataset" in result.output
    assert _cells(result.output, "splits.val") == ["splits.val", "a", "val", "10", "-"]


def test_info_warns_about_duplicates_and_zero_weights(blend_dir: Path) -> None:
    output = _run("info", str(blend_dir / "blend.yaml")).output
    duplicate = _line(output, "warning:", "reached through")
    assert "b (split train) is reached through 2 entries (mix.yaml: splits.train.blend[0], splits.train.blend[2])" in duplicate
    assert "appear through each of them" in duplicate and "en#266" in duplicate
    zero = _line(output, "warning:", "weight 0")
    assert "splits.train.blend[3] (c) has weight 0: the entry is never read" in zero
    assert len([line for line in output.splitlines() if line.startswith("warning:")]) == 2


def test_disjoint_subsets_of_one_dataset_are_not_duplicates(blend_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "halves.yaml"
    path.write_text(
        V2_HEADER
        + f"""splits:
  train:
    blend_epochized:
      - {{repetitions: 1, path: {blend_dir / "a"}, subset: {{range: [0%, 50%]}}}}
      - {{repetitions: 2.5, path: {blend_dir / "a"}, subset: {{range: [50%, 100%]}}}}
"""
    )
    result = _run("info", str(path))
    assert result.exit_code == 0, result.output
    assert "warning:" not in result.output
    # 10 + int(10 * 2.5) samples per pass
    assert "blend_epochized of 2 datasets, 35 samples per pass" in result.output
    second = _cells(result.output, "splits.train.blend_epochized[1]")
    assert second[2:] == ["train", "x2.5", "10", "25", "[10, 20) of 20", "-"]


def test_lint_checks_every_dataset_of_the_blend(blend_dir: Path) -> None:
    result = _run("lint", str(blend_dir / "blend.yaml"), "--no-progress")
    assert result.exit_code == 0, result.output
    for name in ("a", "b", "c"):
        assert f"OK: {blend_dir / name}, " in result.output
    assert "split(s) decoded (train, val)" in _line(result.output, f"OK: {blend_dir / 'a'}, ")
    assert "warning:" in result.output  # the same warnings as info
    assert f"OK: {blend_dir / 'blend.yaml'}, no problems found" in result.output


def test_lint_fails_on_a_bad_weight_and_names_the_key(blend_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(V2_HEADER + f"splits:\n  train:\n    blend:\n      - {{weight: 1, path: {blend_dir / 'a'}}}\n      - {{weight: -2, path: {blend_dir / 'b'}}}\n")
    for command in ("lint", "info"):
        result = _run(command, str(path))
        assert result.exit_code == 1
        assert "invalid weight" in result.output and f"{path}: splits.train.blend[1].weight" in result.output


def test_lint_fails_when_a_blended_dataset_is_broken(blend_dir: Path, tmp_path: Path) -> None:
    shutil.copytree(blend_dir / "a", tmp_path / "a")
    (tmp_path / "a/shards/data-0001.tar.idx").write_bytes(b"\0" * 16)
    path = tmp_path / "one.yaml"
    path.write_text(V2_HEADER + "splits:\n  train:\n    blend:\n      - {weight: 1, path: a}\n      - {weight: 1, path: " + str(blend_dir / "b") + "}\n")
    result = _run("lint", str(path), "--no-progress")
    assert result.exit_code == 1
    assert "at: shards/data-0001.tar" in result.output
    assert f"OK: {blend_dir / 'b'}, " in result.output
    assert f"1 problem(s) found in {path} and its datasets" in result.output


def test_an_entry_that_cannot_be_read_is_an_error(blend_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "past_end.yaml"
    path.write_text(V2_HEADER + f"splits:\n  train:\n    blend:\n      - {{weight: 1, path: {blend_dir / 'a'}, subset: {{range: [5, 500]}}}}\n      - {{weight: 1, path: {blend_dir / 'b'}}}\n")
    result = _run("info", str(path))
    assert result.exit_code == 1
    assert _cells(result.output, "splits.train.blend[0]")[3:5] == ["50.0%", "?"]
    assert "error: split train: splits.train.blend[0]: subset range lies outside the dataset split" in result.output
    assert "1 entry of" in result.output


def test_lint_decodes_a_jsonl_entry(blend_dir: Path, tmp_path: Path) -> None:
    generate_jsonl(tmp_path / "records.jsonl", num_records=7, seed=1)
    assert _run("prepare", str(tmp_path / "records.jsonl")).exit_code == 0
    path = tmp_path / "with_jsonl.yaml"
    path.write_text(V2_HEADER + f"splits:\n  train:\n    blend:\n      - {{weight: 3, path: records.jsonl}}\n      - {{weight: 1, path: {blend_dir / 'c'}}}\n")
    result = _run("lint", str(path), "--no-progress")
    assert result.exit_code == 0, result.output
    assert _cells(result.output, "splits.train.blend[0]") == ["splits.train.blend[0]", "records.jsonl", "train", "75.0%", "7", "-"]
    assert f"OK: {tmp_path / 'records.jsonl'}, 1 split(s) decoded" in result.output


def _dataset_paths(node, found: set[str]) -> set[str]:
    """Every ``path`` in a metadataset YAML that names a dataset (not another YAML)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "path" and not value.endswith((".yaml", ".yml")):
                found.add(value)
            _dataset_paths(value, found)
    elif isinstance(node, list):
        for value in node:
            _dataset_paths(value, found)
    return found


def test_every_config_parses(tmp_path: Path) -> None:
    configs = tmp_path / "configs"
    shutil.copytree(REPO / "configs", configs)
    files = sorted(configs.glob("*.yaml"))
    assert {f.name for f in files} >= {"image_text_blend.yaml", "text_mix.yaml", "curriculum_epochized.yaml", "exact_blend.yaml", "image_caption_join.yaml", "megatron_tokens_blend.yaml"}
    needed: set[str] = set()
    for file in files:
        _dataset_paths(yaml.safe_load(file.read_text()), needed)
    for seed, relative in enumerate(sorted(needed)):
        root = (configs / relative).resolve()
        if root.name.endswith("_text_document"):  # a Megatron .bin/.idx prefix
            root.parent.mkdir(parents=True, exist_ok=True)
            with IndexedWriter(root, np.uint16) as writer:
                for length in (3000, 5000, 700):
                    writer.add_document(np.arange(length, dtype=np.uint16))
        elif not root.exists():
            generate_text_dataset(root, num_shards=2, samples_per_shard=4, max_words=8, seed=seed)
            prepare_dataset(root, split_ratio=(1, 1, 0), progress=False, num_workers=1, dataset_yaml=TEXT_YAML)
    for file in files:
        for split in yaml.safe_load(file.read_text())["splits"]:
            plan = load_blend_plan(file, split, training=True)
            if plan.kind == "blend":
                assert math.isclose(sum(leaf.weight for leaf in plan.leaves), 1.0), (file, split)
        result = _run("info", str(file))
        assert result.exit_code == 0, (file, result.output)
    assert load_blend_plan(configs / "exact_blend.yaml", "train", training=True).blend_mode == "exact"
    assert load_blend_plan(configs / "curriculum_epochized.yaml", "train", training=True).kind == "blend_epochized"
    nested = load_blend_plan(configs / "image_text_blend.yaml", "train", training=True)
    assert len(nested.leaves) == 4 and any(leaf.subflavors for leaf in nested.leaves)
    tokens = load_blend_plan(configs / "megatron_tokens_blend.yaml", "val", training=False)
    assert tokens.leaves[0].sequence_length == 2048


def test_blend_mix_example_runs(tmp_path: Path) -> None:
    command = [sys.executable, str(REPO / "examples/blend_mix.py"), "--batches", "20", "--every", "10", "--workers", "0", "--data-dir", str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "after 10 batches:" in result.stdout and "after 20 batches:" in result.stdout
    assert "realized" in result.stdout
    for name in ("captions", "text_a", "text_b"):
        assert name in result.stdout


def test_info_shows_a_scheduled_weight_as_its_share_at_the_start(blend_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "scheduled.yaml"
    path.write_text(V2_HEADER + f"splits:\n  train:\n    blend:\n      - {{weight: {{linear: {{0: 3, 100: 0}}}}, path: {blend_dir / 'a'}}}\n      - {{weight: 1, path: {blend_dir / 'b'}}}\n")
    result = _run("info", str(path))
    assert result.exit_code == 0, result.output
    assert _cells(result.output, "splits.train.blend[0]")[3] == "75.0% scheduled"
    assert _cells(result.output, "splits.train.blend[1]")[3] == "25.0% scheduled"


def test_info_plots_a_schedule_and_lists_its_points(blend_dir: Path, tmp_path: Path) -> None:
    """a: linear 3 -> 0 over 100 samples, b: 1 then 3 from sample 50: the table gives the shares
    at each point (0: 3:1, 50: 1.5:3, 100: 0:3) and the PNG is written."""
    path = tmp_path / "scheduled.yaml"
    path.write_text(V2_HEADER + f"splits:\n  train:\n    blend:\n      - {{weight: {{linear: {{0: 3, 100: 0}}}}, path: {blend_dir / 'a'}}}\n      - {{weight: {{step: {{0: 1, 50: 3}}}}, path: {blend_dir / 'b'}}}\n")
    plot = tmp_path / "schedule.png"
    result = _run("info", str(path), "--plot-schedule", str(plot))
    assert result.exit_code == 0, result.output
    rows = {int(cells[0]): [float(c) for c in cells[1:]] for cells in (line.split() for line in result.output.splitlines()) if len(cells) == 3 and cells[0].isdigit()}
    assert rows == {0: [0.75, 0.25], 50: pytest.approx([1.5 / 4.5, 3 / 4.5], abs=1e-3), 100: [0.0, 1.0]}
    matplotlib = pytest.importorskip("matplotlib")
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and matplotlib


def test_info_plot_schedule_needs_a_metadataset(blend_dir: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["info", str(blend_dir / "a"), "--plot-schedule", str(tmp_path / "x.png")])
    assert result.exit_code == 2 and "give a metadataset YAML" in result.output
