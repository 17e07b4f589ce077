"""Replay with skips (issue 41, item 3): restore_state_rank(state, skip_samples=...) resumes the
run without the named samples; each worker's sample sequence is the original's minus them."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from megatron_energon_lite import ConfigError, DefaultTaskEncoder, Sample, StateError, TextSample, WorkerConfig, get_savable_loader, get_train_dataset, stateless
from megatron_energon_lite.cli.main import cli as cli_main
from megatron_energon_lite.loader.env_settings import SKIPS_ENV
from megatron_energon_lite.manifest import read_manifest


def _dataset(path: Path, workers: int, **kwargs: Any):
    settings = dict(worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers), batch_size=4, shuffle_buffer_size=5, max_samples_per_sequence=3)
    settings.update(kwargs)
    return get_train_dataset(path, **settings)


def _batches(loader, count: int) -> list[tuple[int, list[str]]]:
    """(worker, sample keys) of the next ``count`` items (a pack's members in order)."""
    it = iter(loader)
    out = []
    for _ in range(count):
        item = next(it)
        keys = item.keys if hasattr(item, "keys") and isinstance(getattr(item, "keys"), list) else item.__key__
        out.append((item.__restore_key__[1], [keys] if isinstance(keys, str) else list(keys)))
    return out


def _streams(batches: list[tuple[int, list[str]]]) -> dict[int, list[str]]:
    """Each worker's samples in the order it delivered them."""
    streams: dict[int, list[str]] = {}
    for worker, keys in batches:
        streams.setdefault(worker, []).extend(keys)
    return streams


def _check_minus(original: dict[int, list[str]], before: dict[int, list[str]], after: dict[int, list[str]], skipped: set[str]) -> None:
    """After the checkpoint, each worker's samples are the original run's minus ``skipped``."""
    for worker, keys in after.items():
        expected = [k for k in original[worker][len(before.get(worker, [])) :] if k not in skipped]
        assert keys == expected[: len(keys)], worker
        assert len(keys) > 0


def _replay(make, skip_of, before: int = 3, total: int = 16, **restore: Any):
    """(original streams, streams before the checkpoint, the replay's streams, replay loader)."""
    original = _streams(_batches(make(), total))
    first = make()
    head = _batches(first, before)
    state = first.save_state_rank()
    replay = make()
    replay.restore_state_rank(state, skip_samples=skip_of(original), **restore)
    return original, _streams(head), _streams(_batches(replay, total - before - 3)), replay


@pytest.mark.parametrize("workers", [0, 2])
def test_skipping_by_key_drops_only_those_samples(prepared_text: Path, workers: int, caplog: pytest.LogCaptureFixture) -> None:
    def skip_of(original):
        return [original[0][20], original[max(original)][14]]

    caplog.set_level(logging.INFO, logger="megatron_energon_lite.loader")
    original, before, after, replay = _replay(lambda: get_savable_loader(_dataset(prepared_text, workers)), skip_of)
    skipped = set(skip_of(original))
    _check_minus(original, before, after, skipped)
    assert replay.replay_skipped_samples == 2
    assert replay.skip_report()["replay_skipped"] == 2 and replay.skip_report()["skipped"] == 0
    # Each drop is told once, at INFO, with its key and the step it came before.
    told = [r.getMessage() for r in caplog.records if "named in the loader's skip list" in r.getMessage()]
    assert len(told) == 2 and all(r.levelno == logging.INFO for r in caplog.records if "skip list" in r.getMessage())
    assert {key for key in skipped if any(repr(key) in line and "before step" in line for line in told)} == skipped


def test_the_state_carries_the_skip_list_so_a_later_resume_keeps_skipping(prepared_blend: Path) -> None:
    def make():
        return get_savable_loader(_dataset(prepared_blend, 2, batch_size=3))

    original = _streams(_batches(make(), 30))
    first = make()
    head = _batches(first, 2)
    poison = original[1][12]
    replay = make()
    replay.restore_state_rank(first.save_state_rank(), skip_samples=[poison])
    middle = _batches(replay, 4)
    state = replay.save_state_rank()
    assert state["sample_skips"]["version"] == 1
    (entry,) = state["sample_skips"]["samples"]
    assert entry["key"] == poison and entry["dataset"] == (0 if poison.startswith("a") else 1)
    json.dumps(state)  # plain JSON
    again = make()
    again.restore_state_rank(state)  # no skip list given: the state's
    tail = _batches(again, 16)
    assert again.sample_skips.samples[0].key == poison
    _check_minus(original, _streams(head), _streams(middle + tail), {poison})
    assert poison in original[1][6 + 3:]  # it came after the checkpoint in the original run


def test_a_state_without_skips_keeps_its_shape(prepared_text: Path) -> None:
    loader = get_savable_loader(_dataset(prepared_text, 0))
    _batches(loader, 2)
    assert "sample_skips" not in loader.save_state_rank()


def test_unknown_names_are_listed_and_refused_unless_ignored(prepared_blend: Path, caplog: pytest.LogCaptureFixture) -> None:
    loader = get_savable_loader(_dataset(prepared_blend, 0))
    names = ["a0_000", "no_such_key", {"dataset": 5, "index": 0}, {"dataset": 0, "index": 10_000}, {"dataset": 1, "shard": "shards/999.tar", "index_in_shard": 0}, {"step": 3}]
    with pytest.raises(ConfigError) as error:
        loader.restore_state_rank(None, skip_samples=names)
    message = str(error.value)
    assert "5 name(s) in the skip list match no sample" in message
    for part in ("'no_such_key'", "dataset 5", "index 10000", "shards/999.tar", "manifest=DIR"):
        assert part in message, part
    assert "a0_000" not in message
    caplog.set_level(logging.WARNING)
    loader.restore_state_rank(None, skip_samples=names, ignore_unknown_skips=True)
    assert [s.key for s in loader.sample_skips.samples] == ["a0_000"]
    assert "ignoring 5 name(s)" in caplog.text


def test_a_bad_skip_list_in_a_state_is_a_state_error(prepared_text: Path) -> None:
    loader = get_savable_loader(_dataset(prepared_text, 0))
    _batches(loader, 1)
    state = loader.save_state_rank()
    state["sample_skips"] = {"version": 1, "samples": [{"dataset": -1, "index": 0}]}
    with pytest.raises(StateError, match="sample_skips"):
        get_savable_loader(_dataset(prepared_text, 0)).restore_state_rank(state)


@pytest.mark.parametrize("workers", [0, 2])
def test_skipping_whole_steps_through_the_manifest(prepared_blend: Path, tmp_path: Path, workers: int) -> None:
    def make():
        return get_savable_loader(_dataset(prepared_blend, workers, batch_size=3), manifest=tmp_path / "m")

    original_loader = make()
    original = _batches(original_loader, 14)
    original_loader.save_state_rank()
    del original_loader
    step_keys = set(original[6][1] + original[9][1])
    first = make()
    head = _batches(first, 3)
    replay = make()
    replay.restore_state_rank(first.save_state_rank(), skip_samples=[{"steps": [6, 9]}])
    by_key = make()
    by_key.restore_state_rank(None, skip_samples=sorted(step_keys))
    assert set(replay.sample_skips.identities()) == set(by_key.sample_skips.identities())
    assert {s.key for s in replay.sample_skips.samples} == step_keys  # looked up for the report
    after = _streams(_batches(replay, 8))
    _check_minus(_streams(original), _streams(head), after, step_keys)
    # A whole step read with the Python API names the same samples.
    (step,) = [s for s in read_manifest(tmp_path / "m") if s.step == 6]
    other = make()
    other.restore_state_rank(None, skip_samples=[step])
    by_key.restore_state_rank(None, skip_samples=original[6][1])
    assert len(other.sample_skips) == 3 and set(other.sample_skips.identities()) <= set(by_key.sample_skips.identities())


def test_a_manifest_entry_of_other_data_is_refused(prepared_text: Path, prepared_blend: Path, tmp_path: Path) -> None:
    loader = get_savable_loader(_dataset(prepared_text, 0), manifest=tmp_path / "m")
    _batches(loader, 2)
    loader.save_state_rank()
    (step, *_) = read_manifest(tmp_path / "m")
    with pytest.raises(ConfigError, match="a manifest of another run or dataset"):
        get_savable_loader(_dataset(prepared_blend, 0)).restore_state_rank(None, skip_samples=[step])


@dataclasses.dataclass
class Pair(Sample):
    keys: Any = None


class PairPacker(DefaultTaskEncoder):
    """Packs consecutive samples in twos, in the order they entered the buffer."""

    def select_samples_to_pack(self, samples: list[TextSample]) -> list[list[TextSample]]:
        return [samples[i : i + 2] for i in range(0, len(samples), 2)]

    @stateless
    def pack_selected_samples(self, samples: list[TextSample]) -> Pair:
        return Pair(__key__="+".join(s.__key__ for s in samples), __restore_key__=(), __subflavors__=None, __sources__=(), keys=[s.__key__ for s in samples])


class OneGroup(DefaultTaskEncoder):
    @stateless
    def batch_group_criterion(self, sample: TextSample):
        return ("all", 3)


@pytest.mark.parametrize("workers", [0, 2])
def test_packing_and_grouping_get_the_sequence_minus_the_skipped(prepared_text: Path, workers: int) -> None:
    def skip_of(original):
        return [original[0][9], original[0][10], original[max(original)][17]]

    packed = lambda: get_savable_loader(_dataset(prepared_text, workers, batch_size=None, packing_buffer_size=6, task_encoder=PairPacker()))  # noqa: E731
    original, before, after, _ = _replay(packed, skip_of, before=3, total=24)
    _check_minus(original, before, after, set(skip_of(original)))
    grouped = lambda: get_savable_loader(_dataset(prepared_text, workers, batch_size=None, task_encoder=OneGroup()))  # noqa: E731
    original, before, after, replay = _replay(grouped, skip_of, before=3, total=16)
    _check_minus(original, before, after, set(skip_of(original)))
    assert replay.replay_skipped_samples >= 1


def test_unbatched_samples_are_skipped_too(prepared_text: Path) -> None:
    def skip_of(original):
        return [original[0][5]]

    original, before, after, _ = _replay(lambda: get_savable_loader(_dataset(prepared_text, 0, batch_size=None)), skip_of, before=2, total=12)
    _check_minus(original, before, after, set(skip_of(original)))


def test_the_environment_variable_names_a_file(prepared_text: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    original = _streams(_batches(get_savable_loader(_dataset(prepared_text, 0)), 6))
    skipped = original[0][3]
    path = tmp_path / "skips.json"
    path.write_text(json.dumps({"samples": [skipped, "no_such_key"], "ignore_unknown": True}))
    monkeypatch.setenv(SKIPS_ENV, str(path))
    loader = get_savable_loader(_dataset(prepared_text, 0))
    _check_minus(original, {}, _streams(_batches(loader, 5)), {skipped})
    path.write_text("[")
    with pytest.raises(ConfigError, match=SKIPS_ENV):
        get_savable_loader(_dataset(prepared_text, 0))


def test_checkpoint_info_shows_the_skip_list(prepared_text: Path, tmp_path: Path) -> None:
    loader = get_savable_loader(_dataset(prepared_text, 0))
    loader.restore_state_rank(None, skip_samples=["0001_000004"])
    _batches(loader, 2)
    (tmp_path / "state.json").write_text(json.dumps(loader.save_state_rank()))
    result = CliRunner().invoke(cli_main, ["checkpoint", "info", "--no-workers", str(tmp_path / "state.json")])
    assert result.exit_code == 0, result.output
    assert "Skip list: 1 sample(s)" in result.output and "data-0001.tar #4 of dataset 0" in result.output


def test_an_elastic_resume_keeps_and_takes_skip_lists(prepared_blend: Path) -> None:
    """Saved on 2 workers with a skip list, resumed on 0 workers with one more: both are skipped
    from then on, and the state saved after carries both."""
    first = get_savable_loader(_dataset(prepared_blend, 2, batch_size=3))
    first.restore_state_rank(None, skip_samples=["a0_001"])
    _batches(first, 4)
    states = first.save_state_global(0)
    resumed = get_savable_loader(_dataset(prepared_blend, 0, batch_size=3))
    resumed.restore_state_global(states, skip_samples=["b1_002"])
    assert {s.key for s in resumed.sample_skips.samples} == {"a0_001", "b1_002"}
    rest = [k for _, keys in _batches(resumed, 40) for k in keys]
    assert "a0_001" not in rest and "b1_002" not in rest
    assert resumed.save_state_rank()["sample_skips"]["samples"][1]["key"] == "b1_002"


@pytest.mark.parametrize("workers", [0, 2])
def test_an_exact_blend_keeps_its_draws(prepared_blend: Path, workers: int) -> None:
    """The exact schedule counts draws: the skipped sample was drawn, so every later draw (and
    with it the dataset of every later sample) is the original run's."""

    def skip_of(original):
        return [original[0][7], original[max(original)][9]]

    make = lambda: get_savable_loader(_dataset(prepared_blend, workers, batch_size=3, blend_mode="exact"))  # noqa: E731
    original, before, after, replay = _replay(make, skip_of, before=2, total=18)
    _check_minus(original, before, after, set(skip_of(original)))
    assert replay.replay_skipped_samples == 2
