"""``energon-lite info`` on Megatron ``.bin/.idx`` datasets (prefix, ``X.idx`` or ``X.bin``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from megatron_energon_lite.cli.main import cli
from megatron_energon_lite.format.indexed import IndexedWriter


def _run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


# Document lengths 5, 1, 8 (two sequences), 3, 100: 117 uint16 tokens in 6 sequences.
LENGTHS = [5, 1, 8, 3, 100]


@pytest.fixture
def prefix(tmp_path: Path) -> Path:
    prefix = tmp_path / "web_text_document"
    with IndexedWriter(prefix, np.uint16) as writer:
        for i, length in enumerate(LENGTHS):
            tokens = np.arange(length, dtype=np.uint16)
            writer.add_document(tokens, [3, 5] if i == 2 else None)
    return prefix


@pytest.mark.parametrize("suffix", ["", ".idx", ".bin"])
def test_info_shows_counts_sizes_and_lengths(prefix: Path, suffix: str) -> None:
    result = _run("info", str(prefix) + suffix)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"Megatron indexed dataset {prefix}"
    assert "  dtype:       uint16" in lines
    assert "  documents:   5, sequences: 6, tokens: 117" in lines
    # .bin: 117 tokens x 2 bytes; .idx: 34 + 12 x 6 sequences + 8 x 6 document index entries.
    assert "  .bin:        234.0 B (234 bytes)" in lines
    assert "  .idx:        154.0 B (154 bytes)" in lines
    assert "  doc length:  min 1, median 5, max 100 tokens" in lines


def test_info_multimodal_and_even_median(tmp_path: Path) -> None:
    with IndexedWriter(tmp_path / "mm", np.int32, multimodal=True) as writer:
        for length in (2, 4, 7, 9):
            writer.add_document(np.zeros(length, np.int32))
    result = _run("info", str(tmp_path / "mm"))
    assert result.exit_code == 0, result.output
    assert "  dtype:       int32, multimodal" in result.output.splitlines()
    assert "  doc length:  min 2, median 5.5, max 9 tokens" in result.output.splitlines()
    # 22 int32 tokens; 34 + 12 x 4 + 8 x 5 + 4 mode bytes.
    assert "(88 bytes)" in result.output and "(126 bytes)" in result.output


def test_info_empty_dataset(tmp_path: Path) -> None:
    IndexedWriter(tmp_path / "empty").finalize()
    result = _run("info", str(tmp_path / "empty.idx"))
    assert result.exit_code == 0, result.output
    assert "  documents:   0, sequences: 0, tokens: 0" in result.output.splitlines()
    assert "doc length" not in result.output


def test_info_names_a_missing_bin(prefix: Path) -> None:
    (prefix.parent / "web_text_document.bin").unlink()
    result = _run("info", str(prefix))
    assert result.exit_code == 1
    assert "web_text_document.bin" in result.output and "missing" in result.output


def test_info_reports_a_corrupt_index(prefix: Path) -> None:
    idx = prefix.parent / "web_text_document.idx"
    idx.write_bytes(b"NOTANIDX!" + idx.read_bytes()[9:])
    result = _run("info", str(idx))
    assert result.exit_code == 1
    assert "bad magic" in result.output and str(idx) in result.output


def test_info_rejects_folder_options(prefix: Path) -> None:
    result = _run("info", str(prefix), "--split-config", "x.yaml")
    assert result.exit_code == 2 and "Megatron" in result.output


def test_jsonl_next_to_its_index_is_still_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n')
    assert _run("prepare", str(path)).exit_code == 0
    result = _run("info", str(path))
    assert result.exit_code == 0, result.output
    assert "JSONL dataset" in result.output and "2 records" in result.output


def test_info_missing_prefix(tmp_path: Path) -> None:
    result = _run("info", str(tmp_path / "nothing"))
    assert result.exit_code == 1 and "does not exist" in result.output
