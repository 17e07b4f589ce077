"""How many small tensor batches find a free slab, with 2 workers and bundles on.

Small, fast tensor batches travel in bundles of up to ``MAX_BUNDLE_ITEMS``; a batch that finds no
free slab in its worker's ring goes through torch's shared memory instead.  How many do depends
on how far the workers run ahead of the loop, so it is a figure printed here, not a test.

    .venv/bin/python benchmarks/bench_slabs.py --rounds 5

Generates a small captioning dataset (24x16 JPEGs) in a temporary directory, then per round makes
a loader (batch 4, uint8 CHW images), takes ``--batches`` batches, dropping each at once, and
counts those whose image tensor lies in the slab ring; prints each round and the median.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from pathlib import Path

from megatron_energon_lite.synthetic import prepared_captioning_dataset

from megatron_energon_lite import (
    DefaultTaskEncoder,
    WorkerConfig,
    get_loader,
    get_train_dataset,
)
from megatron_energon_lite.decode import SampleDecoder


class ImageTensors(DefaultTaskEncoder):
    decoder = SampleDecoder(image_decode="torchrgb8")


def one_round(root: Path, batches: int, workers: int) -> tuple[int, float]:
    config = WorkerConfig(rank=0, world_size=1, num_workers=workers)
    loader = get_loader(get_train_dataset(root, batch_size=4, shuffle_buffer_size=5, max_samples_per_sequence=4, worker_config=config, task_encoder=ImageTensors()))
    first = loader._slabs.data.ctypes.data
    end = first + loader._slabs.data.nbytes
    it = iter(loader)
    next(it)  # workers started
    in_slabs = 0
    start = time.perf_counter()
    for _ in range(batches):
        in_slabs += first <= next(it).image.data_ptr() < end
    elapsed = time.perf_counter() - start
    del it, loader
    gc.collect()
    return in_slabs, batches * 4 / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = prepared_captioning_dataset(Path(tmp) / "cap", num_shards=4, samples_per_shard=12, image_size=(24, 16), seed=5)
        shares, rates = [], []
        for k in range(args.rounds):
            in_slabs, rate = one_round(root, args.batches, args.workers)
            shares.append(in_slabs / args.batches)
            rates.append(rate)
            print(f"round {k + 1}: {in_slabs}/{args.batches} batches over the slabs, {rate:,.0f} samples/s")
        print(f"median: {100 * statistics.median(shares):.0f}% of batches over the slabs, {statistics.median(rates):,.0f} samples/s ({args.workers} workers)")


if __name__ == "__main__":
    main()
