"""Prepare on many small shards: full run, unchanged re-run, and a re-run after one shard changed.

Prints how many shards each run indexed and how long it took. Usage:

    .venv/bin/python benchmarks/bench_prepare_many.py --shards 1000 --samples-per-shard 20 --num-workers 2
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.synthetic import make_text, write_tar


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shards", type=int, default=1000)
    parser.add_argument("--samples-per-shard", type=int, default=20)
    parser.add_argument("--num-workers", type=int, default=min(16, os.cpu_count() or 1))
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "many"
        for shard in tqdm(range(args.shards), desc="Generating shards", unit="shard"):
            samples = [(f"{shard:05d}_{i:04d}", {"txt": make_text((shard, i), max_words=40).encode()}) for i in range(args.samples_per_shard)]
            write_tar(root / f"shards/{shard // 100:03d}/shard_{shard:05d}.tar", samples)

        rows = []
        start = time.perf_counter()
        result = prepare_dataset(root, split_ratio=(8, 1, 1), num_workers=args.num_workers, progress=True)
        rows.append(("full prepare", len(result.scanned), time.perf_counter() - start))

        start = time.perf_counter()
        result = prepare_dataset(root, split_ratio=(8, 1, 1), num_workers=args.num_workers, progress=True, force_overwrite=True)
        rows.append(("re-run, nothing changed", len(result.scanned), time.perf_counter() - start))

        changed = next(iter(sorted(root.glob("shards/*/*.tar"))))
        write_tar(changed, [(f"changed_{i}", {"txt": b"new"}) for i in range(3)])
        start = time.perf_counter()
        result = prepare_dataset(root, split_ratio=(8, 1, 1), num_workers=args.num_workers, progress=True, force_overwrite=True)
        rows.append(("re-run, one shard rewritten", len(result.scanned), time.perf_counter() - start))

    print(f"\n{args.shards} shards x {args.samples_per_shard} samples, --num-workers {args.num_workers}\n")
    print("| run | shards indexed | seconds |")
    print("| --- | ---: | ---: |")
    for name, scanned, seconds in rows:
        print(f"| {name} | {scanned} | {seconds:.2f} |")


if __name__ == "__main__":
    main()
