"""Reading a Megatron ``.bin/.idx`` dataset with ``IndexedReader``, in one process.

Writes (or reuses, with ``--data-dir``) a dataset of ``--documents`` documents with lengths
uniform in [1, 2000] uint16 tokens (~160 MB by default), then measures, as the median of
``--repeats`` runs:

* opening it (parse and validate the ``.idx``),
* random documents per second (``reader.document(i)``),
* random token windows per second (``reader.read_tokens(k * 2048, k * 2048 + 2049)``, GPT-style
  samples of 2048 tokens plus the label token),

next to the same reads from a ``numpy.memmap`` of the ``.bin`` (slice + copy), the ceiling of
what any reader can do on warm pages.  The file is in the page cache after writing, so these are
warm-cache figures.  Run:

    .venv/bin/python benchmarks/bench_indexed.py [--documents 80000] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

from megatron_energon_lite.format.indexed import IndexedReader, IndexedWriter

WINDOW = 2048


def write_dataset(prefix: Path, documents: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 2001, size=documents)
    start = time.perf_counter()
    with IndexedWriter(prefix, np.uint16) as writer:
        for length in lengths:
            writer.add_document(rng.integers(0, 65000, size=int(length), dtype=np.uint16))
    return time.perf_counter() - start


def rate(fn: Callable[[int], object], keys: np.ndarray, repeats: int) -> float:
    """Median calls per second of ``fn`` over ``keys``."""
    results = []
    for _ in range(repeats):
        start = time.perf_counter()
        for key in keys:
            fn(key)
        results.append(len(keys) / (time.perf_counter() - start))
    return statistics.median(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, default=80_000)
    parser.add_argument("--reads", type=int, default=20_000, help="reads per repeat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--data-dir", type=Path, default=None, help="keep the dataset here (reused when present)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-indexed-") as scratch:
        folder = args.data_dir or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        prefix = folder / f"bench_{args.documents}_{args.seed}"
        if not Path(f"{prefix}.idx").exists():
            seconds = write_dataset(prefix, args.documents, args.seed)
            size = Path(f"{prefix}.bin").stat().st_size
            print(f"wrote {prefix}: {size / 2**20:.0f} MiB in {seconds:.1f} s ({size / 2**20 / seconds:.0f} MiB/s)")
        else:
            print(f"reusing {prefix}")

        opens = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            reader = IndexedReader(prefix)
            opens.append(time.perf_counter() - start)
        print(
            f"dataset: {reader.num_documents} documents, {reader.num_tokens} tokens, "
            f"{reader.bin_size / 2**20:.0f} MiB .bin, {reader.idx_size / 2**20:.1f} MiB .idx"
        )
        print(f"open (parse + validate .idx): {statistics.median(opens) * 1e3:.1f} ms")

        rng = np.random.default_rng(args.seed + 1)
        documents = rng.integers(0, reader.num_documents, size=args.reads)
        windows = rng.integers(0, (reader.num_tokens - WINDOW - 1) // WINDOW + 1, size=args.reads) * WINDOW
        memmap = np.memmap(f"{prefix}.bin", dtype=np.uint16, mode="r")
        starts = reader.document_starts

        cases = [
            ("random documents", rate(reader.document, documents, args.repeats),
             rate(lambda i: memmap[starts[i] : starts[i + 1]].copy(), documents, args.repeats),
             float(np.mean(np.diff(starts)))),
            (f"random windows of {WINDOW + 1} tokens", rate(lambda k: reader.read_tokens(k, k + WINDOW + 1), windows, args.repeats),
             rate(lambda k: memmap[k : k + WINDOW + 1].copy(), windows, args.repeats), WINDOW + 1.0),
        ]
        print(f"\nmedian of {args.repeats} x {args.reads} reads, one process")
        print("| read | IndexedReader /s | MiB/s | numpy.memmap copy /s (ceiling) |")
        print("| --- | ---: | ---: | ---: |")
        for label, ours, ceiling, tokens in cases:
            print(f"| {label} | {ours:,.0f} | {ours * tokens * 2 / 2**20:,.0f} | {ceiling:,.0f} |")
        reader.close()


if __name__ == "__main__":
    main()
