"""Impossible values in a saved state are refused on restore with a ``StateError`` that names the
field by its JSON path, what was expected and what was found, instead of restoring silently into
a wrong position or failing later with a bare ``IndexError`` / ``TypeError``.

The states are real ones (saved by a loader or a stage) with one value changed.
"""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path
from typing import Any, Callable

import pytest
from energon_lite_dev.synthetic import generate_captioning_dataset

from megatron_energon_lite import WorkerConfig, get_savable_loader, get_train_dataset
from megatron_energon_lite.errors import StateError
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.pipeline.batch import BatchNode
from megatron_energon_lite.pipeline.blend import BlendNode
from megatron_energon_lite.pipeline.concat import ConcatNode
from megatron_energon_lite.pipeline.filter import FilterNode
from megatron_energon_lite.pipeline.group import GroupBatchNode
from megatron_energon_lite.pipeline.map import MapNode
from megatron_energon_lite.pipeline.node import Node
from megatron_energon_lite.pipeline.pack import PackNode
from megatron_energon_lite.pipeline.passes import PassNode
from megatron_energon_lite.pipeline.repeat import RepeatNode
from megatron_energon_lite.pipeline.shuffle import ShuffleBufferNode


def _pipeline_test_helpers():
    """tests/pipeline/resume.py, loaded under its own name (not through sys.path, where its
    folder's conftest would shadow the root one)."""
    path = Path(__file__).resolve().parent.parent / "pipeline" / "resume.py"
    spec = importlib.util.spec_from_file_location("pipeline_resume_helpers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ListSource = _pipeline_test_helpers().ListSource

SHARDS, PER_SHARD = 4, 6

# --- a loader over a real dataset ----------------------------------------------------------------


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("state_values") / "captions"
    generate_captioning_dataset(root, num_shards=SHARDS, samples_per_shard=PER_SHARD, image_size=(8, 6), seed=3)
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1)
    (root / ".nv-meta/dataset.yaml").write_text(
        "sample_type:\n  __module__: megatron.energon\n  __class__: CaptioningSample\nfield_map:\n  image: jpg\n  caption: txt\n"
    )
    return root


def _loader(dataset: Path, workers: int = 0):
    return get_savable_loader(
        get_train_dataset(
            dataset,
            worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers),
            batch_size=2,
            shuffle_buffer_size=4,
            max_samples_per_sequence=3,
        )
    )


@pytest.fixture(scope="module")
def saved(dataset: Path) -> dict:
    loader = _loader(dataset)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.save_state_rank()
    # The pipeline this test expects: Pass > Batch > Shuffle > Repeat > Source.
    assert state["worker_states"][0]["stage"] == "Pass"
    source = state["worker_states"][0]["source"]["source"]["source"]["source"]
    assert source["stage"] == "Source" and len(source["open"]) >= 2, state
    return state


WORKER = "$.worker_states[0].source"  # the batch stage, below the loader's Pass stage
SHUFFLE, REPEAT, SOURCE = f"{WORKER}.source", f"{WORKER}.source.source", f"{WORKER}.source.source.source"


def _changed(state: dict, path: tuple, value: Any) -> dict:
    state = copy.deepcopy(state)
    target = state
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return state


def _assert_names(exc: pytest.ExceptionInfo, path: str, found: Any) -> None:
    message = str(exc.value)
    assert path + " " in message or message.endswith(path) or path + "\n" in message, message
    assert "expected:" in message and f"found: {repr(found)[:40]}" in message, message


W = ("worker_states", 0, "source")
SRC = (*W, "source", "source", "source")


@pytest.mark.parametrize(
    ("path", "value", "where"),
    [
        ((*SRC, "open", 0, 1), -1, f"{SOURCE}.open[0][1]"),  # a negative taken
        ((*SRC, "open", 0, 1), 10**6, f"{SOURCE}.open[0][1]"),  # taken past its slice
        ((*SRC, "open", 0, 0), 10**6, f"{SOURCE}.open[0][0]"),  # a slice id of 10**6
        ((*SRC, "open", 0, 0), -1, f"{SOURCE}.open[0][0]"),
        ((*SRC, "open", 0, 0), "0", f"{SOURCE}.open[0][0]"),
        ((*SRC, "open", 1), [1], f"{SOURCE}.open[1]"),
        ((*SRC, "open"), [[0, 0]] * 50, f"{SOURCE}.open"),
        ((*SRC, "next_slice"), 10**6, f"{SOURCE}.next_slice"),
        ((*SRC, "epoch"), -2, f"{SOURCE}.epoch"),
        ((*SRC, "draws"), 1.5, f"{SOURCE}.draws"),
        ((*SRC, "failures"), -1, f"{SOURCE}.failures"),
        ((*W, "source", "source", "taken"), -1, f"{REPEAT}.taken"),
        ((*W, "source", "source", "epoch"), "1", f"{REPEAT}.epoch"),
        ((*W, "source", "draws"), -5, f"{SHUFFLE}.draws"),
        ((*W, "source", "buffer"), [["Webdataset", 0]] * 9, f"{SHUFFLE}.buffer"),
        ((*W, "source", "buffer", 0), 7, f"{SHUFFLE}.buffer[0]"),
        ((*W, "index"), True, f"{WORKER}.index"),
        ((*W, "failures"), None, f"{WORKER}.failures"),
    ],
)
def test_impossible_stage_values_name_their_path(dataset: Path, saved: dict, path: tuple, value: Any, where: str) -> None:
    loader = _loader(dataset)
    loader.restore_state_rank(_changed(saved, path, value))
    with pytest.raises(StateError) as info:
        next(iter(loader))
    _assert_names(info, where, value)


@pytest.mark.parametrize(
    ("field", "value", "where", "found"),
    [
        ("next_worker", "0", "$.next_worker", "0"),  # next_worker as a string
        ("next_worker", 1, "$.next_worker", 1),  # one worker per rank: only 0
        ("next_worker", -1, "$.next_worker", -1),
        ("pass_ended", "no", "$.pass_ended", "no"),
        ("worker_states", {"0": None}, "$.worker_states", {"0": None}),
        ("worker_states", [5], "$.worker_states[0]", 5),
    ],
)
def test_impossible_rank_values_are_refused_at_restore(dataset: Path, saved: dict, field: str, value: Any, where: str, found: Any) -> None:
    loader = _loader(dataset)
    with pytest.raises(StateError) as info:
        loader.restore_state_rank({**saved, field: value})
    _assert_names(info, where, found)


def test_a_worker_process_reports_the_path_too(dataset: Path) -> None:
    loader = _loader(dataset, workers=1)
    it = iter(loader)
    for _ in range(2):
        next(it)
    saved = loader.save_state_rank()
    loader = _loader(dataset, workers=1)
    loader.restore_state_rank(_changed(saved, (*SRC, "open", 0, 0), 10**6))
    with pytest.raises(StateError, match=r"\$\.worker_states\[0\]\.source\.source\.source\.source\.open\[0\]\[0\]"):
        next(iter(loader))


def test_valid_saved_state_still_resumes_exactly(dataset: Path, saved: dict) -> None:
    expected_loader = _loader(dataset)
    expected_loader.restore_state_rank(copy.deepcopy(saved))
    expected = [list(batch.__key__) for _, batch in zip(range(6), expected_loader)]
    loader = _loader(dataset)
    it = iter(loader)
    for _ in range(3):
        next(it)
    assert [list(batch.__key__) for _, batch in zip(range(6), it)] == expected


# --- each stage on its own (over tests/pipeline's ListSource) ------------------------------------


WORDS = ["a", "bb", "ccc", "dddd", "e", "ff", "ggggg", "h", "iii", "jj", "k"]


def _pairs(items: list, index: int) -> list[list]:
    return [items[i : i + 2] for i in range(0, len(items), 2)]


def _join(members: list, index: int) -> dict:
    return {"value": "|".join(m["value"] for m in members)}


def _explode(members: list, index: int):
    for member in members:
        yield {"value": member["value"]}


def _twice(item: dict, index: int):
    yield {**item, "n": 0}
    yield {**item, "n": 1}


STAGES: dict[str, Callable[[], Node]] = {
    "limit": lambda: PassNode(ListSource(WORDS), 5, restart=True),
    "epochize": lambda: PassNode(ListSource(WORDS), 4),
    "concat": lambda: ConcatNode([ListSource(WORDS[:3]), ListSource(WORDS[3:])]),
    "map": lambda: MapNode(ListSource(WORDS), _twice),
    "plainmap": lambda: MapNode(ListSource(WORDS), lambda item, index: item),
    "filter": lambda: FilterNode(ListSource(WORDS), lambda item, index: len(item["value"]) > 1),
    "batch": lambda: BatchNode(ListSource(WORDS), 3, lambda items, index: [i["value"] for i in items]),
    "shuffle": lambda: ShuffleBufferNode(ListSource(WORDS), 4, seed=1),
    "repeat": lambda: RepeatNode(ListSource(WORDS), 1.5, worker_samples=len(WORDS)),
    "blend": lambda: BlendNode([PassNode(ListSource(WORDS), 5, restart=True), PassNode(ListSource(WORDS), 5, restart=True)], [1, 1], seed=3),
    "exact": lambda: BlendNode([ListSource(WORDS), ListSource(WORDS)], [2, 1], seed=3, mode="exact"),
    "pack": lambda: PackNode(ListSource(WORDS), 4, _pairs, _join),
    "genpack": lambda: PackNode(ListSource(WORDS), 4, _pairs, _explode),
    "group": lambda: GroupBatchNode(ListSource(WORDS), lambda item, index: (len(item["value"]), 3), lambda items, index: items, batch_size=None),
}


@pytest.mark.parametrize(
    ("stage", "steps", "path", "value", "expected"),
    [
        ("limit", 2, ("offset",), 6, "from 0 to 5"),
        ("limit", 2, ("offset",), -1, "from 0 to 5"),
        ("epochize", 2, ("offset",), 99, "from 0 to 4"),
        ("concat", 2, ("current",), 3, "from 0 to 2"),
        ("concat", 2, ("current",), "0", "from 0 to 2"),
        ("map", 1, ("emitted",), -1, ">= 0"),
        ("plainmap", 2, ("emitted",), 1, "null"),  # no generator to resume
        ("map", 1, ("index",), 0, ">= 1"),
        ("map", 1, ("input_key",), "List", "a list"),
        ("filter", 2, ("index",), -3, ">= 0"),
        ("batch", 2, ("index",), "2", ">= 0"),
        ("shuffle", 3, ("draws",), -1, ">= 0"),
        ("repeat", 13, ("taken",), 6, "from 0 to 5"),  # in the final half epoch: at most 5 items
        ("repeat", 2, ("repetition",), 3, "from 0 to 2"),
        ("blend", 3, ("sources", 1, "offset"), 9, "from 0 to 5"),  # the path goes into the sources
        ("blend", 3, ("exhausted", 0), "no", "true or false"),
        ("blend", 3, ("counts", 0), -1, ">= 0"),
        ("blend", 3, ("costs",), [0], "a list of 2"),
        ("blend", 3, ("schedule",), {"position": 0, "counts": [0, 0]}, "null"),
        ("exact", 4, ("schedule", "position"), -1, ">= 0"),
        ("exact", 4, ("schedule", "counts", 0), 9, "from 0 to 4"),
        ("exact", 4, ("schedule", "counts"), [0, 0], "add up to the position"),
        ("pack", 1, ("groups_done",), 7, "from 0 to 2"),
        ("pack", 1, ("buffer_index",), 5, "from 0 to 1"),
        ("pack", 1, ("open",), "yes", "true or false"),
        ("genpack", 1, ("emitted",), 5, "at most 2 outputs"),
        ("group", 3, ("buckets", 0, 1), 0, "batch size >= 1"),
        ("group", 3, ("buckets", 0, 2), [["List", 0]] * 5, "fewer than 3"),
        ("group", 3, ("buckets", 0), "x", "a list of 3"),
        ("group", 3, ("inputs",), -1, ">= 0"),
    ],
)
def test_each_stage_refuses_impossible_values(stage: str, steps: int, path: tuple, value: Any, expected: str) -> None:
    node = STAGES[stage]()
    for _ in range(steps):
        node.next()
    state = node.get_state()
    STAGES[stage]().reset(copy.deepcopy(state))  # the saved state itself restores
    with pytest.raises(StateError) as info:
        STAGES[stage]().reset(_changed(state, path, value))
    where = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)
    _assert_names(info, where, value)
    assert expected in str(info.value).split("expected:")[1].split("\n")[0], str(info.value)
