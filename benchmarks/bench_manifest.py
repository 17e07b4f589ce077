"""What the per-step manifest costs: samples/s of the same text loader without and with
``manifest=DIR`` (issue 41; text is the cheapest per-sample workload, so the worst case).

Text shards (4 x 2500 texts), batch 32, shuffle buffer 100, at ``--workers`` (default 2).  Every
measurement is a fresh process; the two cells of a round alternate (off, on; every other round
on, off); medians over ``--repeats`` rounds.  Also prints the manifest's bytes per sample and
the writer's CPU time per batch in the main process (a figure the machine's noise moves less).

    .venv/bin/python benchmarks/bench_manifest.py --data-dir /tmp/bench_manifest --repeats 3

The data set is generated (and prepared) on the first run in ``--data-dir``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD_FLAG = "--child"
TEXT_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"
BATCH = 32


def ensure_data(root: Path) -> Path:
    from megatron_energon_lite.format.prepare import prepare_dataset
    from megatron_energon_lite.synthetic import generate_text_dataset

    path = root / "text"
    if not (path / ".nv-meta").exists():
        generate_text_dataset(path, num_shards=4, samples_per_shard=2500, seed=2)
        prepare_dataset(path, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=TEXT_YAML)
    return path


def child(spec: dict) -> None:
    """One measurement: samples/s over ``batches`` batches after ``warmup``."""
    import time

    from megatron_energon_lite import WorkerConfig, get_savable_loader, get_train_dataset

    config = WorkerConfig(rank=0, world_size=1, num_workers=spec["workers"])
    dataset = get_train_dataset(spec["path"], batch_size=BATCH, shuffle_buffer_size=100, max_samples_per_sequence=100, worker_config=config)
    loader = get_savable_loader(dataset, manifest=spec["manifest"])
    it = iter(loader)
    for _ in range(spec["warmup"]):
        next(it)
    start = time.perf_counter()
    for _ in range(spec["batches"]):
        next(it)
    elapsed = time.perf_counter() - start
    loader.save_state_rank()  # flushes the manifest
    size = sum(f.stat().st_size for f in Path(spec["manifest"]).glob("rank*.emf")) if spec["manifest"] else 0
    print(json.dumps({"samples_per_s": spec["batches"] * BATCH / elapsed, "bytes": size, "samples": (spec["warmup"] + spec["batches"]) * BATCH}))


def writer_cost() -> tuple[float, float]:
    """Seconds per 32-sample batch (best of 5 passes over 2000 batches) of the loop's own thread
    in ``ManifestWriter.add`` (queueing: the manifest's cost on the hot path), and of all the
    process's CPU time, the writer thread's encoding and writes included (done while the loop
    waits for its next batch, when the loader has workers)."""
    import time

    from megatron_energon_lite.manifest import ManifestWriter

    keys = [("Worker", b % 2, "Batch", b // 2, *[("Webdataset", (b * BATCH + i) * 7919 % 10000) for i in range(BATCH)]) for b in range(2000)]
    loop_best = total_best = float("inf")
    for _ in range(5):
        folder = tempfile.mkdtemp(prefix="manifest-")
        try:
            writer = ManifestWriter(folder, rank=0, world_size=1, num_workers=2, config={"path": "bench"}, data=None, datasets=[])
            total = time.process_time()
            loop = time.thread_time()
            for step, key in enumerate(keys):
                writer.add(step, key)
            loop = time.thread_time() - loop
            writer.close()
            total = time.process_time() - total
        finally:
            shutil.rmtree(folder)
        loop_best, total_best = min(loop_best, loop / len(keys)), min(total_best, total / len(keys))
    return loop_best, total_best


def measure(spec: dict) -> dict:
    out = subprocess.run([sys.executable, __file__, CHILD_FLAG, json.dumps(spec)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/bench_manifest"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--batches", type=int, default=4000)
    parser.add_argument(CHILD_FLAG, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(json.loads(args.child))
        return
    path = ensure_data(args.data_dir)
    print(f"manifest cost: text, batch {BATCH}, {args.workers} workers, {args.repeats} rounds, medians; load average before: {os.getloadavg()[0]:.2f}")
    results: dict[str, list[float]] = {"off": [], "on": []}
    per_sample = []
    for round_ in range(args.repeats):
        for label in ("off", "on") if round_ % 2 == 0 else ("on", "off"):
            folder = tempfile.mkdtemp(prefix="manifest-") if label == "on" else None
            try:
                got = measure({"path": str(path), "workers": args.workers, "manifest": folder, "warmup": args.warmup, "batches": args.batches})
            finally:
                if folder:
                    shutil.rmtree(folder)
            results[label].append(got["samples_per_s"])
            if label == "on":
                per_sample.append(got["bytes"] / got["samples"])
    off, on = statistics.median(results["off"]), statistics.median(results["on"])
    print(f"off {off:,.0f}  on {on:,.0f} samples/s  on/off {on / off:.3f}")
    print("    runs: " + "  ".join(f"{label} " + ", ".join(f"{v:,.0f}" for v in values) for label, values in results.items()))
    print(f"    manifest bytes per sample (headers included): {statistics.median(per_sample):.2f}")
    loop, total = writer_cost()
    between = BATCH / on
    print(f"    the loop's thread in add(): {loop * 1e6:.1f} us per batch of {BATCH} ({loop / between:.1%} of the time between batches at the 'on' median);"
          f" all CPU with the writer thread's: {total * 1e6:.1f} us ({total / between:.1%})")


if __name__ == "__main__":
    main()
