"""Where a text loader's CPU goes with workers: per process, per sample, and the bound it sets.

With N workers on as many cores, the loader cannot go faster than the cores divided by the CPU
every sample costs in all processes together.  This measures, on the text shards that
``benchmarks/bench_loader.py --data-dir DIR`` generated (or a small generated set):

- p: the pipeline in this process alone, per sample (what the 0-worker loader pays);
- at ``--workers`` workers: each worker's CPU per sample it made (p plus its hand-over, h) and
  the main process's (m), read from ``/proc/<pid>/stat`` around the timed batches;
- the bound ``cores * p / (p + h + m)``: the most N workers can give over 0 workers when all
  cores are busy, next to the measured ratio.

    .venv/bin/python benchmarks/bench_cpu_split.py --data-dir /work/scratch/bench_full --rounds 3

Rounds alternate the 0-worker and the N-worker measurement; medians are printed.  Each
measurement runs in a fresh Python process: in one process, a loader measured after another ran
slower (the main process's CPU per sample up by a third), the earlier loader's objects and
workers lingering until the garbage collector ends them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of one process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


def loader(root: Path, workers: int):
    from megatron_energon_lite import (
        DefaultTaskEncoder,
        WorkerConfig,
        get_savable_loader,
        get_train_dataset,
    )

    dataset = get_train_dataset(root, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers), batch_size=32,
                                shuffle_buffer_size=100, max_samples_per_sequence=100, task_encoder=DefaultTaskEncoder())
    return get_savable_loader(dataset)


def measure(root: Path, workers: int, batches: int) -> dict:
    it = iter(loader(root, workers))
    for _ in range(50):  # warm-up: workers started, buffers full
        next(it)
    me = os.getpid()
    kids = children(me)
    before = {pid: cpu_seconds(pid) for pid in [me, *kids]}
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
    elapsed = time.perf_counter() - start
    used = {pid: cpu_seconds(pid) - before[pid] for pid in before}
    samples = batches * 32
    del it
    return {
        "rate": samples / elapsed,
        "main_us": 1e6 * used[me] / samples,
        # Each worker makes samples / workers of them.
        "worker_us": [1e6 * used[pid] / (samples / max(workers, 1)) for pid in kids],
    }


def measure_in_fresh_process(root: Path, workers: int, batches: int) -> dict:
    command = [sys.executable, __file__, "--one", str(root), str(workers), "--batches", str(batches)]
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, help="bench_loader.py's --data-dir (its text shards)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batches", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one", nargs=2, metavar=("ROOT", "WORKERS"), help=argparse.SUPPRESS)  # a measurement's own process
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure(Path(args.one[0]), int(args.one[1]), args.batches)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        if args.data_dir is not None:
            root = args.data_dir / "text"
        else:
            from megatron_energon_lite.synthetic import (
                TEXT_SAMPLE_YAML,
                generate_text_dataset,
            )

            from megatron_energon_lite.format.prepare import prepare_dataset

            root = Path(tmp) / "text"
            generate_text_dataset(root, num_shards=4, samples_per_shard=2500, seed=0)
            prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=TEXT_SAMPLE_YAML)
        zero, many = [], []
        for k in range(args.rounds):
            order = [0, args.workers] if k % 2 == 0 else [args.workers, 0]
            for workers in order:
                result = measure_in_fresh_process(root, workers, args.batches)
                (zero if workers == 0 else many).append(result)
                cpu = f"main {result['main_us']:.1f} us" + "".join(f", worker {w:.1f} us" for w in result["worker_us"])
                print(f"round {k + 1}, {workers} workers: {result['rate']:,.0f} samples/s; CPU per sample: {cpu}")
        p = statistics.median(r["main_us"] for r in zero)
        worker = statistics.median(w for r in many for w in r["worker_us"])
        m = statistics.median(r["main_us"] for r in many)
        cores = min(os.cpu_count() or 1, args.workers)
        bound = cores * p / (worker + m)
        measured = statistics.median(r["rate"] for r in many) / statistics.median(r["rate"] for r in zero)
        print(f"\nmedians: p = {p:.1f} us (0 workers), worker = p + h = {worker:.1f} us, main m = {m:.1f} us per sample")
        print(f"bound with {cores} busy cores: {cores} * p / (p + h + m) = {bound:.2f}x; measured {args.workers} workers / 0 workers: {measured:.2f}x")


if __name__ == "__main__":
    main()
