"""Restore cost of elastic resume: time from a fresh loader to its first batch after
``restore_state_global``, on the saved topology and on another one.

A shuffled training loader (shuffle buffer full) is saved on ``--ranks`` ranks (64 global workers
by default: 64 ranks x 0 workers, so the states come from real loaders without starting 64
processes on a small machine).  Then rank 0 of a new loader restores the whole list and takes
its first batch: on the same topology (it takes its own entry) and on ``--new-ranks`` ranks
(the rest of the epoch is collected from all 64 workers and divided anew).  Fresh loaders each
time; the two cases alternate; medians of ``--repeats``.

    .venv/bin/python benchmarks/bench_elastic.py --ranks 64 --new-ranks 16 --repeats 5
    .venv/bin/python benchmarks/bench_elastic.py --blend exact   # a blend of two such datasets, 1:2

``--blend MODE``: the loader reads a blend (weights 1:2, ``blend_mode`` MODE) of two datasets of
``--shards`` shards each; an exact blend also computes every new worker's schedule rates.

``--weight-edit`` (with ``--blend``): also restore into the blend re-weighted 2:1 with
``allow_weight_edit=True`` (``loader/reweight.py``), on the saved topology and on ``--new-ranks``
ranks; the issue's target is a weight edit within 2x of an elastic restore:

    .venv/bin/python benchmarks/bench_elastic.py --blend random --weight-edit
    .venv/bin/python benchmarks/bench_elastic.py --blend exact --weight-edit

``--new-workers M``: the new ranks have M loader workers (their first batch then includes
starting them).  With ``--new-ranks`` x M equal to ``--ranks``, the global worker count is kept
and the saved worker states are moved instead of the rest of the epoch divided:

    .venv/bin/python benchmarks/bench_elastic.py --new-ranks 32 --new-workers 2
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import time
from pathlib import Path

from megatron_energon_lite.synthetic import generate_text_dataset

from megatron_energon_lite import WorkerConfig, get_savable_loader, get_train_dataset
from megatron_energon_lite.format.prepare import prepare_dataset

TEXT_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"


def make_loader(data: Path, rank: int, world: int, args, workers: int = 0):
    config = WorkerConfig(rank=rank, world_size=world, num_workers=workers)
    blend = {"blend_mode": args.blend} if args.blend else {}
    ds = get_train_dataset(data, worker_config=config, batch_size=args.batch_size, shuffle_buffer_size=args.shuffle_buffer, max_samples_per_sequence=args.msps, **blend)
    return get_savable_loader(ds)


def timed_restore(data: Path, world: int, states: list[dict], args, workers: int = 0, edit: bool = False) -> tuple[float, float]:
    """(seconds from restore_state_global to the first batch, of which restore_state_global)."""
    loader = make_loader(data, 0, world, args, workers)
    start = time.perf_counter()
    loader.restore_state_global(states, allow_weight_edit=edit)
    restored = time.perf_counter()
    next(iter(loader))
    return time.perf_counter() - start, restored - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--new-ranks", type=int, default=16)
    parser.add_argument("--new-workers", type=int, default=0, help="Loader workers per new rank.")
    parser.add_argument("--shards", type=int, default=200)
    parser.add_argument("--samples-per-shard", type=int, default=50)
    parser.add_argument("--shuffle-buffer", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--msps", type=int, default=20)
    parser.add_argument("--batches", type=int, default=3, help="Batches each saved rank reads before saving.")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--blend", choices=["random", "exact"], default=None, help="Read a 1:2 blend of two datasets in this mode.")
    parser.add_argument("--weight-edit", action="store_true", help="Also restore into the blend re-weighted 2:1 (needs --blend).")
    args = parser.parse_args()
    if args.weight_edit and not args.blend:
        parser.error("--weight-edit needs --blend")
    base = Path(tempfile.mkdtemp())
    for seed, name in enumerate(["texts", "more"][: 2 if args.blend else 1], start=3):
        generate_text_dataset(base / name, num_shards=args.shards, samples_per_shard=args.samples_per_shard, min_words=2, max_words=8, seed=seed)
        prepare_dataset(base / name, split_ratio=(1, 0, 0), progress=False, num_workers=2, dataset_yaml=TEXT_YAML)
    data = edited = base / "texts"
    if args.blend:
        data, edited = base / "blend.yaml", base / "reweighted.yaml"
        for path, (a, b) in ((data, (1, 2)), (edited, (2, 1))):
            path.write_text(
                "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
                f"      - {{weight: {a}, path: texts}}\n      - {{weight: {b}, path: more}}\n"
            )

    states = []
    for rank in range(args.ranks):
        loader = make_loader(data, rank, args.ranks, args)
        list(itertools.islice(loader, args.batches))
        states.append(loader.save_state_rank())
    buffered = sum(len(state["worker_states"][0]["source"]["source"]["buffer"]) for state in states)
    what = f"a blend (blend_mode {args.blend}, weights 1:2) of 2 datasets, each of" if args.blend else "one dataset of"
    print(f"saved {args.ranks} ranks x 0 workers ({what} {args.shards * args.samples_per_shard} samples, "
          f"shuffle buffer {args.shuffle_buffer}: {buffered} samples buffered in all)")

    how = "moved worker states" if args.new_ranks * max(1, args.new_workers) == args.ranks else "elastic"
    new = f"{args.new_ranks} ranks x {args.new_workers} workers"
    cases = {"same topology": (data, args.ranks, 0, False), f"{new} ({how})": (data, args.new_ranks, args.new_workers, False)}
    if args.weight_edit:
        cases["same topology, weights 1:2 -> 2:1"] = (edited, args.ranks, 0, True)
        cases[f"{new} ({how}), weights 1:2 -> 2:1"] = (edited, args.new_ranks, args.new_workers, True)
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    for repeat in range(args.repeats):
        order = list(cases.items()) if repeat % 2 == 0 else list(reversed(cases.items()))
        for name, (path, world, workers, edit) in order:
            results[name].append(timed_restore(path, world, states, args, workers, edit))
    print(f"\nrank 0 of a fresh loader: restore_state_global + first batch (median of {args.repeats}, ms)\n")
    print("| restored on | restore + first batch | of which restore |")
    print("| --- | ---: | ---: |")
    for name, runs in results.items():
        total = statistics.median(r[0] for r in runs) * 1000
        restore = statistics.median(r[1] for r in runs) * 1000
        print(f"| {name} | {total:.1f} | {restore:.1f} |")
    medians = [statistics.median(r[0] for r in runs) for runs in results.values()]
    print(f"\nelastic / same topology: {medians[1] / medians[0]:.2f}x")
    if args.weight_edit:
        print(f"weight edit on the same topology / elastic: {medians[2] / medians[1]:.2f}x")
        print(f"weight edit with an elastic restore / elastic: {medians[3] / medians[1]:.2f}x")


if __name__ == "__main__":
    main()
