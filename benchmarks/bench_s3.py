"""Reading the captioning benchmark set from S3 (moto on 127.0.0.1) vs local disk.

For 0 and 2 workers: samples/s, GET requests per sample and bytes fetched per byte used (the
samples' own bytes), read directly from the S3 server, through a proxy that adds 20 ms to every
request, and through that proxy with read-ahead switched off (``ENERGON_LITE_BLOCK_SIZE=0``: one
GET per sample), to show what read-ahead hides.

The S3 server and the proxy run in a process of their own, so they do not share the loader's
interpreter lock; requests and bytes are counted by the proxy (a zero-latency one for the plain
S3 rows).  Example::

    .venv/bin/python benchmarks/bench_s3.py --shards 8 --samples-per-shard 500 --batches 60
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from energon_lite_dev.s3server import S3ServerProcess
from megatron_energon_lite.synthetic import generate_captioning_dataset  # noqa: E402

from megatron_energon_lite import WorkerConfig, get_savable_loader, get_train_dataset  # noqa: E402
from megatron_energon_lite.format.prepare import prepare_dataset  # noqa: E402
from megatron_energon_lite.storage import configure_storage  # noqa: E402

BUCKET = "bench"
DATASET_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: CaptioningSample\nfield_map:\n  image: jpg\n  caption: txt\n"


def mean_sample_bytes(root: Path) -> float:
    total, count = 0, 0
    for idx in root.rglob("*.tar.idx"):
        offsets = np.fromfile(idx, dtype="<u8")
        total += int(offsets[-1])
        count += len(offsets) - 1
    return total / count


def run(path: str, workers: int, args, storage_options: dict | None) -> tuple[float, int]:
    """(samples/s over the timed batches, samples read in all, warm-up included)."""
    dataset = get_train_dataset(
        path,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers),
        batch_size=args.batch_size,
        shuffle_buffer_size=100,
        max_samples_per_sequence=100,
        **({"storage_options": storage_options} if storage_options else {}),
    )
    loader = get_savable_loader(dataset)
    iterator = iter(loader)
    for _ in range(args.warmup):
        next(iterator)
    start = time.perf_counter()
    for _ in range(args.batches):
        next(iterator)
    elapsed = time.perf_counter() - start
    del iterator, loader
    return args.batches * args.batch_size / elapsed, (args.warmup + args.batches) * args.batch_size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--samples-per-shard", type=int, default=500)
    parser.add_argument("--image-size", type=int, default=256, help="Square JPEG side (256: ~20 KB).")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--repeats", type=int, default=1, help="Runs per cell; the table shows medians.")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-s3-"))
    os.environ["ENERGON_LITE_CACHE_DIR"] = str(work / "cache")
    server = S3ServerProcess(BUCKET, {"plain": 0.0, "slow": args.latency_ms / 1000})
    try:
        local = work / "captioning"
        print(f"generating {args.shards} x {args.samples_per_shard} captioning samples ...", file=sys.stderr)
        generate_captioning_dataset(local, num_shards=args.shards, samples_per_shard=args.samples_per_shard, image_size=(args.image_size, args.image_size), progress=True)
        prepare_dataset(local, split_ratio=(1, 0, 0), progress=True, dataset_yaml=DATASET_YAML)
        url = f"s3://{BUCKET}/captioning"
        server.call("upload", str(local), url)
        used_per_sample = mean_sample_bytes(local)
        configure_storage("s3", storage_options=server.info["options"])

        cells = [("local disk", None, None, None)]
        cells.append(("S3 (moto)", "plain", server.options("plain"), None))
        cells.append((f"S3 + {args.latency_ms:g} ms/request", "slow", server.options("slow"), None))
        cells.append((f"S3 + {args.latency_ms:g} ms, no read-ahead", "slow", server.options("slow"), "0"))
        rows = []
        bar = tqdm(total=len(cells) * len(args.workers) * args.repeats, desc="measuring", unit="run", file=sys.stderr)
        for label, proxy, options, block_size in cells:
            for workers in args.workers:
                speeds, requests, fetched = [], [], []
                for _ in range(args.repeats):
                    if block_size is None:
                        os.environ.pop("ENERGON_LITE_BLOCK_SIZE", None)
                    else:
                        os.environ["ENERGON_LITE_BLOCK_SIZE"] = block_size
                    shutil.rmtree(work / "cache", ignore_errors=True)
                    if proxy:
                        server.call("reset", proxy)
                    speed, samples = run(str(local) if proxy is None else url, workers, args, options)
                    speeds.append(speed)
                    if proxy:
                        stats = server.call("stats", proxy)
                        requests.append(stats["requests"] / samples)
                        fetched.append(stats["bytes_forwarded"] / (samples * used_per_sample))
                    bar.update()
                rows.append((label, workers, statistics.median(speeds), statistics.median(requests) if requests else None, statistics.median(fetched) if fetched else None))
        bar.close()
        os.environ.pop("ENERGON_LITE_BLOCK_SIZE", None)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)

    print(f"\ncaptioning set: {args.shards} x {args.samples_per_shard} samples, {used_per_sample / 1024:.1f} KiB each; "
          f"batch {args.batch_size}, {args.batches} timed batches after {args.warmup}, median of {args.repeats}\n")
    print("| source | workers | samples/s | GETs per sample | bytes fetched per byte used |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for label, workers, speed, requests, fetched in rows:
        req = "-" if requests is None else f"{requests:.3f}"
        amp = "-" if fetched is None else f"{fetched:.2f}"
        print(f"| {label} | {workers} | {speed:,.0f} | {req} | {amp} |")
    print("\nGETs and bytes count everything the proxy served during the run (index files and listings included).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
