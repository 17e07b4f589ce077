"""Reading the captioning benchmark set from S3 (moto on 127.0.0.1) vs local disk.

For 0 and 2 workers: samples/s, GET requests per sample and bytes fetched per byte used (the
samples' own bytes), read directly from the S3 server, through a proxy that adds 20 ms to every
request, through that proxy with prefetch across slices off (``ENERGON_LITE_PREFETCH_SLICES=0``:
read-ahead stops at the end of each slice) and with read-ahead off as well
(``ENERGON_LITE_BLOCK_SIZE=0``: one GET per sample), to show what each hides.  ``--energon``
adds Energon 7.4.1 through the same proxy (it reads object storage through Multi-Storage Client:
``msc://`` with an ``MSC_CONFIG`` profile whose endpoint is the proxy).

Runs alternate: each repeat measures every cell once, in the same order, so drift of a shared
machine spreads over all of them; the table shows medians.

The S3 server and the proxy run in a process of their own, so they do not share the loader's
interpreter lock; requests and bytes are counted by the proxy (a zero-latency one for the plain
S3 rows).  Example::

    .venv/bin/python benchmarks/bench_s3.py --shards 8 --samples-per-shard 500 --batches 60

Small shards (10 samples of about 2 KB: 20 KB shards, one slice each) and 4.6 MB shards::

    .venv/bin/python benchmarks/bench_s3.py --shards 400 --samples-per-shard 10 --image-size 8 --workers 2 --repeats 3 --energon
    .venv/bin/python benchmarks/bench_s3.py --shards 8 --samples-per-shard 180 --workers 2 --repeats 3 --energon
"""

from __future__ import annotations

import argparse
import json
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

import megatron_energon_lite  # noqa: E402
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


def run(path: str, workers: int, args, storage_options: dict | None, library: str = "ours") -> tuple[float, int]:
    """(samples/s over the timed batches, samples read in all, warm-up included)."""
    if library == "energon":
        import megatron.energon as energon

        dataset = energon.get_train_dataset(
            path,
            worker_config=energon.WorkerConfig(rank=0, world_size=1, num_workers=workers),
            batch_size=args.batch_size,
            shuffle_buffer_size=100,
            max_samples_per_sequence=100,
            **({"task_encoder": raw_encoder(energon)} if args.raw else {}),
        )
        return timed(energon.get_savable_loader(dataset), args)
    dataset = get_train_dataset(
        path,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers),
        batch_size=args.batch_size,
        shuffle_buffer_size=100,
        max_samples_per_sequence=100,
        **({"storage_options": storage_options} if storage_options else {}),
        **({"task_encoder": raw_encoder(megatron_energon_lite)} if args.raw else {}),
    )
    return timed(get_savable_loader(dataset), args)


def raw_encoder(library):
    """A default task encoder that does not decode (the samples keep their bytes): times reading."""

    class Raw(library.DefaultTaskEncoder):
        decoder = None

    return Raw()


def run_retrying(path: str, workers: int, args, storage_options: dict | None, library: str, crashes: list[str]) -> tuple[float, int]:
    """:func:`run`, again (up to 3 times) when Energon's run crashes: its forked workers reuse the
    parent's connections and sometimes read corrupt bytes (the crash is counted, not hidden)."""
    for attempt in range(3):
        try:
            return run(path, workers, args, storage_options, library)
        except Exception as exc:
            if library != "energon" or attempt == 2:
                raise
            crashes.append(f"{type(exc).__name__}: {str(exc)[:120]}")
            print(f"{library} crashed ({type(exc).__name__}: {exc}); running it again", file=sys.stderr)
    raise AssertionError("unreachable")


def timed(loader, args) -> tuple[float, int]:
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
    parser.add_argument("--energon", action="store_true", help="Also Energon 7.4.1 through the latency proxy (MSC).")
    parser.add_argument("--raw", action="store_true", help="Samples keep their bytes (no image decoding): times the reads alone.")
    parser.add_argument("--skip-no-read-ahead", action="store_true", help="Leave out the (slow) row with read-ahead off.")
    parser.add_argument("--skip-prefetch-off", action="store_true", help="Leave out the row with prefetch off.")
    parser.add_argument("--ceiling", action="store_true", help="Also what the S3 server and proxy serve with no loader: "
                        "whole-shard GETs as fast as 1 and 2 processes of 8 threads ask for them (requests/s).")
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
        if args.energon:
            os.environ["MSC_CONFIG"] = str(write_msc_config(work, server.info))

        slow = f"S3 + {args.latency_ms:g} ms"
        # (label, library, proxy, storage options, environment)
        cells = [("local disk", "ours", None, None, {})]
        cells.append(("S3 (moto)", "ours", "plain", server.options("plain"), {}))
        cells.append((f"{slow}/request", "ours", "slow", server.options("slow"), {}))
        # Small shards read through their .tar.idx (two requests each) instead of whole (one).
        cells.append((f"{slow}, whole-shard GET off", "ours", "slow", server.options("slow"), {"ENERGON_LITE_WHOLE_SHARD_BYTES": "0"}))
        if not args.skip_prefetch_off:
            cells.append((f"{slow}, prefetch off", "ours", "slow", server.options("slow"), {"ENERGON_LITE_PREFETCH_SLICES": "0"}))
        if not args.skip_no_read_ahead:
            cells.append((f"{slow}, no read-ahead, prefetch off", "ours", "slow", server.options("slow"), {"ENERGON_LITE_BLOCK_SIZE": "0", "ENERGON_LITE_PREFETCH_SLICES": "0"}))
        if args.energon:
            cells.append((f"{slow}, Energon 7.4.1 (MSC)", "energon", "slow", None, {}))
        results: dict[tuple[str, int], list[tuple[float, float | None, float | None]]] = {}
        crashes: dict[tuple[str, int], list[str]] = {}
        bar = tqdm(total=len(cells) * len(args.workers) * args.repeats, desc="measuring", unit="run", file=sys.stderr)
        for _ in range(args.repeats):
            for label, library, proxy, options, environment in cells:
                for workers in args.workers:
                    os.environ.update(environment)
                    shutil.rmtree(work / "cache", ignore_errors=True)
                    if proxy:
                        server.call("reset", proxy)
                    path = str(local) if proxy is None else (f"msc://{BUCKET}/captioning" if library == "energon" else url)
                    try:
                        speed, samples = run_retrying(path, workers, args, options, library, crashes.setdefault((label, workers), []))
                    finally:
                        for name in environment:
                            os.environ.pop(name, None)
                    requests = fetched = None
                    if proxy:
                        stats = server.call("stats", proxy)
                        requests = stats["requests"] / samples
                        fetched = stats["bytes_forwarded"] / (samples * used_per_sample)
                    results.setdefault((label, workers), []).append((speed, requests, fetched))
                    bar.update()
        bar.close()
        if args.ceiling:
            ceilings = {(proxy, processes): serving_ceiling(url, server.options(proxy), args.shards, processes) for proxy in ("plain", "slow") for processes in (1, 2)}
        rows = []
        for (label, workers), runs in results.items():
            speeds = [r[0] for r in runs]
            requests = [r[1] for r in runs if r[1] is not None]
            fetched = [r[2] for r in runs if r[2] is not None]
            rows.append((label, workers, statistics.median(speeds), statistics.median(requests) if requests else None, statistics.median(fetched) if fetched else None, speeds))
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)

    print(f"\ncaptioning set{' (not decoded)' if args.raw else ''}: {args.shards} x {args.samples_per_shard} samples, {used_per_sample / 1024:.1f} KiB each; "
          f"batch {args.batch_size}, {args.batches} timed batches after {args.warmup}, median of {args.repeats}\n")
    local_speed = {workers: speed for label, workers, speed, *_ in rows if label == "local disk"}
    energon_speed = {workers: speed for label, workers, speed, *_ in rows if "Energon" in label}
    print("| source | workers | samples/s | of local | x Energon | GETs per sample | bytes fetched per byte used | runs (samples/s) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for label, workers, speed, requests, fetched, speeds in rows:
        req = "-" if requests is None else f"{requests:.3f}"
        amp = "-" if fetched is None else f"{fetched:.2f}"
        share = f"{speed / local_speed[workers]:.0%}" if workers in local_speed else "-"
        versus = f"{speed / energon_speed[workers]:.1f}" if workers in energon_speed else "-"
        runs = ", ".join(f"{v:,.0f}" for v in speeds)
        failed = crashes.get((label, workers)) or []
        runs += f" ({len(failed)} crashed and were run again)" if failed else ""
        print(f"| {label} | {workers} | {speed:,.0f} | {share} | {versus} | {req} | {amp} | {runs} |")
    for (label, workers), failed in crashes.items():
        for message in failed:
            print(f"\n{label}, {workers} workers, crashed: {message}")
    print("\nGETs and bytes count everything the proxy served during the run (index files and listings included).")
    if args.ceiling:
        print("\nThe store alone (no loader): whole-shard GETs through s3fs, 8 threads per process, for "
              f"{CEILING_S:g} s after 1 s of warm-up\n")
        print("| proxy | processes | GETs/s | samples/s at one GET per shard |")
        print("| --- | ---: | ---: | ---: |")
        for (proxy, processes), rate in ceilings.items():
            label = "S3 (moto)" if proxy == "plain" else f"S3 + {args.latency_ms:g} ms"
            print(f"| {label} | {processes} | {rate:,.0f} | {rate * args.samples_per_shard:,.0f} |")
    return 0


CEILING_S = 5.0


def _get_shards(url: str, options: dict, shards: int, seconds: float, results) -> None:
    """One process: 8 threads GET whole shards round-robin; puts the GETs done in ``seconds``."""
    from concurrent.futures import ThreadPoolExecutor

    from megatron_energon_lite.storage import RemotePath

    names = list(RemotePath(f"{url}/shards", options).glob("*.tar"))[:shards]
    done = [0]
    stop_at = [0.0]

    def loop(offset: int) -> None:
        i = offset
        while time.perf_counter() < stop_at[0]:
            names[i % len(names)].read_bytes()
            done[0] += 1
            i += 8

    for warm in (True, False):
        stop_at[0] = time.perf_counter() + (1.0 if warm else seconds)
        done[0] = 0
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(loop, range(8)))
    results.put(done[0] / seconds)


def serving_ceiling(url: str, options: dict, shards: int, processes: int) -> float:
    """GETs/s the server and proxy serve to ``processes`` processes asking as fast as they can."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    workers = [context.Process(target=_get_shards, args=(url, options, shards, CEILING_S, results)) for _ in range(processes)]
    for worker in workers:
        worker.start()
    rate = sum(results.get() for _ in workers)
    for worker in workers:
        worker.join()
    return rate


def write_msc_config(work: Path, info: dict) -> Path:
    """An MSC profile named like the bucket, rooted at it, whose S3 endpoint is the latency proxy."""
    profile = {
        "storage_provider": {"type": "s3", "options": {"base_path": BUCKET, "endpoint_url": info["endpoints"]["slow"], "region_name": info["region"]}},
        "credentials_provider": {"type": "S3Credentials", "options": {"access_key": info["key"], "secret_key": info["secret"]}},
    }
    path = work / "msc_config.json"
    path.write_text(json.dumps({"profiles": {BUCKET: profile}}))
    return path


if __name__ == "__main__":
    sys.exit(main())
