"""What the stall report costs: samples/s of the same loader with ``stall_report`` off and on.

Captioning (256x256 JPEG + caption, decoded to uint8 CHW tensors) and text shards, batch 32,
shuffle buffer 100, at 0 and 2 workers.  Every measurement is a fresh process; the cells of a
round alternate (off, on; every other round on, off); medians over ``--repeats`` rounds.
``--baseline PATH`` adds a third cell: the same loop with the package found at PATH (e.g. a git
worktree of the commit before the stall report), to measure what the report costs when off.

    .venv/bin/python benchmarks/bench_stall.py --data-dir /tmp/bench_stall --repeats 5
    git worktree add /tmp/before <rev> && \\
        .venv/bin/python benchmarks/bench_stall.py --data-dir /tmp/bench_stall --baseline /tmp/before

The data sets are generated (and prepared) on the first run in ``--data-dir``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD_FLAG = "--child"
CAPTIONING_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: CaptioningSample\nfield_map:\n  image: jpg\n  caption: txt\n"
TEXT_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"


def ensure_data(root: Path) -> dict[str, Path]:
    from megatron_energon_lite.synthetic import (
        generate_captioning_dataset,
        generate_text_dataset,
    )

    from megatron_energon_lite.format.prepare import prepare_dataset

    paths = {"captioning": root / "captioning", "text": root / "text"}
    if not (paths["captioning"] / ".nv-meta").exists():
        generate_captioning_dataset(paths["captioning"], num_shards=4, samples_per_shard=500, image_size=(256, 256), seed=1)
        prepare_dataset(paths["captioning"], split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=CAPTIONING_YAML)
    if not (paths["text"] / ".nv-meta").exists():
        generate_text_dataset(paths["text"], num_shards=4, samples_per_shard=2500, seed=2)
        prepare_dataset(paths["text"], split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=TEXT_YAML)
    return paths


def child(spec: dict) -> None:
    """One measurement: samples/s over ``batches`` batches after ``warmup``."""
    import time

    from megatron_energon_lite import (
        DefaultTaskEncoder,
        WorkerConfig,
        get_savable_loader,
        get_train_dataset,
    )
    from megatron_energon_lite.decode import SampleDecoder

    class Encoder(DefaultTaskEncoder):
        decoder = SampleDecoder(image_decode="torchrgb8")

    config = WorkerConfig(rank=0, world_size=1, num_workers=spec["workers"])
    dataset = get_train_dataset(spec["path"], batch_size=32, shuffle_buffer_size=100, max_samples_per_sequence=100, worker_config=config, task_encoder=Encoder())
    loader = get_savable_loader(dataset, **({"stall_report": True} if spec["on"] else {}))
    it = iter(loader)
    for _ in range(spec["warmup"]):
        next(it)
    start = time.perf_counter()
    for _ in range(spec["batches"]):
        next(it)
    elapsed = time.perf_counter() - start
    summary = loader.stall_report().summary() if spec["on"] else ""
    print(json.dumps({"samples_per_s": spec["batches"] * 32 / elapsed, "summary": summary}))


def measure(spec: dict, pythonpath: str | None) -> dict:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, __file__, CHILD_FLAG, json.dumps(spec)], capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/bench_stall"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--baseline", default=None, help="a checkout of the package before the stall report (its root folder)")
    parser.add_argument(CHILD_FLAG, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(json.loads(args.child))
        return
    paths = ensure_data(args.data_dir)
    sizes = {"captioning": (10, 250), "text": (50, 4000)}
    cells = [("off", False, None), ("on", True, None)] + ([("before", False, args.baseline)] if args.baseline else [])
    print(f"stall report cost: batch 32, {args.repeats} rounds, medians; load average before: {os.getloadavg()[0]:.2f}")
    for name, path in paths.items():
        for workers in args.workers:
            results: dict[str, list[float]] = {cell[0]: [] for cell in cells}
            summary = ""
            for round_ in range(args.repeats):
                for label, on, pythonpath in cells if round_ % 2 == 0 else reversed(cells):
                    warmup, batches = sizes[name]
                    got = measure({"path": str(path), "workers": workers, "on": on, "warmup": warmup, "batches": batches}, pythonpath)
                    results[label].append(got["samples_per_s"])
                    summary = got["summary"] or summary
            medians = {label: statistics.median(values) for label, values in results.items()}
            spread = "  ".join(f"{label} {min(values):,.0f}-{max(values):,.0f}" for label, values in results.items())
            line = f"{name:10s} {workers} workers: off {medians['off']:>9,.0f}  on {medians['on']:>9,.0f} samples/s  on/off {medians['on'] / medians['off']:.3f}"
            if "before" in medians:
                line += f"  before {medians['before']:>9,.0f}  off/before {medians['off'] / medians['before']:.3f}"
            print(line)
            print(f"    runs: {spread}")
            print(f"    {summary}")


if __name__ == "__main__":
    main()
