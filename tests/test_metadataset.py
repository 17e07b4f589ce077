"""Blends end to end: metadataset YAML -> get_train_dataset / get_val_dataset -> loader."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path

import pytest
from energon_lite_dev.resume import check_loader_resume
from energon_lite_dev.synthetic import generate_text_dataset
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from megatron_energon_lite import (
    Blender,
    ConfigError,
    DatasetError,
    StateError,
    WorkerConfig,
    blend_report,
    get_loader,
    get_map_dataset,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
    get_val_datasets,
)
from megatron_energon_lite.energon.wrappers.blend_dataset import BlendDataset
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.format.weight_schedule import WeightSchedule
from megatron_energon_lite.pipeline import blend as blend_module

TEXT_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"
SIZES = {"A": 55, "B": 55, "C": 30}
HEADER = "__module__: megatron.energon\n__class__: MetadatasetV2\n"


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """Three text datasets whose keys start with their name (A: 5 shards x 11, ...)."""
    base = tmp_path_factory.mktemp("mds")
    for name, size in SIZES.items():
        shards = 5 if size % 5 == 0 and size > 30 else 3
        generate_text_dataset(base / name, num_shards=shards, samples_per_shard=size // shards, max_words=8, seed=ord(name), key_pattern=name + "{shard:02d}_{index:03d}")
        prepare_dataset(base / name, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=TEXT_YAML)
    return base


def write(root: Path, name: str, text: str) -> Path:
    path = root / name
    path.write_text(HEADER + text)
    return path


def config(workers: int = 0, rank: int = 0, world_size: int = 1) -> WorkerConfig:
    return WorkerConfig(rank=rank, world_size=world_size, num_workers=workers)


def train(path, workers: int = 0, **kwargs):
    settings = dict(worker_config=config(workers), batch_size=None, shuffle_buffer_size=None, max_samples_per_sequence=None)
    settings.update(kwargs)
    return get_train_dataset(path, **settings)


def keys(loader, n: int) -> list[str]:
    out: list[str] = []
    for item in loader:
        out.extend(item.__key__ if isinstance(item.__key__, list) else [item.__key__])
        if len(out) >= n:
            break
    return out[:n]


def blend_yaml(root: Path, weights=(6, 3, 1), extra: str = "") -> Path:
    entries = "".join(f"      - weight: {w}\n        path: ./{name}\n        split_part: train\n" for name, w in zip("ABC", weights))
    return write(root, f"blend_{'_'.join(map(str, weights))}{abs(hash(extra))}.yaml", f"splits:\n  train:\n{extra}    blend:\n{entries}")


@pytest.mark.parametrize("workers", [0, 2])
def test_random_blend_lands_within_3_percent(root: Path, workers: int) -> None:
    """Per-sample draws: each count is binomial, so allow 4 standard deviations (C: +-120 of
    1000; Energon observed 955), which is inside 3% of the 10,000 samples."""
    got = Counter(k[0] for k in keys(get_loader(train(blend_yaml(root), workers)), 10_000))
    for name, share in zip("ABC", (0.6, 0.3, 0.1)):
        assert abs(got[name] - share * 10_000) <= 4 * (10_000 * share * (1 - share)) ** 0.5, got


@pytest.mark.parametrize(("workers", "batch_size"), [(0, None), (2, None), (2, 4), (0, 5)])
def test_exact_blend_is_within_one_at_every_prefix(root: Path, workers: int, batch_size) -> None:
    loader = get_loader(train(blend_yaml(root, extra="    blend_mode: exact\n"), workers, batch_size=batch_size))
    counts = Counter()
    for n, key in enumerate(keys(loader, 3000), start=1):
        counts[key[0]] += 1
        for name, weight in zip("ABC", (0.6, 0.3, 0.1)):
            assert abs(counts[name] - weight * n) < 1, (n, counts)


def test_exact_blend_with_a_shuffle_buffer_still_holds_the_totals(root: Path) -> None:
    """The buffer reorders inside a window; counts stay within the buffer size of the weights."""
    loader = get_loader(train(blend_yaml(root), 2, blend_mode="exact", shuffle_buffer_size=20))
    got = Counter(k[0] for k in keys(loader, 2000))
    for name, weight in zip("ABC", (0.6, 0.3, 0.1)):
        assert abs(got[name] - weight * 2000) <= 2 * 20


def test_blend_mode_from_python_and_yaml_must_agree(root: Path) -> None:
    path = blend_yaml(root, extra="    blend_mode: exact\n")
    with pytest.raises(ConfigError, match="blend_mode differs"):
        train(path, blend_mode="random")
    assert train(path, blend_mode="exact").config()["blend_mode"] == "exact"


def test_epochized_blend_matches_energons_numbers(root: Path) -> None:
    """Energon 7.4.1, observed: A x2 + B x0.5 (55 samples each, 2 workers) -> 137 per pass,
    every A key exactly twice and 27 distinct B keys once; the next pass again 137."""
    path = write(root, "epochized.yaml", "splits:\n  train:\n    blend_epochized:\n      - repetitions: 2\n        path: ./A\n      - repetitions: 0.5\n        path: ./B\n")
    ds = train(path, 2, repeat=False)
    assert len(ds) == 137
    loader = get_loader(ds)
    for _ in range(2):
        got = Counter(sample.__key__ for sample in loader)
        a = {k: v for k, v in got.items() if k[0] == "A"}
        b = {k: v for k, v in got.items() if k[0] == "B"}
        assert len(a) == 55 and set(a.values()) == {2}
        assert len(b) == 27 and set(b.values()) == {1}


@pytest.mark.parametrize("mode", ["random", "exact"])
def test_epochized_blend_repeats_pass_after_pass(root: Path, mode: str) -> None:
    path = write(root, f"epochized_{mode}.yaml", "splits:\n  train:\n    blend_epochized:\n      - repetitions: 1\n        path: ./A\n      - repetitions: 1\n        path: ./C\n")
    loader = get_loader(train(path, 0, blend_mode=mode))
    stream = keys(loader, 3 * 85)
    for p in range(3):
        assert sorted(stream[p * 85 : (p + 1) * 85]) == sorted(stream[:85])
        assert len(set(stream[p * 85 : (p + 1) * 85])) == 85


def test_subset_selects_energons_sample_range(root: Path) -> None:
    """Energon, observed: subset [80%, 100%] of 55 samples reads samples 44..54."""
    path = write(root, "subset.yaml", "splits:\n  train:\n    path: ./A\n    subset: {range: [80%, 100%]}\n")
    got = {s.__key__ for s in get_loader(train(path, 0, repeat=False))}
    all_keys = [s.__key__ for s in get_loader(get_val_dataset(root / "A", split_part="train", worker_config=config(), batch_size=None))]
    assert got == set(all_keys[44:55])


def test_nested_subsets_compose_and_absolute_ranges_apply_first(root: Path) -> None:
    all_keys = [s.__key__ for s in get_loader(get_val_dataset(root / "A", split_part="train", worker_config=config(), batch_size=None))]
    inner = write(root, "inner_subset.yaml", "splits:\n  train:\n    path: ./A\n    subset: {range: [10, 50]}\n")
    outer = write(root, "outer_subset.yaml", f"splits:\n  train:\n    blend:\n      - path: {inner.name}\n        subset: {{range: [25%, 75%]}}\n")
    ds = get_val_dataset(outer, split_part="train", worker_config=config(), batch_size=None)
    got = [s.__key__ for s in get_loader(ds)]
    assert got == all_keys[10 + 10 : 10 + 30]  # 40 samples left by [10, 50); 25%..75% of them


def test_subflavors_outer_override_inner(root: Path) -> None:
    inner = write(root, "inner_flavors.yaml", "splits:\n  train:\n    path: ./C\n    subflavors: {source: inner, keep: yes}\n")
    outer = write(root, "outer_flavors.yaml", f"splits:\n  train:\n    blend:\n      - path: {inner.name}\n        subflavors: {{source: outer}}\n      - path: ./A\n")
    flavors = {s.__key__[0]: s.__subflavors__ for s in keys_samples(get_loader(train(outer, 0)), 200)}
    assert flavors["C"] == {"source": "outer", "keep": True}
    assert flavors["A"] in ({}, None)


def keys_samples(loader, n: int) -> list:
    out = []
    for sample in loader:
        out.append(sample)
        if len(out) >= n:
            return out
    return out


def test_nested_weights_multiply(root: Path) -> None:
    inner = write(root, "inner_weights.yaml", "splits:\n  train:\n    blend:\n      - {weight: 1, path: ./B}\n      - {weight: 3, path: ./C}\n")
    outer = write(root, "outer_weights.yaml", f"splits:\n  train:\n    blend:\n      - {{weight: 1, path: ./A}}\n      - {{weight: 1, path: {inner.name}}}\n")
    ds = train(outer, 0, blend_mode="exact")
    shares = {d["path"][-1]: d["target_share"] for d in ds.config()["datasets"]}
    assert shares == {"A": 0.5, "B": 0.125, "C": 0.375}
    got = Counter(k[0] for k in keys(get_loader(ds), 800))
    assert got == {"A": 400, "B": 100, "C": 300}


def test_legacy_v1_format(root: Path) -> None:
    path = root / "v1.yaml"
    path.write_text("__module__: megatron.energon\nsplits:\n  train:\n    datasets:\n      - {weight: 3, path: ./A, split_part: train, subflavor: legacy}\n      - {weight: 1, path: ./C, split_part: train}\n")
    samples = keys_samples(get_loader(train(path, 0, blend_mode="exact")), 400)
    assert Counter(s.__key__[0] for s in samples) == {"A": 300, "C": 100}
    assert next(s for s in samples if s.__key__[0] == "A").__subflavors__ == {"__subflavor__": "legacy"}


def test_val_concatenates_in_yaml_order_without_weights(root: Path) -> None:
    path = write(root, "val.yaml", "splits:\n  val:\n    blend:\n      - {weight: 9, path: ./C, split_part: train}\n      - {weight: 1, path: ./A, split_part: train}\n")
    got = [s.__key__ for s in get_loader(get_val_dataset(path, worker_config=config(), batch_size=None))]
    assert len(got) == 85 and [k[0] for k in got] == ["C"] * 30 + ["A"] * 55
    entries = get_val_datasets(path, worker_config=config(), batch_size=5)
    assert [(Path(str(factory.path)).name, len(ds)) for ds, factory in entries] == [("C", 6), ("A", 11)]


def test_blender_equals_the_yaml(root: Path) -> None:
    yaml_keys = keys(get_loader(train(blend_yaml(root), 0)), 300)
    blender = Blender([(root / "A", 6), (root / "B", 3), (root / "C", 1)], split_part="train")
    assert keys(get_loader(train(blender, 0)), 300) == yaml_keys


def test_a_dict_works_like_a_file(root: Path) -> None:
    import yaml

    text = HEADER + f"splits:\n  train:\n    blend:\n      - {{weight: 2, path: {root / 'A'}}}\n      - {{weight: 1, path: {root / 'C'}}}\n"
    assert keys(get_loader(train(yaml.safe_load(text), 0)), 99)[:99] == keys(get_loader(train(write(root, "as_file.yaml", text[len(HEADER):]), 0)), 99)


def test_two_entries_of_one_dataset_read_in_different_orders(root: Path) -> None:
    """Energon gives both entries the same order (en#266); here each has its own seed."""
    path = write(root, "twice.yaml", "splits:\n  train:\n    blend:\n      - {weight: 1, path: ./A}\n      - {weight: 1, path: ./A}\n")
    samples = keys_samples(get_loader(train(path, 0, max_samples_per_sequence=2)), 200)
    by_entry = [[s.__key__ for s in samples if s.__restore_key__[3] == i] for i in (0, 1)]
    assert by_entry[0][:20] != by_entry[1][:20]


# --- state ---------------------------------------------------------------------------------


def _resume_everywhere(make, steps: int, at=None) -> None:
    """From the state after every step in ``at`` (default: every step), a fresh loader goes on exactly."""
    check_loader_resume(lambda: get_savable_loader(make()), steps, at=at)


@pytest.mark.parametrize("mode", ["random", "exact"])
def test_resume_inside_a_blend_at_every_step(root: Path, mode: str) -> None:
    path = blend_yaml(root)
    _resume_everywhere(lambda: train(path, 0, blend_mode=mode, batch_size=3, shuffle_buffer_size=7, max_samples_per_sequence=4), 40)


@pytest.mark.parametrize("mode", ["random", "exact"])
def test_resume_inside_and_across_epochized_passes(root: Path, mode: str) -> None:
    path = write(root, f"epochized_state_{mode}.yaml", "splits:\n  train:\n    blend_epochized:\n      - repetitions: 2\n        path: ./C\n      - repetitions: 0.5\n        path: ./B\n")
    # 60 + 27 = 87 samples per pass, batches of 4 (the last of a pass has 3): 22 per pass.
    _resume_everywhere(lambda: train(path, 0, blend_mode=mode, batch_size=4, shuffle_buffer_size=5), 50)


@pytest.mark.parametrize("mode", ["random", "exact"])
def test_resume_with_two_workers(root: Path, mode: str) -> None:
    path = blend_yaml(root)
    _resume_everywhere(lambda: train(path, 2, blend_mode=mode, batch_size=3, shuffle_buffer_size=7, max_samples_per_sequence=4), 30, (0, 1, 2, 7, 18, 29))


def test_epochized_resume_with_two_workers_across_the_pass_end(root: Path) -> None:
    path = write(root, "epochized_workers.yaml", "splits:\n  train:\n    blend_epochized:\n      - repetitions: 1\n        path: ./C\n      - repetitions: 0.5\n        path: ./A\n")
    _resume_everywhere(lambda: train(path, 2, batch_size=4), 30, (0, 5, 13, 14, 15, 29))


def test_blend_state_is_refused_by_another_blend(root: Path) -> None:
    loader = get_savable_loader(train(blend_yaml(root), 0))
    next(iter(loader))
    other = get_savable_loader(train(blend_yaml(root, weights=(1, 1, 1)), 0))
    with pytest.raises(Exception, match="weight"):
        other.restore_state_rank(loader.save_state_rank())


# --- reports -------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_blend_report_counts_consumed_samples_from_the_state(root: Path, workers: int) -> None:
    loader = get_savable_loader(train(blend_yaml(root), workers, batch_size=4, shuffle_buffer_size=16))
    seen = Counter()
    for _, batch in zip(range(25), loader):
        seen.update(k[0] for k in batch.__key__)
    report = loader.blend_report()
    assert [Path(r["path"]).name for r in report] == ["A", "B", "C"]
    assert [r["samples"] for r in report] == [seen["A"], seen["B"], seen["C"]]
    assert [round(r["target_share"], 9) for r in report] == [0.6, 0.3, 0.1]
    assert sum(r["share"] for r in report) == pytest.approx(1.0)
    # The same report from a saved, serialised state (a checkpoint), as a one-rank global list.
    state = json.loads(json.dumps(loader.save_state_rank()))
    assert blend_report([state]) == report


def test_blend_report_needs_a_blend(root: Path) -> None:
    loader = get_savable_loader(train(root / "A", 0))
    with pytest.raises(ConfigError, match="no blend"):
        loader.blend_report()


# --- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "error", "message"),
    [
        ("    blend:\n      - {weight: -1, path: ./A}\n", ConfigError, r"splits\.train\.blend\[0\]\.weight"),
        ("    blend:\n      - {weight: 0, path: ./A}\n      - {weight: 0, path: ./B}\n", ConfigError, "all blend weights are zero"),
        ("    path: ./A\n    split: train\n", ConfigError, "split_part"),
        ("    path: ./nope\n", DatasetError, "does not exist"),
        ("    blend:\n      - {weight: 1, path: ./A, subset: {range: [10, 99]}}\n", ConfigError, r"subset\.range"),
        ("    blend:\n      - {weight: 1, path: ./A}\n    blend_mode: greedy\n", ConfigError, "blend mode"),
    ],
)
def test_bad_yaml_is_named_by_file_and_key_path(root: Path, body: str, error, message: str) -> None:
    path = write(root, "bad.yaml", "splits:\n  train:\n" + body)
    with pytest.raises(error, match=message) as info:
        train(path, 0)
    assert "bad.yaml" in str(info.value)


def test_unprepared_dataset_says_how_to_prepare(root: Path) -> None:
    (root / "raw").mkdir(exist_ok=True)
    path = write(root, "raw.yaml", "splits:\n  train:\n    path: ./raw\n")
    with pytest.raises(DatasetError, match="energon-lite prepare"):
        train(path, 0)


def test_weighted_blend_cannot_stop_after_one_pass(root: Path) -> None:
    with pytest.raises(ConfigError, match="repeat=False"):
        train(blend_yaml(root), 0, repeat=False)


def test_zero_weight_entries_are_left_out_with_a_warning(root: Path, caplog) -> None:
    path = blend_yaml(root, weights=(1, 0, 1))
    with caplog.at_level("WARNING"):
        ds = train(path, 0)
    assert "weight 0" in caplog.text
    assert {k[0] for k in keys(get_loader(ds), 200)} == {"A", "C"}


def test_circular_references_are_named(root: Path) -> None:
    write(root, "loop_a.yaml", "splits:\n  train:\n    blend:\n      - {weight: 1, path: ./loop_b.yaml}\n")
    write(root, "loop_b.yaml", "splits:\n  train:\n    blend:\n      - {weight: 1, path: ./A}\n      - {weight: 1, path: ./loop_a.yaml}\n")
    with pytest.raises(ConfigError, match=r"circular.*\n.*loop_b.yaml: splits.train.blend\[1\].path\n.*loop_a.yaml -> .*loop_b.yaml -> .*loop_a.yaml"):
        train(root / "loop_a.yaml", 0)


def test_blend_and_blend_epochized_cannot_mix(root: Path) -> None:
    inner = write(root, "inner_epochized.yaml", "splits:\n  train:\n    blend_epochized:\n      - {repetitions: 1, path: ./A}\n")
    outer = write(root, "outer_mixed.yaml", f"splits:\n  train:\n    blend:\n      - {{weight: 1, path: ./B}}\n      - {{weight: 1, path: {inner.name}}}\n")
    with pytest.raises(ConfigError, match=r"mixed in one tree\n.*outer_mixed.yaml: splits.train.blend\[1\]"):
        train(outer, 0)


def test_absolute_subsets_only_on_datasets(root: Path) -> None:
    inner = write(root, "inner_plain.yaml", "splits:\n  train:\n    path: ./A\n")
    outer = write(root, "outer_absolute.yaml", f"splits:\n  train:\n    blend:\n      - {{path: {inner.name}, subset: {{range: [0, 10]}}}}\n")
    with pytest.raises(ConfigError, match="only allowed for a leaf dataset"):
        train(outer, 0)


def test_unknown_split_lists_the_splits(root: Path) -> None:
    with pytest.raises(ConfigError, match="no split 'val'.*\n.*\n.*'train'"):
        get_val_dataset(blend_yaml(root), worker_config=config(), batch_size=None)


def test_jsonl_leaf_with_a_cooker_blends_with_a_dataset(root: Path) -> None:
    from energon_lite_dev.synthetic import write_jsonl

    from megatron_energon_lite import (
        Cooker,
        DefaultTaskEncoder,
        TextSample,
        basic_sample_keys,
        stateless,
    )
    from megatron_energon_lite.format.jsonl import write_jsonl_index

    write_jsonl(root / "records.jsonl", [{"text": f"record {i}"} for i in range(12)])
    write_jsonl_index(root / "records.jsonl")

    @stateless
    def cook(crude: dict) -> TextSample:
        return TextSample(**basic_sample_keys(crude), text=crude["json"]["text"])

    class Encoder(DefaultTaskEncoder):
        cookers = [Cooker(cook, has_subflavors={"kind": "records"})]

    path = write(root, "jsonl_blend.yaml", "splits:\n  train:\n    blend:\n      - {weight: 1, path: ./C}\n      - {weight: 1, path: ./records.jsonl, subflavors: {kind: records}}\n")
    samples = keys_samples(get_loader(train(path, 0, blend_mode="exact", task_encoder=Encoder())), 48)
    # Exact 1:1 over 48 samples: 24 records, two full passes over the 12 records.
    assert Counter(s.text for s in samples if s.text.startswith("record")) == {f"record {i}": 2 for i in range(12)}


def test_unprepared_jsonl_says_how_to_prepare(root: Path) -> None:
    from energon_lite_dev.synthetic import write_jsonl

    write_jsonl(root / "raw.jsonl", [{"text": "x"}])
    path = write(root, "raw_jsonl.yaml", "splits:\n  train:\n    path: ./raw.jsonl\n")
    with pytest.raises(DatasetError, match=r"never prepared(.|\n)*energon-lite prepare"):
        train(path, 0)


def test_exact_blend_warns_when_weights_need_stepping(root: Path, caplog) -> None:
    path = write(root, "big_period.yaml", "splits:\n  train:\n    blend_mode: exact\n    blend:\n      - {weight: 1234567, path: ./A}\n      - {weight: 7654321, path: ./B}\n")
    with caplog.at_level("WARNING"):
        train(path, 2)
    assert "schedule period of 8888888 positions" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        train(blend_yaml(root, extra="    blend_mode: exact\n"), 2)
    assert "schedule period" not in caplog.text



def test_exact_scheduled_blend_warns_of_its_cost_on_several_workers(root: Path, caplog) -> None:
    path = schedule_yaml(root, "{linear: {0: 1, 300: 0}}", "1", extra="    blend_mode: exact\n")
    with caplog.at_level("WARNING"):
        train(path, 0)
    assert "weight schedules" not in caplog.text
    with caplog.at_level("WARNING"):
        train(path, 2)
    assert "exact blend with weight schedules" in caplog.text and "about 2 positions per sample" in caplog.text and "use blend_mode random" in caplog.text


def test_shuffle_over_epochs_multipliers_none_and_minus_one_combine_as_energon(root: Path) -> None:
    """None (no shuffling) wins over every level, then -1 (with replacement), else the product."""
    from megatron_energon_lite.format.metadataset import load_blend_plan

    inner = write(root, "inner_multipliers.yaml", "splits:\n  train:\n    blend:\n      - {weight: 1, path: ./A, shuffle_over_epochs_multiplier: 2}\n      - {weight: 1, path: ./B, shuffle_over_epochs_multiplier: -1}\n      - {weight: 1, path: ./C, shuffle_over_epochs_multiplier: null}\n")
    cases = {"3": [6, -1, None], "-1": [-1, -1, None], "null": [None, None, None]}
    for outer, expected in cases.items():
        path = write(root, f"outer_multipliers_{outer}.yaml", f"splits:\n  train:\n    path: ./inner_multipliers.yaml\n    shuffle_over_epochs_multiplier: {outer}\n")
        assert [leaf.shuffle_over_epochs_multiplier for leaf in load_blend_plan(path, "train", training=True).leaves] == expected, outer
    assert inner.exists()
    with pytest.raises(ConfigError, match=r"shuffle_over_epochs_multiplier(.|\n)*-1 \(slices drawn with replacement"):
        load_blend_plan(write(root, "bad_multiplier.yaml", "splits:\n  train:\n    path: ./A\n    shuffle_over_epochs_multiplier: 0\n"), "train", training=True)


# --- weight schedules (issue 40) ------------------------------------------------------------


def schedule_yaml(root: Path, a: str, b: str, extra: str = "") -> Path:
    text = f"splits:\n  train:\n{extra}    blend:\n      - weight: {a}\n        path: ./A\n      - weight: {b}\n        path: ./B\n"
    return write(root, f"schedule_{abs(hash((a, b, extra)))}.yaml", text)


SWITCH = 60  # global samples of A only, then B only
SWITCHING = ("{step: {0: 1, %d: 0}}" % SWITCH, "{step: {0: 0, %d: 1}}" % SWITCH)


@pytest.mark.parametrize(("workers", "batch_size"), [(0, None), (2, 4), (2, 7)])
def test_a_step_schedule_switches_at_the_global_sample_count(root: Path, workers: int, batch_size) -> None:
    """The clock is the global stream position (all workers), not any one worker's count."""
    loader = get_loader(train(schedule_yaml(root, *SWITCHING), workers, batch_size=batch_size))
    got = "".join(key[0] for key in keys(loader, 2 * SWITCH))
    assert got == "A" * SWITCH + "B" * SWITCH


def test_a_linear_schedule_moves_the_share(root: Path) -> None:
    """A's weight falls linearly 1 -> 0 over 2,000 samples against B's constant 1: A's expected
    count in [0, 1000) is sum(w / (w + 1)), about 426, and in [1000, 2000) about 261."""
    loader = get_loader(train(schedule_yaml(root, "{linear: {0: 1, 2000: 0}}", "1"), 2, batch_size=4))
    got = [key[0] for key in keys(loader, 2400)]
    for start, stop in ((0, 1000), (1000, 2000), (2000, 2400)):
        weights = [max(0.0, 1 - t / 2000) for t in range(start, stop)]
        expected = sum(w / (w + 1) for w in weights)
        spread = 4 * sum(w / (w + 1) * (1 - w / (w + 1)) for w in weights) ** 0.5 + 1
        assert abs(got[start:stop].count("A") - expected) <= spread, (start, got[start:stop].count("A"), expected)


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_inside_a_scheduled_blend_at_every_step(root: Path, workers: int) -> None:
    path = schedule_yaml(root, "{cosine: {0: 3, 40: 0.5, 80: 2}}", "{step: {0: 1, 30: 2}}")
    _resume_everywhere(lambda: train(path, workers, batch_size=3, shuffle_buffer_size=5, max_samples_per_sequence=4), 40, None if workers == 0 else (0, 1, 9, 10, 21, 39))


@pytest.mark.parametrize("mode", ["random", "exact"])
@pytest.mark.parametrize(("old", "new"), [((2, 1), (1, 0)), ((2, 1), (1, 2)), ((2, 2), (4, 1))])
def test_an_elastic_restore_keeps_the_schedules_clock(root: Path, old, new, mode: str) -> None:
    """Saved on ranks x workers ``old`` after 3 steps of batch 2, restored on ``new`` (also with as
    many global workers, whose positions in the global stream differ: (2, 2) -> (4, 1)): the
    switch still comes at global sample SWITCH.  Ranks run in lock step, so the global stream
    is their batches step by step, rank by rank."""
    path = schedule_yaml(root, *SWITCHING)

    def loaders(world: int, workers: int) -> list:
        return [get_savable_loader(get_train_dataset(path, worker_config=config(workers, rank, world), batch_size=2, shuffle_buffer_size=None, max_samples_per_sequence=None, blend_mode=mode)) for rank in range(world)]

    def stream(ranks: list, steps: int) -> list[str]:
        iterators = [iter(loader) for loader in ranks]
        return [key for _ in range(steps) for it in iterators for key in next(it).__key__]

    saving = loaders(*old)
    before = stream(saving, 3)
    states = [loader.save_state_rank() for loader in saving]
    restored = loaders(*new)
    for loader in restored:
        loader.restore_state_global(states)
    after = stream(restored, SWITCH // new[0])
    assert "".join(k[0] for k in before + after)[: 2 * SWITCH] == "A" * SWITCH + "B" * SWITCH


def test_a_state_saved_under_another_schedule_is_refused(root: Path) -> None:
    loader = get_savable_loader(train(schedule_yaml(root, *SWITCHING), 0))
    next(iter(loader))
    other = get_savable_loader(train(schedule_yaml(root, "{step: {0: 1, 61: 0}}", SWITCHING[1]), 0))
    with pytest.raises(StateError, match="(?s)weights or datasets changed since the state was saved.*A \\(split train\\): share 1.0 x schedule.*61.*allow_weight_edit=True"):
        other.restore_state_rank(loader.save_state_rank())


@pytest.mark.parametrize("mode", ["random", "exact"])
def test_a_schedule_edited_at_resume_goes_on_from_the_saved_clock(root: Path, mode: str) -> None:
    """Saved at global sample 10 of a switch at 60, restored into a switch at 30: 20 more of
    A, then B (the clock is the saved one; exact mode's new schedule starts at the restore)."""
    extra = f"    blend_mode: {mode}\n"
    loader = get_savable_loader(train(schedule_yaml(root, *SWITCHING, extra=extra), 0))
    assert "".join(k[0] for k in keys(loader, 10)) == "A" * 10
    edited = get_savable_loader(train(schedule_yaml(root, "{step: {0: 1, 30: 0}}", "{step: {0: 0, 30: 1}}", extra=extra), 0))
    edited.restore_state_rank(loader.save_state_rank(), allow_weight_edit=True)
    assert "".join(k[0] for k in keys(edited, 60)) == "A" * 20 + "B" * 40


def test_constant_weights_keep_their_fingerprint(root: Path) -> None:
    config_text = json.dumps(train(blend_yaml(root), 0).config())
    assert "schedule" not in config_text


def test_schedules_refuse_cost_blends_with_the_reason(root: Path) -> None:
    path = schedule_yaml(root, *SWITCHING, extra="    blend_mode: cost\n")
    with pytest.raises(ConfigError, match=r"(?s)not supported with blend_mode cost.*blend\[0\].*fix: ") as info:
        train(path, 0)
    assert path.name in str(info.value)


@pytest.mark.parametrize(("workers", "batch_size"), [(0, None), (2, 4), (2, 3)])
def test_exact_scheduled_blend_is_within_one_of_the_integral_at_every_prefix(root: Path, workers: int, batch_size) -> None:
    """A's weight falls 1 -> 0 (linear over 300 samples), B's is 1: at every prefix of the global
    stream, A's count is within one sample of the sum of its shares w / (w + 1) so far."""
    path = schedule_yaml(root, "{linear: {0: 1, 300: 0}}", "1", extra="    blend_mode: exact\n")
    got = keys(get_loader(train(path, workers, batch_size=batch_size)), 400)
    count, target = 0, 0.0
    for position, key in enumerate(got):
        weight = max(0.0, 1 - position / 300)
        target += weight / (weight + 1)
        count += key[0] == "A"
        assert abs(count - target) < 1, (position, count, target)


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_inside_an_exact_scheduled_blend_at_every_step(root: Path, workers: int) -> None:
    path = schedule_yaml(root, "{cosine: {0: 3, 40: 0.5, 80: 2}}", "{step: {0: 1, 30: 2}}", extra="    blend_mode: exact\n")
    _resume_everywhere(lambda: train(path, workers, batch_size=3, shuffle_buffer_size=5, max_samples_per_sequence=4), 40, None if workers == 0 else (0, 1, 9, 10, 21, 39))


def test_schedule_nested_in_constant_weights(root: Path) -> None:
    """An inner schedule (A then B) under an outer constant 1:1 with C: C keeps half throughout."""
    inner = schedule_yaml(root, *SWITCHING)
    outer = write(root, "schedule_outer.yaml", f"splits:\n  train:\n    blend:\n      - weight: 1\n        path: ./{inner.name}\n      - weight: 1\n        path: ./C\n")
    got = [key[0] for key in keys(get_loader(train(outer, 0)), 4 * SWITCH)]
    first, second = got[:SWITCH], got[2 * SWITCH :]  # the switch is at global sample SWITCH
    assert set(first) == {"A", "C"} and set(second) == {"B", "C"}


def test_blend_report_target_of_a_scheduled_entry_is_its_share_at_the_start(root: Path) -> None:
    loader = get_savable_loader(train(schedule_yaml(root, "{linear: {0: 3, 100: 0}}", "1"), 0))
    next(iter(loader))
    assert [row["target_share"] for row in loader.blend_report()] == [0.75, 0.25]


def _ramp_share(clock: int) -> float:
    """A's share under A = linear 3 -> 0 over 100 samples, B = 1."""
    weight = max(0.0, 3 * (1 - clock / 100))
    return weight / (weight + 1)


def test_blend_report_compares_the_realized_share_with_the_schedule_so_far(root: Path) -> None:
    """After 40 samples of an exact blend the clock is 40, the target now is the share at 40 and
    the target so far is the mean share over clocks 0..39, which the realized share meets to
    within one sample."""
    loader = get_savable_loader(train(schedule_yaml(root, "{linear: {0: 3, 100: 0}}", "1", extra="    blend_mode: exact\n"), 0))
    it = iter(loader)
    for _ in range(40):
        next(it)
    rows = loader.blend_report()
    so_far = sum(_ramp_share(t) for t in range(40)) / 40
    assert [row["clock"] for row in rows] == [40, 40]
    assert [row["target_share_now"] for row in rows] == pytest.approx([_ramp_share(40), 1 - _ramp_share(40)])
    assert [row["target_share_so_far"] for row in rows] == pytest.approx([so_far, 1 - so_far])
    assert abs(rows[0]["samples"] - 40 * so_far) < 1


def test_blend_report_clock_counts_every_ranks_samples(root: Path) -> None:
    """Two ranks x two workers, batch 2, three steps each: the global stream holds 12 samples,
    so the next blended sample is at clock 12 (from both ranks' states; a constant blend's
    targets are its weights)."""
    path = schedule_yaml(root, *SWITCHING)
    ranks = [get_savable_loader(get_train_dataset(path, worker_config=config(2, rank, 2), batch_size=2, shuffle_buffer_size=None, max_samples_per_sequence=None)) for rank in range(2)]
    iterators = [iter(loader) for loader in ranks]
    for _ in range(3):
        for it in iterators:
            next(it)
    rows = blend_report([loader.save_state_rank() for loader in ranks])
    assert [row["clock"] for row in rows] == [12, 12]
    assert [row["samples"] for row in rows] == [12, 0]
    assert [row["target_share_so_far"] for row in rows] == [1.0, 0.0]
    constant = get_savable_loader(train(blend_yaml(root), 0))
    next(iter(constant))
    assert all(row["target_share_now"] == row["target_share_so_far"] == row["target_share"] for row in constant.blend_report())


def test_an_exact_elastic_restore_before_a_dataset_starts(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """B's weight is 0 until global sample 300: over the window where rates are measured (made
    64 positions here) no new worker takes B, so B's epoch is shared evenly; after 300 every B
    sample still comes."""
    monkeypatch.setattr(blend_module, "SCHEDULED_RATE_WINDOW", 64)
    path = schedule_yaml(root, "1", "{step: {0: 0, 300: 1}}", extra="    blend_mode: exact\n")

    def loaders(world: int, workers: int) -> list:
        return [get_savable_loader(get_train_dataset(path, worker_config=config(workers, rank, world), batch_size=2, shuffle_buffer_size=None, max_samples_per_sequence=None)) for rank in range(world)]

    saving = loaders(2, 2)
    iterators = [iter(loader) for loader in saving]
    before = [key for _ in range(3) for it in iterators for key in next(it).__key__]
    states = [loader.save_state_rank() for loader in saving]
    restored = loaders(4, 1)
    for loader in restored:
        loader.restore_state_global(states)
    iterators = [iter(loader) for loader in restored]
    after = [key for _ in range(60) for it in iterators for key in next(it).__key__]  # to sample 492
    stream = before + after
    assert all(key[0] == "A" for key in stream[:300])
    assert sorted({key for key in stream if key[0] == "B"}) == sorted(k for k in keys(get_loader(train(write(root, "only_b.yaml", "splits:\n  train:\n    path: ./B\n"), 0)), 55))


_point_tables = st.dictionaries(st.integers(0, 150), st.sampled_from([0, 1, 2, 7]), min_size=1, max_size=3)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    st.tuples(st.sampled_from(["step", "linear", "cosine"]), _point_tables),
    st.tuples(st.sampled_from(["step", "linear", "cosine"]), _point_tables),
    st.sampled_from([(0, None), (2, 3)]),
)
def test_exact_scheduled_loader_holds_random_schedules_within_one(root: Path, a, b, topology) -> None:
    """The loader's global stream (0 or 2 workers) against the integral of A's scheduled share."""
    schedules = [WeightSchedule(kind, tuple((x, float(w)) for x, w in sorted(points.items()))) for kind, points in (a, b)]
    assume(all(sum(s.at(t) for s in schedules) > 0 for t in range(200)))
    spell = ["{%s: {%s}}" % (kind, ", ".join(f"{x}: {w}" for x, w in sorted(points.items()))) for kind, points in (a, b)]
    path = schedule_yaml(root, *spell, extra="    blend_mode: exact\n")
    workers, batch_size = topology
    count, target = 0, 0.0
    for position, key in enumerate(keys(get_loader(train(path, workers, batch_size=batch_size)), 200)):
        wa, wb = (s.at(position) for s in schedules)
        target += wa / (wa + wb)
        count += key[0] == "A"
        assert abs(count - target) < 1, (spell, position, count, target)


def test_a_map_view_refuses_a_weight_schedule(root: Path) -> None:
    """Its order is fixed up front from constant weights: a schedule would be silently ignored."""
    from_yaml = schedule_yaml(root, *SWITCHING)
    with pytest.raises(ConfigError, match=r"(?s)map view cannot follow a weight schedule.*blend\[0\]"):
        len(get_map_dataset(from_yaml))


@pytest.mark.parametrize("mode", ["random", "exact"])
def test_a_schedule_switches_at_its_point_after_two_elastic_restores(root: Path, mode: str) -> None:
    """2 ranks, then 3, then 1 (each an elastic restore): the clock goes on from the samples
    delivered, counted once (a second restore counted the first one's position once per saved
    worker, and the switch came early)."""
    path = schedule_yaml(root, *SWITCHING, extra=f"    blend_mode: {mode}\n")

    def loaders(world: int):
        return [get_savable_loader(train(path, worker_config=WorkerConfig(rank=rank, world_size=world, num_workers=0))) for rank in range(world)]

    stream: list[str] = []
    running = loaders(2)
    for world, steps in ((3, 8), (1, 5)):
        iterators = [iter(loader) for loader in running]
        for _ in range(steps):
            stream += [next(it).__key__[0] for it in iterators]
        states = [loader.save_state_rank() for loader in running]
        running = loaders(world)
        for loader in running:
            loader.restore_state_global(states)
    (it,) = [iter(loader) for loader in running]
    stream += [next(it).__key__[0] for _ in range(2 * SWITCH - len(stream))]
    assert "".join(stream) == "A" * SWITCH + "B" * SWITCH


def test_walking_dataset_reaches_the_blend_and_each_datasets_worker_slices(root: Path) -> None:
    """Code written for Energon walks ``.dataset`` from what get_train_dataset returns to its
    BlendDataset, reads ``dataset_weights`` and, two levels below each input, the sample loader's
    ``workers_slice_offsets`` and ``len()``: here they describe this rank's sharding, with
    ``[start]`` for a worker without samples (C: 30 samples on 2 x 20 workers)."""
    path = blend_yaml(root, (6, 3, 1))
    ranges: dict[tuple[int, int], tuple[int, int]] = {}
    for rank in range(2):
        stage = get_train_dataset(path, worker_config=config(20, rank, 2), batch_size=1, shuffle_buffer_size=None, max_samples_per_sequence=1)
        while not isinstance(stage, BlendDataset):
            stage = stage.dataset
        assert [weight for _, weight in stage.dataset_weights] == pytest.approx([0.6, 0.3, 0.1])
        for k, (dataset, _) in enumerate(stage.dataset_weights):
            loader = dataset.dataset.dataset
            offsets = loader.workers_slice_offsets
            assert len(offsets) == 20 and len(loader) == sum(o[-1] - o[0] for o in offsets) == sum(dataset.worker_length(w) for w in range(20))
            for worker, bounds in enumerate(offsets):
                assert bounds == list(range(bounds[0], bounds[-1] + 1))  # max_samples_per_sequence=1: one sample per slice
                ranges[(k, rank * 20 + worker)] = (bounds[0], bounds[-1])
    for k, size in enumerate(SIZES.values()):
        # The 40 global workers' ranges tile the dataset in worker order; C's leave 10 workers empty.
        got = [ranges[(k, w)] for w in range(40)]
        assert got[0][0] == 0 and got[-1][1] == size and all(a[1] == b[0] for a, b in zip(got, got[1:]))
        assert sum(a == b for a, b in got) == (10 if size == 30 else 0)
