import json
import logging
from pathlib import Path

import pytest
import yaml

from megatron_energon_lite.errors import ConfigError, DatasetError, EmptyDatasetError
from megatron_energon_lite.format.metadata import (
    load_structured,
    read_info,
    read_split_config,
    resolve_split,
)
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.format.split_reader import SplitReader


@pytest.fixture
def prepared(text_dataset: Path) -> Path:
    prepare_dataset(text_dataset, split_ratio=(2, 1, 1), progress=False, num_workers=1)
    return text_dataset


def _write_split(root: Path, data: dict, name: str = "split.yaml") -> None:
    (root / ".nv-meta" / name).write_text(yaml.safe_dump(data))


def test_info_yaml_fallback(prepared: Path) -> None:
    info_json = prepared / ".nv-meta/.info.json"
    counts = json.loads(info_json.read_text())["shard_counts"]
    info_json.unlink()
    (prepared / ".nv-meta/.info.yaml").write_text(yaml.safe_dump({"shard_counts": counts}))
    assert read_info(prepared).shard_counts == counts


def test_unknown_key_in_info_names_file_and_key(prepared: Path) -> None:
    info_json = prepared / ".nv-meta/.info.json"
    data = json.loads(info_json.read_text())
    data["extra"] = 1
    info_json.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"\.info\.json: extra"):
        read_info(prepared)


def test_split_json_fallback_and_brace_patterns(prepared: Path) -> None:
    (prepared / ".nv-meta/split.yaml").unlink()
    (prepared / ".nv-meta/split.json").write_text(json.dumps({"split_parts": {"train": ["shards/shard_{002..003}.tar", "shards/shard_000.tar"]}}))
    split = resolve_split(prepared, "train")
    # Order is the listed order after expansion, not sorted.
    assert [s.name for s in split.shards] == ["shards/shard_002.tar", "shards/shard_003.tar", "shards/shard_000.tar"]


def test_unknown_split_key_is_an_error(prepared: Path) -> None:
    _write_split(prepared, {"split_parts": {"train": ["shards/shard_000.tar"]}, "split": "x"})
    with pytest.raises(ConfigError, match="unknown key 'split'"):
        read_split_config(prepared)


def test_missing_and_empty_splits(prepared: Path) -> None:
    with pytest.raises(ConfigError, match="'nope' does not exist") as info:
        resolve_split(prepared, "nope")
    assert "train" in str(info.value)
    _write_split(prepared, {"split_parts": {"train": [], "val": ["shards/shard_000.tar"]}})
    with pytest.raises(EmptyDatasetError):
        resolve_split(prepared, "train")


def test_shard_and_key_excludes(prepared: Path, caplog) -> None:
    keys = ["s1_00000{1..2}"]
    _write_split(prepared, {
        "split_parts": {"train": ["shards/shard_{000..002}.tar"]},
        "exclude": ["shards/shard_000.tar", "shards/shard_001.tar/" + keys[0], "shards/none.tar/x"],
    })
    with caplog.at_level(logging.WARNING):
        split = resolve_split(prepared, "train")
    assert [s.name for s in split.shards] == ["shards/shard_001.tar", "shards/shard_002.tar"]
    assert split.excluded_keys == {"shards/shard_001.tar": frozenset({"s1_000001", "s1_000002"})}
    assert split.total_samples == 10  # key excludes do not change counts
    assert "shards/none.tar/x" in caplog.text


def test_deleted_shard_is_reported_when_first_read(prepared: Path) -> None:
    """Locally, resolving a split touches no shard (a rank stats only the shards it reads)."""
    (prepared / "shards/shard_001.tar").unlink()
    split = resolve_split(prepared, "train")
    reader = SplitReader(prepared, "train", split=split)
    assert reader.read(0) is not None  # shard_000 is still there
    first_of_001 = reader.shard_starts[1]
    with pytest.raises(DatasetError, match="missing on disk") as raised:
        reader.read(first_of_001)
    assert "shards/shard_001.tar" in str(raised.value)


def test_unprepared_folder(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="energon-lite prepare"):
        read_info(tmp_path)


@pytest.mark.parametrize("suffix", ["yaml", "json"])
def test_a_malformed_split_file_of_20000_entries_names_the_line(tmp_path: Path, suffix: str) -> None:
    entries = [f"shards/{i:05d}.tar" for i in range(20000)]
    if suffix == "yaml":
        lines = ["split_parts:", "  train:", *(f"  - {e}" for e in entries)]
        bad = 2 + 12345  # 0-based line of entry 12345
        lines[bad] = "  - shards/[broken: {"
    else:
        lines = ['{"split_parts": {"train": [', *(f'  "{e}",' for e in entries[:-1]), f'  "{entries[-1]}"', "]}}"]
        bad = 1 + 12345
        lines[bad] = '  "shards/12345.tar" "missing comma",'
    path = tmp_path / f"split.{suffix}"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=rf"line {bad + 1}: '[^\n]*(broken|missing comma)") as info:
        load_structured(path)
    assert str(path) in str(info.value)


def test_a_yaml_syntax_error_shows_the_line_the_parser_stopped_at_in_the_users_words(tmp_path: Path) -> None:
    path = tmp_path / "mix.yaml"
    path.write_text("splits:\n  train:\n    blend:\n      - weight: 1\n        path: a\n       - weight: 2\n        path: b\n")
    with pytest.raises(ConfigError) as info:
        load_structured(path)
    message = str(info.value)
    assert "line 6: '- weight: 2'" in message  # the misindented entry, not only where the list began
    assert "(line 4, column 7)" in message and "(line 6, column 8)" in message
    assert "<unicode string>" not in message  # PyYAML's name for a parsed string means nothing to a user
