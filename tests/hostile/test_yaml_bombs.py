"""YAML alias bombs, brace bombs and deep nesting in every file the loader reads: a ConfigError
(StateError for a state) naming the file and key, quickly, in bounded memory. Bombs are generated
here; the cases that would exhaust memory or hang on a loader without the bounds run in a
subprocess under RLIMIT_AS and a timeout."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from energon_lite_dev.synthetic import write_numbered_shards

from megatron_energon_lite import WorkerConfig, get_savable_loader, get_train_dataset
from megatron_energon_lite.cli.main import cli
from megatron_energon_lite.errors import ConfigError, StateError
from megatron_energon_lite.format.metadata import read_info, read_split_config
from megatron_energon_lite.format.metadataset import MAX_METADATASET_NESTING, load_blend_plan
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.format.safe_parse import MAX_NESTING, brace_count

DATASET_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"
V2_HEADER = "__module__: megatron.energon\n__class__: MetadatasetV2\n"
MEMORY_LIMIT = 2 << 30


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """A YAML mapping of ``levels`` anchors, each a list of ``width`` aliases of the one before:
    a few hundred bytes that expand to width**levels values."""
    lines = [f"l0: &l0 [{', '.join(['x'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join("      " + line for line in lines)


@pytest.fixture()
def dataset(tmp_path: Path) -> Path:
    root = tmp_path / "ds"
    write_numbered_shards(root, shards=3, per_shard=4)
    prepare_dataset(root, split_ratio=(2, 1, 0), progress=False, dataset_yaml=DATASET_YAML)
    return root


def run_limited(*args: str, code: str = "import sys; from megatron_energon_lite.cli.main import cli; sys.exit(cli())") -> subprocess.CompletedProcess:
    """``energon-lite ARGS`` (or python ``code`` with ``ARGS``) in a subprocess with at most
    MEMORY_LIMIT of address space; a bound that does not hold fails the test by the timeout."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))

    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60, preexec_fn=limit)


_LOAD = """
import sys
from megatron_energon_lite import WorkerConfig, get_train_dataset
from megatron_energon_lite.errors import ConfigError
try:
    get_train_dataset(sys.argv[1], batch_size=1, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0))
except ConfigError as exc:
    print("ConfigError:", exc)
"""


def bomb_metadataset(tmp_path: Path, dataset: Path) -> Path:
    path = tmp_path / "bomb.yaml"
    path.write_text(V2_HEADER + f"splits:\n  train:\n    path: {dataset}\n    subflavors:\n{alias_bomb()}\n")
    assert len(path.read_bytes()) < 1000
    return path


@pytest.mark.parametrize("command", ["info", "lint"])
def test_an_alias_bomb_in_a_metadataset_is_refused_by_the_cli(tmp_path: Path, dataset: Path, command: str) -> None:
    path = bomb_metadataset(tmp_path, dataset)
    result = run_limited(command, str(path), *(["--no-progress"] if command == "lint" else []))
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-2000:]
    assert "YAML aliases expand the document too far" in output and f"{path}: splits.train.subflavors" in output
    assert "Traceback" not in output


def test_an_alias_bomb_in_a_metadataset_is_refused_by_the_loader(tmp_path: Path, dataset: Path) -> None:
    path = bomb_metadataset(tmp_path, dataset)
    result = run_limited(str(path), code=_LOAD)
    assert "ConfigError: YAML aliases expand the document too far" in result.stdout, result.stderr[-2000:]
    assert f"{path}: splits.train.subflavors" in result.stdout


def test_a_few_aliases_still_work(tmp_path: Path, dataset: Path) -> None:
    path = tmp_path / "shared.yaml"
    path.write_text(V2_HEADER + f"splits:\n  train:\n    blend:\n      - {{weight: 1, path: {dataset}, subflavors: &common {{source: web, lang: en}}}}\n      - {{weight: 1, path: {dataset}, subflavors: *common}}\n")
    plan = load_blend_plan(path, "train", training=True)
    assert [leaf.subflavors for leaf in plan.leaves] == [{"source": "web", "lang": "en"}] * 2


def test_a_self_referring_anchor_is_refused(tmp_path: Path, dataset: Path) -> None:
    path = tmp_path / "loop.yaml"
    path.write_text(V2_HEADER + f"splits:\n  train:\n    path: {dataset}\n    subflavors: &me {{inner: *me}}\n")
    with pytest.raises(ConfigError, match="refers to itself") as info:
        load_blend_plan(path, "train", training=True)
    assert str(path) in str(info.value)


BRACE_BOMB = "exclude:\n- parts/data-0.tar/s0k{0..1000000000000}\n"


@pytest.mark.parametrize("command", ["info", "lint"])
def test_a_brace_bomb_in_split_yaml_is_refused_by_the_cli(dataset: Path, command: str) -> None:
    split = dataset / ".nv-meta/split.yaml"
    split.write_text(split.read_text().replace("exclude: []\n", BRACE_BOMB))
    result = run_limited(command, str(dataset), *(["--no-progress"] if command == "lint" else []))
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-2000:]
    assert "invalid brace pattern" in output and f"{split}: exclude[0]" in output
    assert "MemoryError" not in output and "Traceback" not in output


def test_a_brace_bomb_in_split_yaml_is_refused_by_the_loader(dataset: Path) -> None:
    split = dataset / ".nv-meta/split.yaml"
    split.write_text(split.read_text().replace("  train:\n", "  train:\n  - parts/data-{0..99999999999}.tar\n"))
    result = run_limited(str(dataset), code=_LOAD)
    assert "ConfigError: invalid brace pattern" in result.stdout, result.stderr[-2000:]
    assert f"{split}: split_parts.train[0]" in result.stdout and "1,000,000" in result.stdout


def test_brace_patterns_below_the_limit_expand_as_before(dataset: Path) -> None:
    split = dataset / ".nv-meta/split.yaml"
    split.write_text("split_parts:\n  train:\n  - parts/data-{0..1}.tar\n  val:\n  - parts/data-{2,}.tar\nexclude: []\n")
    config = read_split_config(dataset)
    assert config.expanded_split("train") == ["parts/data-0.tar", "parts/data-1.tar"]
    assert config.expanded_split("val") == ["parts/data-2.tar", "parts/data-.tar"]
    assert brace_count("{a,b}{0..999999}{x,{y,z}}") == 2 * 1_000_000 * 3


def nested_json(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


@pytest.mark.parametrize("depth", [MAX_NESTING + 1, 1500, 100_000])
def test_deep_nesting_in_info_json_names_the_file(dataset: Path, depth: int) -> None:
    info = dataset / ".nv-meta/.info.json"
    data = json.loads(info.read_text())
    first = next(iter(data["shard_counts"]))
    info.write_text(json.dumps(data).replace(f'"{first}": 4', f'"{first}": {nested_json(depth)}'))
    with pytest.raises(ConfigError, match="nesting too deep") as error:
        read_info(dataset)
    assert str(info) in str(error.value)


def test_deep_nesting_in_a_split_yaml_names_the_file(dataset: Path) -> None:
    split = dataset / ".nv-meta/split.yaml"
    split.write_text("split_parts:\n  train: " + nested_json(MAX_NESTING + 5, "x") + "\n")
    with pytest.raises(ConfigError, match="nesting too deep") as error:
        read_split_config(dataset)
    assert f"{split}: split_parts.train" in str(error.value)


def test_a_deep_prepare_record_is_ignored_with_a_warning(dataset: Path, caplog: pytest.LogCaptureFixture) -> None:
    record = dataset / ".nv-meta/.lite-prepare.json"
    record.write_text(nested_json(5000))
    with caplog.at_level("WARNING"):
        result = prepare_dataset(dataset, split_ratio=(2, 1, 0), progress=False, force_overwrite=True)
    assert sorted(result.scanned) == sorted(read_info(dataset).shard_counts)  # indexed afresh
    assert any(str(record) in r.getMessage() and "nesting too deep" in r.getMessage() for r in caplog.records)


def test_a_chain_of_nested_metadatasets_is_refused_naming_the_files(tmp_path: Path, dataset: Path) -> None:
    count = 1500
    for i in range(count):
        target = f"m{i + 1}.yaml" if i + 1 < count else str(dataset)
        (tmp_path / f"m{i}.yaml").write_text(V2_HEADER + f"splits:\n  train:\n    path: {target}\n")
    with pytest.raises(ConfigError, match="metadataset files nest too deep") as error:
        load_blend_plan(tmp_path / "m0.yaml", "train", training=True)
    assert str(tmp_path / "m0.yaml") in str(error.value) and f"m{MAX_METADATASET_NESTING}.yaml" in str(error.value)


def test_a_short_chain_of_nested_metadatasets_still_loads(tmp_path: Path, dataset: Path) -> None:
    count = MAX_METADATASET_NESTING
    for i in range(count):
        target = f"m{i + 1}.yaml" if i + 1 < count else str(dataset)
        (tmp_path / f"m{i}.yaml").write_text(V2_HEADER + f"splits:\n  train:\n    path: {target}\n")
    assert len(load_blend_plan(tmp_path / "m0.yaml", "train", training=True).leaves) == 1


def test_a_deeply_nested_checkpoint_is_refused(tmp_path: Path, dataset: Path) -> None:
    loader = get_savable_loader(get_train_dataset(str(dataset), batch_size=1, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0)))
    state = loader.save_state_rank()
    deep: list = []
    for _ in range(2000):
        deep = [deep]
    state["worker_states"] = deep
    fresh = get_savable_loader(get_train_dataset(str(dataset), batch_size=1, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0)))
    with pytest.raises(StateError, match="nesting too deep"):
        fresh.restore_state_rank(state)
    checkpoint = tmp_path / "state.json"
    checkpoint.write_text(json.dumps({"worker_states": [], "config": {}}).replace("[]", nested_json(5000), 1))
    result = CliRunner().invoke(cli, ["checkpoint", "info", str(checkpoint)])
    assert result.exit_code != 0 and "nesting too deep" in result.output and str(checkpoint) in result.output
    assert not isinstance(result.exception, RecursionError)
