"""Times `energon prepare` (Megatron Energon 7.4.1) against `energon-lite prepare` on the same shards.

Generates one captioning dataset (JPEG + caption per sample), copies it once per tool, then per
repeat: times the bare CLI start (`--help`), removes `.nv-meta/` and every `*.tar.idx`, runs a full
prepare, re-runs it with `--force-overwrite` on the unchanged dataset, bumps one shard's mtime and
re-runs once more. Prints a Markdown table of median wall times. Run with the project's environment, e.g.

    .venv/bin/python benchmarks/bench_prepare.py --shards 20 --samples-per-shard 1000 --image-size 256
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from megatron_energon_lite.synthetic import generate_captioning_dataset

SCENARIOS = {
    "startup": "CLI startup only (`--help`)",
    "full": "full prepare (no .nv-meta, no .tar.idx)",
    "unchanged": "re-prepare, unchanged (--force-overwrite)",
    "touched": "re-prepare, 1 shard touched (--force-overwrite)",
}


@dataclass
class Timing:
    """Wall times of one (tool, scenario) cell, plus the first failure if any."""

    seconds: list[float] = field(default_factory=list)
    failure: str | None = None


def prepare_flags(num_workers: int) -> list[str]:
    return [
        "--non-interactive", "--split-ratio", "8,1,1", "--sample-type", "CaptioningSample",
        "--field-map", '{"image": "jpg", "caption": "txt"}', "--num-workers", str(num_workers), "--no-progress",
    ]


def tool_commands() -> dict[str, list[str]]:
    """The command prefix of each tool; Energon's CLI is looked up next to this interpreter."""
    energon = Path(sys.executable).parent / "energon"
    return {
        "energon 7.4.1": [str(energon), "prepare"],
        "energon-lite": [sys.executable, "-m", "megatron_energon_lite.cli.main", "prepare"],
    }


def clean(root: Path) -> None:
    """Removes everything prepare writes, so the next run starts from bare shards."""
    shutil.rmtree(root / ".nv-meta", ignore_errors=True)
    for index in root.rglob("*.tar.idx"):
        index.unlink()


def touch(shard: Path) -> None:
    """Moves the shard's mtime forward by a second, so even coarse clocks see a change."""
    stat = shard.stat()
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


def check_result(root: Path, expected_samples: int) -> str | None:
    """A failure message when the prepared metadata does not count every sample, else None."""
    info = root / ".nv-meta" / ".info.json"
    if not info.is_file():
        return f"no {info.relative_to(root)} written"
    counts = json.loads(info.read_text())["shard_counts"]
    if sum(counts.values()) != expected_samples:
        return f".info.json counts {sum(counts.values())} samples, expected {expected_samples}"
    return None


def run_timed(command: list[str], timeout: float) -> tuple[float, str | None]:
    """Runs a command; returns its wall time and a failure message (None on exit code 0)."""
    start = time.perf_counter()
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return time.perf_counter() - start, f"{type(exc).__name__}: {exc}"
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
        return elapsed, f"exit code {result.returncode}: " + " | ".join(tail)
    return elapsed, None


def bench_tool(prefix: list[str], root: Path, flags: list[str], *, repeats: int, expected: int, timeout: float) -> dict[str, Timing]:
    """All scenarios for one tool on its own copy of the dataset; stops at its first failure."""
    timings = {name: Timing() for name in SCENARIOS}
    shards = sorted(root.rglob("*.tar"))
    for repeat in range(repeats):
        clean(root)
        runs = [
            ("startup", [*prefix[:-1], "--help"], None),
            ("full", [*prefix, *flags, str(root)], None),
            ("unchanged", [*prefix, *flags, "--force-overwrite", str(root)], None),
            ("touched", [*prefix, *flags, "--force-overwrite", str(root)], shards[repeat % len(shards)]),
        ]
        for scenario, command, shard_to_touch in runs:
            if shard_to_touch is not None:
                touch(shard_to_touch)
            elapsed, failure = run_timed(command, timeout)
            if scenario != "startup":
                failure = failure or check_result(root, expected)
            if failure:
                timings[scenario].failure = f"{shlex.join(command)}\n    {failure}"
                return timings
            timings[scenario].seconds.append(elapsed)
    return timings


def compare_outputs(a: Path, b: Path) -> list[str]:
    """Notes on where the two tools' outputs differ (tar indexes, shard counts, splits)."""
    notes = []
    indexes = sorted(p.relative_to(a) for p in a.rglob("*.tar.idx"))
    differing = [p for p in indexes if not (b / p).is_file() or (a / p).read_bytes() != (b / p).read_bytes()]
    notes.append(f".tar.idx files byte-identical: {len(indexes) - len(differing)}/{len(indexes)}")
    for name in (".info.json", "split.yaml", "dataset.yaml"):
        left, right = a / ".nv-meta" / name, b / ".nv-meta" / name
        if left.is_file() and right.is_file():
            if name == ".info.json":
                same = json.loads(left.read_text())["shard_counts"] == json.loads(right.read_text())["shard_counts"]
                notes.append(f".info.json shard_counts equal (order included): {same}")
            else:
                notes.append(f"{name} byte-identical: {left.read_bytes() == right.read_bytes()}")
    return notes


def generate(source: Path, args: argparse.Namespace) -> None:
    """Generates the dataset once; a --data-dir with the same parameters is reused."""
    params = {"shards": args.shards, "samples_per_shard": args.samples_per_shard, "image_size": args.image_size, "seed": args.seed}
    marker = source.parent / "source-params.json"
    if source.is_dir() and marker.is_file() and json.loads(marker.read_text()) == params:
        print(f"Reusing the dataset in {source}", file=sys.stderr)
        return
    shutil.rmtree(source, ignore_errors=True)
    marker.unlink(missing_ok=True)
    generate_captioning_dataset(
        source, num_shards=args.shards, samples_per_shard=args.samples_per_shard,
        image_size=(args.image_size, args.image_size), seed=args.seed, num_workers=args.gen_workers, progress=True,
    )
    marker.write_text(json.dumps(params))


def fmt_cell(timing: Timing, samples: int) -> tuple[str, str, str]:
    if timing.failure:
        return "FAILED", "-", "-"
    if not timing.seconds:
        return "not run", "-", "-"
    median = statistics.median(timing.seconds)
    spread = f"{min(timing.seconds):.2f}-{max(timing.seconds):.2f}"
    return f"{median:.2f}", spread, f"{samples / median:,.0f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=20)
    parser.add_argument("--samples-per-shard", type=int, default=1000)
    parser.add_argument("--image-size", type=int, default=256, help="Square JPEG side in pixels.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--num-workers", type=int, default=min(16, os.cpu_count() or 1), help="Passed to both prepare commands.")
    parser.add_argument("--gen-workers", type=int, default=os.cpu_count() or 1, help="Processes generating the shards.")
    parser.add_argument("--data-dir", type=Path, help="Work here (kept, generated data reused) instead of a temp dir.")
    parser.add_argument("--timeout", type=float, default=1800, help="Seconds before one prepare run counts as failed.")
    parser.add_argument("--only", choices=["energon", "lite"], help="Run one tool only.")
    args = parser.parse_args()
    if min(args.shards, args.samples_per_shard, args.image_size, args.repeats, args.num_workers, args.gen_workers) < 1:
        parser.error("--shards, --samples-per-shard, --image-size, --repeats, --num-workers and --gen-workers must be >= 1")

    work = args.data_dir or Path(tempfile.mkdtemp(prefix="bench_prepare_"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        return run(work, args)
    finally:
        if args.data_dir is None:
            shutil.rmtree(work, ignore_errors=True)


def run(work: Path, args: argparse.Namespace) -> int:
    source = work / "source"
    generate(source, args)
    total = args.shards * args.samples_per_shard
    size_mb = sum(p.stat().st_size for p in source.rglob("*.tar")) / 1e6
    flags = prepare_flags(args.num_workers)
    tools = tool_commands()
    if args.only:
        tools = {name: prefix for name, prefix in tools.items() if (name == "energon-lite") == (args.only == "lite")}

    results: dict[str, dict[str, Timing]] = {}
    copies: dict[str, Path] = {}
    for name, prefix in tools.items():
        copy = work / ("copy-" + name.split()[0])
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(source, copy)
        copies[name] = copy
        print(f"Timing {name} ...", file=sys.stderr, flush=True)
        try:
            results[name] = bench_tool(prefix, copy, flags, repeats=args.repeats, expected=total, timeout=args.timeout)
        except Exception as exc:  # one tool's crash must not lose the other tool's figures
            results[name] = {s: Timing(failure=f"benchmark error: {type(exc).__name__}: {exc}") for s in SCENARIOS}

    try:
        energon_version = metadata.version("megatron-energon")
    except metadata.PackageNotFoundError:
        energon_version = "not installed"
    print("## prepare benchmark\n")
    print(
        f"{args.shards} shards x {args.samples_per_shard} samples = {total:,} samples, {args.image_size}x{args.image_size} "
        f"JPEG + txt + json + cls, {size_mb:,.1f} MB; --num-workers {args.num_workers}, median of {args.repeats}; "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, megatron-energon {energon_version}.\n"
    )
    print("| tool | scenario | median s | min-max s | samples/s |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name, timings in results.items():
        for scenario, timing in timings.items():
            median, spread, rate = fmt_cell(timing, total)
            rate = "-" if scenario == "startup" else rate
            print(f"| {name} | {SCENARIOS[scenario]} | {median} | {spread} | {rate} |")
    print("\nCommands (PATH = that tool's copy; re-runs add --force-overwrite):\n")
    for name, prefix in tools.items():
        print(f"    {shlex.join([*prefix, *flags, 'PATH'])}")
    print(f"\nBenchmark: {shlex.join([sys.executable, *sys.argv])}")

    failures = [(name, scenario, t.failure) for name, timings in results.items() for scenario, t in timings.items() if t.failure]
    for name, scenario, failure in failures:
        print(f"\n**{name} failed** ({SCENARIOS[scenario]}):\n\n    {failure}")
    if len(copies) == 2 and not failures:
        print("\nOutput check:\n")
        for note in compare_outputs(*copies.values()):
            print(f"- {note}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
