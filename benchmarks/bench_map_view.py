"""Random access through the map view (``get_map_dataset``): samples/s for uniformly random indices.

Reads the captioning benchmark set of ``bench_loader.py`` (JPEG + caption per sample; images
decoded to uint8 CHW tensors, as there) and measures:

- in-process: ``view[i]`` for ``--lookups`` uniformly random indices, after a warm-up;
- ``DataLoader(view, batch_size=--batch-size, num_workers=--workers, collate_fn=view.collate,
  sampler=RandomSampler(view))``: ``--batches`` batches after the first one (worker start-up is
  reported apart, as the time to the first batch);
- the blend index: ``blend_counts`` + ``blend_order`` for 1M positions over 4 datasets.

Each figure is the median of ``--repeats`` runs. ``--data-dir`` takes a prepared captioning
dataset, or a folder holding ``captioning/`` (``bench_loader.py --data-dir`` makes one);
without it, ``/work/scratch/bench_full/captioning`` is used when present, else a small set is
generated and prepared in a temporary folder. Run with the project's environment, e.g.

    .venv/bin/python benchmarks/bench_map_view.py --repeats 3
    .venv/bin/python benchmarks/bench_map_view.py --quick
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch
from megatron_energon_lite.synthetic import generate_captioning_dataset
from torch.utils.data import DataLoader, RandomSampler

from megatron_energon_lite import DefaultTaskEncoder, SampleDecoder, get_map_dataset
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.map_view import blend_counts, blend_order

DEFAULT_DATA = Path("/work/scratch/bench_full/captioning")
DATASET_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: CaptioningSample\nfield_map:\n  image: jpg\n  caption: txt\n"


class Uint8TaskEncoder(DefaultTaskEncoder):
    """Images as uint8 CHW tensors, as bench_loader.py decodes them."""

    decoder = SampleDecoder(image_decode="torchrgb8")


def dataset_root(args: argparse.Namespace, scratch: Path) -> Path:
    if args.data_dir is not None:
        root = args.data_dir / "captioning" if (args.data_dir / "captioning").is_dir() else args.data_dir
        if not (root / ".nv-meta").is_dir():
            raise SystemExit(f"{root} is not a prepared dataset (no .nv-meta/)")
        return root
    if DEFAULT_DATA.is_dir() and (DEFAULT_DATA / ".nv-meta").is_dir() and not args.quick:
        return DEFAULT_DATA
    root = scratch / "captioning"
    print(f"Generating {args.shards} x {args.samples_per_shard} samples in {root}", file=sys.stderr)
    generate_captioning_dataset(root, num_shards=args.shards, samples_per_shard=args.samples_per_shard, image_size=(args.image_size, args.image_size), seed=0)
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=DATASET_YAML)
    return root


def in_process(view, lookups: int, seed: int) -> float:
    indices = np.random.default_rng(seed).integers(0, len(view), size=lookups).tolist()
    start = time.perf_counter()
    for i in indices:
        view[i]
    return lookups / (time.perf_counter() - start)


def through_dataloader(view, args: argparse.Namespace, seed: int) -> tuple[float, float]:
    """(seconds to the first batch, samples/s over the batches after it)."""
    sampler = RandomSampler(view, generator=torch.Generator().manual_seed(seed))
    start = time.perf_counter()
    loader = DataLoader(view, batch_size=args.batch_size, num_workers=args.workers, collate_fn=view.collate, sampler=sampler)
    batches = iter(loader)
    next(batches)
    first = time.perf_counter() - start
    start = time.perf_counter()
    samples = 0
    for _, batch in zip(range(args.batches), batches):
        samples += len(batch.__key__)
    rate = samples / (time.perf_counter() - start)
    del batches
    return first, rate


def blend_layout(positions: int) -> float:
    weights = [Fraction(4, 10), Fraction(3, 10), Fraction(2, 10), Fraction(1, 10)]
    start = time.perf_counter()
    blend_order([float(w) for w in weights], blend_counts(weights, positions))
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, help="A prepared captioning dataset, or a folder holding captioning/.")
    parser.add_argument("--shards", type=int, default=4, help="Generated shards (no data found).")
    parser.add_argument("--samples-per-shard", type=int, default=250)
    parser.add_argument("--image-size", type=int, default=256)
    parser.add_argument("--lookups", type=int, default=2000, help="Random in-process lookups per repeat.")
    parser.add_argument("--warmup", type=int, default=50, help="In-process lookups before timing.")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batches", type=int, default=60, help="Timed DataLoader batches per repeat.")
    parser.add_argument("--blend-positions", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="A smoke run on a small generated set; not figures to quote.")
    args = parser.parse_args()
    if args.quick:
        args.shards, args.samples_per_shard, args.image_size = 2, 50, 64
        args.lookups, args.warmup, args.batches, args.repeats, args.blend_positions = 100, 10, 4, 1, 100_000
    with tempfile.TemporaryDirectory(prefix="bench_map_view_") as scratch:
        root = dataset_root(args, Path(scratch))
        view = get_map_dataset(root, task_encoder=Uint8TaskEncoder())
        for i in np.random.default_rng(1).integers(0, len(view), size=args.warmup).tolist():
            view[i]
        local = [in_process(view, args.lookups, seed) for seed in range(args.repeats)]
        loaded = [through_dataloader(view, args, seed) for seed in range(args.repeats)]
        layout = [blend_layout(args.blend_positions) for _ in range(args.repeats)]
        print(f"dataset: {root} ({len(view):,} samples), {os.cpu_count()} CPUs, torch {torch.__version__}, medians of {args.repeats}")
        print(f"in-process random view[i]:                 {statistics.median(local):10,.0f} samples/s")
        print(f"DataLoader {args.workers} workers, batch {args.batch_size}, random: {statistics.median(r for _, r in loaded):10,.0f} samples/s"
              f"  (first batch after {statistics.median(f for f, _ in loaded):.2f} s)")
        print(f"blend index, {args.blend_positions:,} positions over 4 datasets: {statistics.median(layout):.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
