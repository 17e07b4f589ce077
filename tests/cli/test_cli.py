import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from energon_lite_dev.synthetic import make_jpeg, write_tar

from megatron_energon_lite.cli.main import cli


def _run(*args: str, input: str | None = None):
    return CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)


@pytest.fixture
def caption_dataset(tmp_path: Path) -> Path:
    root = tmp_path / "captions"
    for shard in range(3):
        samples = [
            (f"{shard}_{i:04d}", {"jpg": make_jpeg(8, 6, seed=shard * 10 + i), "txt": f"caption {shard} {i}".encode()})
            for i in range(4)
        ]
        write_tar(root / f"shards/part_{shard}.tar", samples)
    return root


def _prepare(root: Path, *extra: str):
    return _run(
        "prepare", str(root), "--non-interactive", "--no-progress", "--num-workers", "2",
        "--sample-type", "CaptioningSample", "--field-map", '{"image": "jpg", "caption": "txt"}', *extra,
    )


def test_prepare_info_lint_preview(caption_dataset: Path) -> None:
    result = _prepare(caption_dataset, "--split-ratio", "1,1,1")
    assert result.exit_code == 0, result.output
    assert "12 samples" in result.output
    dataset_yaml = yaml.safe_load((caption_dataset / ".nv-meta/dataset.yaml").read_text())
    assert dataset_yaml == {"sample_type": {"__module__": "megatron.energon", "__class__": "CaptioningSample"}, "field_map": {"image": "jpg", "caption": "txt"}}

    info = _run("info", str(caption_dataset))
    assert info.exit_code == 0
    assert "split train: 1 shard, 4 samples" in info.output
    assert "CaptioningSample" in info.output and "jpg (12)" in info.output

    lint = _run("lint", str(caption_dataset), "--no-progress", "--parallel", "2")
    assert lint.exit_code == 0, lint.output
    assert "OK" in lint.output

    preview = _run("preview", str(caption_dataset), "--split-parts", "val", "-n", "2")
    assert preview.exit_code == 0, preview.output
    assert "caption 1 0" in preview.output and "caption 1 1" in preview.output


def test_lint_reports_each_bad_sample(caption_dataset: Path) -> None:
    _prepare(caption_dataset, "--split-ratio", "1,0,0")
    shard = caption_dataset / "shards/part_1.tar"
    data = bytearray(shard.read_bytes())
    start = data.find(b"\xff\xd8")  # corrupt the first JPEG's payload, keep the tar valid
    data[start + 20 : start + 200] = b"\0" * 180
    shard.write_bytes(bytes(data))
    result = _run("lint", str(caption_dataset), "--no-progress")
    assert result.exit_code == 1
    assert "part_1.tar sample #0" in result.output
    assert "1 problem(s)" in result.output


def test_lint_reports_stale_index(caption_dataset: Path) -> None:
    _prepare(caption_dataset, "--split-ratio", "1,0,0")
    (caption_dataset / "shards/part_2.tar.idx").write_bytes(b"\0" * 16)
    result = _run("lint", str(caption_dataset), "--no-progress")
    assert result.exit_code == 1
    assert "part_2.tar" in result.output and "disagrees" in result.output


def test_prepare_validates_flags_before_work(caption_dataset: Path) -> None:
    # Bad values fail with status 1 (as energon's ClickExceptions), before anything is written.
    bad_field = _run("prepare", str(caption_dataset), "--non-interactive", "--split-ratio", "1,0,0", "--sample-type", "CaptioningSample", "--field-map", '{"img": "jpg"}')
    assert bad_field.exit_code == 1 and "no field 'img'" in bad_field.output
    bad_type = _run("prepare", str(caption_dataset), "--non-interactive", "--split-ratio", "1,0,0", "--sample-type", "Nope")
    assert bad_type.exit_code == 1 and "CaptioningSample" in bad_type.output
    bad_ratio = _run("prepare", str(caption_dataset), "--non-interactive", "--split-ratio", "1,0")
    assert bad_ratio.exit_code == 1 and "--split-ratio" in bad_ratio.output
    no_split = _run("prepare", str(caption_dataset), "--non-interactive")
    assert no_split.exit_code == 1 and "--split-ratio is required" in no_split.output
    assert not (caption_dataset / ".nv-meta").exists()


def test_second_prepare_needs_force_and_reuses_shards(caption_dataset: Path) -> None:
    assert _prepare(caption_dataset, "--split-ratio", "1,0,0").exit_code == 0
    again = _prepare(caption_dataset, "--split-ratio", "1,0,0")
    assert again.exit_code == 1 and "--force-overwrite" in again.output
    forced = _prepare(caption_dataset, "--split-ratio", "1,0,0", "--force-overwrite")
    assert forced.exit_code == 0 and "0 scanned, 3 unchanged" in forced.output


def test_interactive_prepare(caption_dataset: Path) -> None:
    # As energon prepare asks: ratio, "create dataset.yaml?", sample type number, "field_map?",
    # then one line per field of CaptioningSample
    from megatron_energon_lite.samples import registered_sample_types

    number = list(registered_sample_types()).index("CaptioningSample")
    result = _run("prepare", str(caption_dataset), "--no-progress", input=f"1,0,0\ny\n{number}\ny\njpg\ntxt\n")
    assert result.exit_code == 0, result.output
    written = yaml.safe_load((caption_dataset / ".nv-meta/dataset.yaml").read_text())
    assert written["field_map"] == {"image": "jpg", "caption": "txt"}


def test_prepare_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(5)))
    result = _run("prepare", str(path))
    assert result.exit_code == 0 and "5 records" in result.output
    assert (tmp_path / "a.jsonl.idx").stat().st_size == 8 * 6
    info = _run("info", str(path))
    assert "5 records" in info.output


def test_errors_are_one_clean_message(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    result = _run("prepare", str(tmp_path / "empty"), "--non-interactive", "--split-ratio", "1,0,0")
    assert result.exit_code == 0 and "Did not find any tar files" in result.output  # as energon
    assert not (tmp_path / "empty/.nv-meta").exists()
    (tmp_path / "empty/.nv-meta").mkdir()
    (tmp_path / "empty/.nv-meta/.info.json").write_text("{not json")
    result = _run("info", str(tmp_path / "empty"))
    assert result.exit_code == 1 and result.output.startswith("Error: ") and "Traceback" not in result.output
