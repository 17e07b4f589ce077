from pathlib import Path

import pytest

from megatron_energon_lite.errors import DatasetError
from megatron_energon_lite.format.jsonl import JsonlReader, build_jsonl_index, write_jsonl_index


def test_blank_lines_belong_to_the_previous_record(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    lines = ['{"id": 0, "q": "a"}\n', '{"id": 1, "q": "bb"}\n', "\n", '{"id": 2, "q": "ccc"}\n']
    path.write_text("".join(lines))
    starts = [0, len(lines[0]), len(lines[0]) + len(lines[1]) + 1, path.stat().st_size]
    assert list(build_jsonl_index(path)) == starts
    assert write_jsonl_index(path) == 3
    reader = JsonlReader(path)
    assert [reader.read(i)["q"] for i in range(len(reader))] == ["a", "bb", "ccc"]


def test_leading_blank_line_is_part_of_record_zero(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_text('\n{"a": 1}\n{"a": 2}')
    assert list(build_jsonl_index(path)) == [0, 10, 18]


def test_bad_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_text('{"a": 1}\n[1, 2]\n')
    with pytest.raises(DatasetError, match=r"a\.jsonl:2"):
        build_jsonl_index(path)


def test_changed_file_needs_a_new_index(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_text('{"a": 1}\n')
    write_jsonl_index(path)
    path.write_text('{"a": 1}\n{"a": 2}\n')
    with pytest.raises(DatasetError, match="regenerate"):
        JsonlReader(path)
