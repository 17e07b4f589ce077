"""A new user's early mistakes are caught by the command that can see them, with the fix.

Each case here passed silently before (exit 0, or click's bare ``Aborted!``): a field map naming
a part the shards lack, an empty split from rounding, a broken dataset.yaml under ``info``, a
question with no terminal to answer it, Ctrl-C's exit status, lint's one line per bad sample.
"""

import os
import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from energon_lite_dev.synthetic import make_jpeg, write_tar

from megatron_energon_lite.cli import prepare as prepare_module
from megatron_energon_lite.cli.bench import bench
from megatron_energon_lite.cli.main import cli
from megatron_energon_lite.cli.params import INTERRUPTED_EXIT
from megatron_energon_lite.format.process_pool import scan_in_order
from megatron_energon_lite.preview.collect import PreviewField, PreviewSample
from megatron_energon_lite.preview.grid import cell_text
from megatron_energon_lite.preview.views import view_of

CAPTIONS = '{"image": "jpg", "caption": "txt"}'


def _run(*args: str, input: str | None = None):
    return CliRunner().invoke(cli, list(args), input=input)


@pytest.fixture
def four_shards(tmp_path: Path) -> Path:
    root = tmp_path / "photos"
    for shard in range(4):
        samples = [(f"{shard}_{i}", {"jpg": make_jpeg(8, 6, seed=shard * 10 + i), "txt": f"caption {shard} {i}".encode(), "json": b"{}"}) for i in range(3)]
        write_tar(root / f"shard_{shard}.tar", samples)
    return root


def _prepare(root: Path, *extra: str):
    return _run("prepare", str(root), "--non-interactive", "--no-progress", "--num-workers", "1", *extra)


def test_field_map_naming_a_part_the_shards_lack_is_refused_with_the_parts_found(four_shards: Path) -> None:
    result = _prepare(four_shards, "--split-ratio", "1,0,0", "--sample-type", "CaptioningSample", "--field-map", '{"image": "png", "caption": "txt"}')
    assert result.exit_code == 1
    assert "--field-map names part types the shards do not hold" in result.output
    assert "image: png" in result.output and "jpg, json, txt" in result.output
    assert not (four_shards / ".nv-meta/dataset.yaml").exists()
    # the corrected command without --force-overwrite says what is missing, not "already prepared"
    again = _prepare(four_shards, "--split-ratio", "1,0,0", "--sample-type", "CaptioningSample", "--field-map", CAPTIONS)
    assert again.exit_code == 1
    assert "the shards are indexed already, but dataset.yaml is not written" in again.output and "--force-overwrite" in again.output
    # alternatives: one existing part is enough (png,jpg), and the fix the message names works
    fixed = _prepare(four_shards, "--split-ratio", "1,0,0", "--force-overwrite", "--sample-type", "CaptioningSample", "--field-map", '{"image": "png,jpg", "caption": "txt"}')
    assert fixed.exit_code == 0, fixed.output
    assert (four_shards / ".nv-meta/dataset.yaml").exists()


def test_allow_missing_parts_writes_the_field_map_anyway(four_shards: Path) -> None:
    result = _prepare(four_shards, "--split-ratio", "1,0,0", "--sample-type", "CaptioningSample", "--field-map", '{"image": "png", "caption": "txt"}', "--allow-missing-parts")
    assert result.exit_code == 0, result.output
    assert "png" in (four_shards / ".nv-meta/dataset.yaml").read_text()


def test_a_split_emptied_by_rounding_is_a_warning_with_the_fix(four_shards: Path) -> None:
    result = _prepare(four_shards, "--split-ratio", "8,1,1", "--sample-type", "CaptioningSample", "--field-map", CAPTIONS)
    assert result.exit_code == 0, result.output
    assert re.search(r"Warning: split val is empty: 4 shards at --split-ratio 8,1,1 give it 0\.4 of a shard", result.output)
    assert "--split-ratio that gives every split at least one whole shard" in result.output
    assert "split test is empty" not in result.output


def test_a_zero_in_the_ratio_empties_a_split_on_purpose_without_a_warning(four_shards: Path) -> None:
    result = _prepare(four_shards, "--split-ratio", "1,0,0", "--sample-type", "CaptioningSample", "--field-map", CAPTIONS)
    assert result.exit_code == 0, result.output
    assert "Warning" not in result.output
    assert "split train: 4 shards, 12 samples" in result.output and "split val: 0 shards, 0 samples" in result.output


def test_info_fails_on_a_broken_dataset_yaml_after_printing_what_it_can(four_shards: Path) -> None:
    assert _prepare(four_shards, "--split-ratio", "1,0,0", "--sample-type", "CaptioningSample", "--field-map", CAPTIONS).exit_code == 0
    yaml_file = four_shards / ".nv-meta/dataset.yaml"
    yaml_file.write_text(yaml_file.read_text().replace("field_map", "feild_map"))
    result = _run("info", str(four_shards))
    assert result.exit_code == 1
    assert "shards:      4, samples: 12" in result.output
    assert "unknown key 'feild_map'" in result.output


def test_info_without_a_dataset_yaml_succeeds_and_says_so(four_shards: Path) -> None:
    assert _prepare(four_shards, "--split-ratio", "1,0,0", "--skip-dataset-yaml").exit_code == 0
    result = _run("info", str(four_shards))
    assert result.exit_code == 0, result.output
    assert "sample type: none (dataset.yaml not written" in result.output


def test_lint_groups_one_kind_of_problem_and_lists_all_with_verbose(four_shards: Path) -> None:
    assert _prepare(four_shards, "--split-ratio", "1,0,0", "--sample-type", "CaptioningSample", "--field-map", '{"image": "png", "caption": "txt"}', "--allow-missing-parts").exit_code == 0
    grouped = _run("lint", str(four_shards), "--no-progress")
    assert grouped.exit_code == 1
    assert grouped.output.count("BAD") == 1
    assert "BAD (12x) field 'image' cannot be filled" in grouped.output
    # The sample's jpg is there; only the parts field_map reads were loaded, and the message says so.
    assert "(of the parts field_map reads, the sample has: txt)" in grouped.output
    assert "`energon-lite info` lists the part types" in grouped.output
    assert "fix: " in grouped.output and "lint --verbose lists every place" in grouped.output
    verbose = _run("lint", str(four_shards), "--no-progress", "--verbose")
    assert verbose.exit_code == 1
    assert verbose.output.count("BAD split train") == 12


def test_a_question_without_a_terminal_names_the_flags_that_avoid_it(four_shards: Path) -> None:
    result = _run("prepare", str(four_shards), "--no-progress", input="")  # stdin closed at once
    assert result.exit_code == 1
    assert "input is closed" in result.output
    assert "--non-interactive" in result.output and "--split-ratio" in result.output


def test_ctrl_c_exits_130(four_shards: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare_module, "prepare_dataset", interrupted)
    result = _prepare(four_shards, "--split-ratio", "1,0,0")
    assert result.exit_code == INTERRUPTED_EXIT == 130
    # Ctrl-C at a question: click.prompt turns it into Abort, which must still exit 130
    monkeypatch.setattr(prepare_module.click, "prompt", _ctrl_c_at_prompt)
    asked = _run("prepare", str(four_shards), "--no-progress")
    assert asked.exit_code == 130


def _ctrl_c_at_prompt(*args, **kwargs):
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt:
        raise click.Abort() from None  # as click.prompt does


def test_bench_defaults_to_the_cores_this_process_may_use() -> None:
    option = next(p for p in bench.params if p.name == "num_workers")
    assert option.default == len(os.sched_getaffinity(0))


def _first(job: tuple) -> int:
    return job[0]


def test_the_progress_bar_reaches_the_end_when_the_consumer_stops_at_the_last_result(capsys: pytest.CaptureFixture) -> None:
    results = scan_in_order(_first, [(i,) for i in range(4)], num_workers=1, progress=True, desc="Indexing", unit="shard")
    assert [r for _, r in zip(range(4), results)] == [0, 1, 2, 3]  # zip stops without resuming the generator
    results.close()
    assert "4/4" in capsys.readouterr().err


def test_grid_caption_is_the_samples_text_not_its_key() -> None:
    sample = PreviewSample(0, "000001", "shard.tar", (PreviewField("__key__", "str", view_of("000001")), PreviewField("caption", "str", view_of("a red square"))))
    assert cell_text(sample) == "a red square"
