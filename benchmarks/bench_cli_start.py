"""Times CLI start-up: `energon-lite --help` / `info DS` against Energon's `energon --help` / `info DS`.

Generates a small captioning dataset (JPEG + caption per sample) and prepares it with
`energon-lite` (which writes Energon's format, so both tools read the same folder). Each command
runs once untimed (warm page cache and .pyc files), then the four commands run in rounds, the
order rotated every round so that a slow moment of the machine hits each command alike. Prints a
Markdown table of median wall times and Energon's time over ours. Run with the project's
environment, e.g.

    .venv/bin/python benchmarks/bench_cli_start.py --repeats 21
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

from megatron_energon_lite.synthetic import generate_captioning_dataset

from megatron_energon_lite.format.dataset_config import render_dataset_yaml
from megatron_energon_lite.format.prepare import prepare_dataset


def commands(dataset: Path) -> dict[str, list[str]]:
    """label -> command line; both console scripts are looked up next to this interpreter."""
    bin_dir = Path(sys.executable).parent
    lite, energon = str(bin_dir / "energon-lite"), str(bin_dir / "energon")
    return {
        "energon-lite --help": [lite, "--help"],
        "energon --help": [energon, "--help"],
        "energon-lite info DS": [lite, "info", str(dataset)],
        "energon info DS": [energon, "info", str(dataset)],
    }


def run_timed(command: list[str], timeout: float) -> float:
    """Wall time of one run; raises with the command's output when it fails."""
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)} exited with {result.returncode}:\n{result.stdout}{result.stderr}")
    return elapsed


def make_dataset(root: Path, *, shards: int, samples_per_shard: int) -> None:
    generate_captioning_dataset(root, num_shards=shards, samples_per_shard=samples_per_shard, image_size=(32, 32))
    yaml = render_dataset_yaml("CaptioningSample", {"image": "jpg", "caption": "txt"})
    prepare_dataset(root, split_ratio=(8, 1, 1), progress=False, num_workers=1, dataset_yaml=yaml)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=21, help="Timed runs of each command.")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--samples-per-shard", type=int, default=50)
    parser.add_argument("--timeout", type=float, default=120, help="Seconds before one run counts as failed.")
    args = parser.parse_args()
    if min(args.repeats, args.shards, args.samples_per_shard) < 1:
        parser.error("--repeats, --shards and --samples-per-shard must be >= 1")

    work = Path(tempfile.mkdtemp(prefix="bench_cli_start_"))
    try:
        dataset = work / "dataset"
        make_dataset(dataset, shards=args.shards, samples_per_shard=args.samples_per_shard)
        runs = commands(dataset)
        for command in runs.values():  # untimed: fails early, and warms the caches
            run_timed(command, args.timeout)
        times: dict[str, list[float]] = {label: [] for label in runs}
        labels = list(runs)
        load_before = os.getloadavg()
        for round_ in range(args.repeats):
            shift = round_ % len(labels)
            for label in labels[shift:] + labels[:shift]:
                times[label].append(run_timed(runs[label], args.timeout))
        load_after = os.getloadavg()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    try:
        energon_version = metadata.version("megatron-energon")
    except metadata.PackageNotFoundError:
        energon_version = "not installed"
    medians = {label: statistics.median(values) for label, values in times.items()}
    print("## CLI start-up benchmark\n")
    print(
        f"Dataset: {args.shards} shards x {args.samples_per_shard} samples (32x32 JPEG + txt + json + cls), prepared by "
        f"energon-lite. Median of {args.repeats} runs per command, rounds alternating; {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, megatron-energon {energon_version}; load average "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after.\n"
    )
    print("| command | median s | min-max s |")
    print("| --- | ---: | ---: |")
    for label, values in times.items():
        print(f"| `{label}` | {medians[label]:.3f} | {min(values):.3f}-{max(values):.3f} |")
    print()
    for what in ("--help", "info DS"):
        ratio = medians[f"energon {what}"] / medians[f"energon-lite {what}"]
        print(f"- `{what}`: energon-lite is {ratio:.1f}x faster than energon")
    print(f"\nBenchmark: {shlex.join([sys.executable, *sys.argv])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
