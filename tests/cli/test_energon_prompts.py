"""``prepare`` asks what ``energon prepare`` asks, in the same order; ``preview`` prints Energon's layout."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from energon_lite_dev.synthetic import make_jpeg, write_tar

from megatron_energon_lite.cli.main import cli
from megatron_energon_lite.samples import registered_sample_types

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.filterwarnings("ignore::FutureWarning"), pytest.mark.filterwarnings("ignore::ResourceWarning")]

CAPTIONING = list(registered_sample_types()).index("CaptioningSample")


def _run(*args: str, input: str | None = None):
    return CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)


@pytest.fixture
def shards(tmp_path: Path) -> Path:
    root = tmp_path / "ours"
    for shard in range(2):
        samples = [(f"{shard}_{i:03d}", {"jpg": make_jpeg(8, 6, seed=i), "txt": f"caption {shard} {i}".encode(), "json": b'{"c": 1}'}) for i in range(3)]
        write_tar(root / f"shards/part_{shard}.tar", samples)
    return root


def _prepared(root: Path) -> Path:
    result = _run("prepare", str(root), "--non-interactive", "--no-progress", "--split-ratio", "1,0,0", "--sample-type", "CaptioningSample", "--field-map", '{"image": "jpg", "caption": "txt"}')
    assert result.exit_code == 0, result.output
    return root


def _dataset_yaml(root: Path) -> dict:
    return yaml.safe_load((root / ".nv-meta/dataset.yaml").read_text())


def test_energons_answers_work_on_both(shards: Path, tmp_path: Path) -> None:
    # Answers to: continue with the prepared dataset?, ratio, create dataset.yaml?, sample type,
    # field_map instead of a sample_loader?, then one part per field of CaptioningSample.
    answers = f"y\n1,0,0\ny\n{CAPTIONING}\nY\njpg\ntxt\n"
    ours = _run("prepare", str(_prepared(shards)), "--no-progress", input=answers)
    assert ours.exit_code == 0 and "Done" in ours.output, ours.output
    assert _dataset_yaml(shards) == {"sample_type": {"__module__": "megatron.energon", "__class__": "CaptioningSample"}, "field_map": {"image": "jpg", "caption": "txt"}}

    energon = pytest.importorskip("megatron.energon.tools.prepare").command
    theirs = shutil.copytree(shards, tmp_path / "theirs")
    result = CliRunner().invoke(energon, [str(theirs), "--no-progress"], input=answers.replace(f"\n{CAPTIONING}\n", "\n0\n"))
    assert result.exit_code == 0 and "Done" in result.output, result.output
    assert _dataset_yaml(theirs) == _dataset_yaml(shards)


def test_an_unknown_part_is_asked_again(shards: Path) -> None:
    result = _run("prepare", str(shards), "--no-progress", input=f"1,0,0\ny\n{CAPTIONING}\ny\npng\njpg\njson[c]\n")
    assert result.exit_code == 0, result.output
    assert "That type doesn't exist in the WebDataset (png)" in result.output
    assert _dataset_yaml(shards)["field_map"] == {"image": "jpg", "caption": "json[c]"}


def test_a_bad_ratio_is_asked_again(shards: Path) -> None:
    result = _run("prepare", str(shards), "--no-progress", input="1,0\n1,0,0\nn\n")
    assert result.exit_code == 0, result.output
    assert "has 2 values" in result.output and "You will have to add a dataset.yaml manually." in result.output
    assert not (shards / ".nv-meta/dataset.yaml").exists()


def test_not_continuing_leaves_the_dataset_alone(shards: Path) -> None:
    before = (_prepared(shards) / ".nv-meta/split.yaml").read_text()
    result = _run("prepare", str(shards), "--no-progress", input="n\n")
    assert result.exit_code == 0 and "not changed" in result.output
    assert (shards / ".nv-meta/split.yaml").read_text() == before


def test_sample_loader_instead_of_a_field_map(shards: Path) -> None:
    result = _run("prepare", str(shards), "--no-progress", "--sample-type", "CaptioningSample", input="1,0,0\nn\n")
    assert result.exit_code == 0, result.output
    assert _dataset_yaml(shards)["sample_loader"] == "sample_loader.py:sample_loader"
    template = shards / ".nv-meta/sample_loader.py"
    assert "def sample_loader" in template.read_text()
    # Non-interactive, an edited sample_loader.py is kept (as energon prepare keeps it).
    template.write_text("# edited\n")
    again = _run("prepare", str(shards), "--non-interactive", "--no-progress", "--force-overwrite", "--split-ratio", "1,0,0", "--sample-type", "CaptioningSample")
    assert again.exit_code == 0, again.output
    assert template.read_text() == "# edited\n"


def test_non_interactive_without_sample_type_writes_no_dataset_yaml(shards: Path) -> None:
    result = _run("prepare", str(shards), "--non-interactive", "--no-progress", "--split-ratio", "1,0,0")
    assert result.exit_code == 0, result.output
    assert "Skipping dataset.yaml creation" in result.output and "Found the following part types in the dataset: jpg, json, txt" in result.output
    assert not (shards / ".nv-meta/dataset.yaml").exists()


def test_jsonl_prepare_prints_energons_summary(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_text("".join(json.dumps({"i": i}) + "\n\n" for i in range(4)))  # blank lines are no records
    result = _run("prepare", str(path))
    assert result.exit_code == 0 and "Done. Found 4 samples." in result.output


def test_preview_prints_each_field_with_its_type(shards: Path) -> None:
    _run("prepare", str(shards), "--non-interactive", "--no-progress", "--split-ratio", "1,1,0", "--sample-type", "CaptioningSample", "--field-map", '{"image": "jpg", "caption": "txt"}')
    result = _run("preview", str(shards), "--split-parts", "train,test,val", "-n", "1")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "Sample 0" in lines
    assert " - __key__ (<class 'str'>): '0_000'" in lines and " - caption (<class 'str'>): 'caption 0 0'" in lines
    assert "Dataset test is empty. Skipping." in lines
    assert " - __key__ (<class 'str'>): '1_000'" in lines  # the val split
