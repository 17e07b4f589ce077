"""``energon-lite checkpoint info`` / ``redist`` on damaged states: one clear error line and a
non-zero exit, never a traceback. The states are real ones with values changed by hypothesis."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from energon_lite_dev.synthetic import write_numbered_shards
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megatron_energon_lite import WorkerConfig, get_savable_loader, get_train_dataset
from megatron_energon_lite.cli.main import cli
from megatron_energon_lite.format.prepare import prepare_dataset
from test_fuzz_tar import json_places  # this folder's fuzz test: every place in a JSON value

TEXT_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**12), 10**12) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Both ranks' states (one worker each) of a training loader with a shuffle buffer."""
    root = tmp_path_factory.mktemp("ckpt") / "ds"
    write_numbered_shards(root, shards=4, per_shard=6)
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=TEXT_YAML)
    states = []
    for rank in range(2):
        config = WorkerConfig(rank=rank, world_size=2, num_workers=1)
        loader = get_savable_loader(get_train_dataset(root, worker_config=config, batch_size=2, shuffle_buffer_size=4, max_samples_per_sequence=3))
        for _, _batch in zip(range(3), loader):
            pass
        states.append(loader.save_state_rank())
        del loader, _batch
    return json.loads(json.dumps(states))


def _damaged(states: list[dict], place: int, value: Any, delete: bool) -> list:
    return _changed(states, json_places(states)[place % len(json_places(states))], value, delete)


def _changed(states: list, path: tuple, value: Any, delete: bool) -> Any:
    """A copy of ``states`` with the value at ``path`` replaced by ``value`` or deleted."""
    states = copy.deepcopy(states)
    if not path:
        return value
    target = states
    for part in path[:-1]:
        target = target[part]
    if delete:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return states


def _assert_clean(result, args: list[str]) -> None:
    """Exit 0, or 1 with one ``Error:`` message (our errors are several labelled lines)."""
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"{args}: {type(result.exception).__name__}: {result.exception}\n{result.output}") from result.exception
    assert result.exit_code in (0, 1), (args, result.exit_code, result.output)
    if result.exit_code:
        assert "Error:" in result.output and "Traceback" not in result.output, result.output


def _run_both(files: list[Path], out: Path) -> None:
    runner = CliRunner()
    for args in (["checkpoint", "info", *map(str, files)], ["checkpoint", "redist", *map(str, files), "-o", str(out), "--new-world-size", "1"]):
        _assert_clean(runner.invoke(cli, args), args)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(place=st.integers(0, 10**6), value=json_values, delete=st.booleans(), is_global=st.booleans())
def test_info_and_redist_of_a_damaged_state_exit_cleanly(saved: list[dict], tmp_path: Path, place: int, value: Any, delete: bool, is_global: bool) -> None:
    states = _damaged(saved, place, value, delete)
    folder = tmp_path / f"case{place}"
    folder.mkdir(exist_ok=True)
    if is_global or not isinstance(states, list) or not states:  # no rank files: the list as one global file
        files = [folder / "global.json"]
        files[0].write_text(json.dumps(states))
    else:
        files = [folder / f"state_rank{i}.json" for i in range(len(states))]
        for file, state in zip(files, states):
            file.write_text(json.dumps(state))
    _run_both(files, folder / "out")


@pytest.mark.parametrize(
    ("place", "value", "delete"),
    [
        (("config",), ["x"], False),  # was AttributeError: 'list' object has no attribute 'get'
        (("worker_states", 0), "x", False),
        (("next_worker",), None, True),  # redist: was KeyError 'next_worker'
        (("worker_states", 0, "source", "source", "source", "source", "open"), [[0, None]], False),  # info: TypeError
        (("config", "worker_config.num_workers"), "2", False),
    ],
)
def test_known_damage_exits_cleanly(saved: list[dict], tmp_path: Path, place: tuple, value: Any, delete: bool) -> None:
    states = _changed(saved, (0, *place), value, delete)
    files = [tmp_path / f"state_rank{i}.json" for i in range(2)]
    for file, state in zip(files, states):
        file.write_text(json.dumps(state))
    _run_both(files, tmp_path / "out")
