"""Writes v1_states.json: loader states as megatron-energon-lite 0.1 (state version 1) saved them,
with the batches 0.1 read before and after each save.  tests/loader/test_rank_state.py restores them.

Made once, from a checkout of the last commit with version-1 states (6009d0c):

    git worktree add /tmp/v1 6009d0c
    PYTHONPATH=/tmp/v1 .venv/bin/python tests/data/make_v1_states.py /tmp/v1_data tests/data/v1_states.json
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

from energon_lite_dev.synthetic import generate_text_dataset

import megatron_energon_lite
from megatron_energon_lite import (
    WorkerConfig,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
)
from megatron_energon_lite.format.prepare import prepare_dataset

TEXT_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"

# name -> (train?, loader options, passes read to the end first, batches read then, loop ended at the save)
SCENARIOS = {
    "train_mid": (True, {}, 0, 5, False),
    "train_virtual_epoch_mid": (True, {"virtual_epoch_length": 4}, 1, 2, False),
    "train_virtual_epoch_last_item": (True, {"virtual_epoch_length": 4}, 0, 4, False),
    "train_virtual_epoch_loop_ended": (True, {"virtual_epoch_length": 4}, 1, 0, True),
    "val_mid": (False, {}, 0, 3, False),
    "val_last_item": (False, {}, 0, None, False),
    "val_loop_ended": (False, {}, 1, 0, True),
    "val_limit_mid": (False, {"limit": 5}, 1, 2, False),
}
CONTINUE = 12  # batches read after the save


def make_dataset(root: Path) -> Path:
    generate_text_dataset(root, num_shards=5, samples_per_shard=7, min_words=2, max_words=6, seed=11)
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=TEXT_YAML)
    return root


def make_loader(root: Path, train: bool, options: dict, workers: int):
    config = WorkerConfig(rank=0, world_size=1, num_workers=workers)
    if train:
        ds = get_train_dataset(root, batch_size=3, shuffle_buffer_size=4, max_samples_per_sequence=2, worker_config=config, **options)
    else:
        ds = get_val_dataset(root, split_part="train", batch_size=3, worker_config=config, **options)
    return get_savable_loader(ds)


def keys(batches) -> list[list[str]]:
    return [list(batch.__key__) for batch in batches]


def read(loader, passes: int, batches: int | None, loop_ended: bool):
    """Reads ``passes`` whole passes, then ``batches`` of the next (None: all of it, staying in the
    loop); returns (batches read, the open iterator or None)."""
    seen = []
    for _ in range(passes):
        seen += keys(loader)
    if loop_ended:
        return seen, None
    it = iter(loader)
    if batches is None:
        batches = len(loader)
    seen += keys(itertools.islice(it, batches))
    return seen, it


def continuation(loader, it) -> list[list[str]]:
    """The next CONTINUE batches, across pass ends (the open pass first)."""
    out: list = []
    while len(out) < CONTINUE:
        more = keys(itertools.islice(it if it is not None else iter(loader), CONTINUE - len(out)))
        it = None
        if not more and out[-1:] == ["<end>"]:
            break
        out += more + (["<end>"] if len(out) + len(more) < CONTINUE else [])
    return out[:CONTINUE]


def main(data: str, out: str) -> None:
    root = make_dataset(Path(data))
    result = {"writer": f"megatron-energon-lite {megatron_energon_lite.__version__}", "scenarios": {}}
    for name, (train, options, passes, batches, loop_ended) in SCENARIOS.items():
        for workers in (0, 2):
            loader = make_loader(root, train, options, workers)
            before, it = read(loader, passes, batches, loop_ended)
            state = loader.save_state_rank()
            assert state["version"] == 1
            result["scenarios"][f"{name}/{workers}"] = {
                "train": train, "options": options, "workers": workers, "passes": passes, "batches": batches, "loop_ended": loop_ended,
                "before": before, "state": state, "after": continuation(loader, it),
            }
    Path(out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
