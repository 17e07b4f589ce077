"""A sample holding the same member twice (``k1.txt`` twice in one tar) lost one copy silently
and ``lint`` said OK: now a bad sample at read (through the error policy) and a lint finding."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from megatron_energon_lite import DecodeError, WorkerConfig, get_loader, get_val_dataset
from megatron_energon_lite.cli.main import cli
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.format.split_reader import SplitReader

TEXT_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"


@pytest.fixture(params=[tarfile.USTAR_FORMAT, tarfile.PAX_FORMAT], ids=["ustar", "pax"])
def dataset(tmp_path: Path, request) -> Path:
    root = tmp_path / "ds"
    root.mkdir()
    members = [("k0.txt", b"zero"), ("k1.txt", b"one"), ("k1.json", b"{}"), ("k1.txt", b"uno"), ("k2.txt", b"two")]
    with tarfile.open(root / "data-0.tar", "w", format=request.param) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            if request.param == tarfile.PAX_FORMAT:
                info.pax_headers = {"comment": "x"}  # an extended header in front of every member
            tar.addfile(info, io.BytesIO(data))
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=TEXT_YAML)
    return root


def test_reading_the_sample_is_an_error_naming_the_member(dataset: Path) -> None:
    reader = SplitReader(dataset, "train")
    assert reader.read(0).parts == {"txt": b"zero"}
    with pytest.raises(DecodeError, match=r"(?s)same member twice.*data-0\.tar.*'k1\.txt'.*each part of sample 'k1' once"):
        reader.read(1, wanted=frozenset({"json"}))  # also when the repeated part is not wanted


def test_the_loader_skips_it_as_a_bad_sample(dataset: Path) -> None:
    config = WorkerConfig(rank=0, world_size=1, num_workers=0)
    texts = [s.text for s in get_loader(get_val_dataset(dataset, split_part="train", worker_config=config, batch_size=None))]
    assert texts == ["zero", "two"]


def test_lint_reports_it(dataset: Path) -> None:
    result = CliRunner().invoke(cli, ["lint", str(dataset)])
    assert result.exit_code != 0, result.output
    assert "same member twice" in result.output and "k1.txt" in result.output, result.output
