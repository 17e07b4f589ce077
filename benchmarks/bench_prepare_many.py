"""``prepare`` on many tiny shards, ours against Energon 7.4: full run, unchanged re-run, and a
re-run after one shard was rewritten (with one more sample).

The shards are generated once; every run then works on a fresh ``cp -a`` copy of them, so ours and
Energon index byte-identical files.  The tools run alternately (which one goes first alternates per
repeat) as subprocesses of their command-line tools, so process start and imports are counted the
same way for both; start-up alone (``TOOL prepare --help``) is timed separately and reported on its
own.
Reported times are medians over ``--repeats``.  Usage (the table in the report):

    .venv/bin/python benchmarks/bench_prepare_many.py --shards 2000 10000 --repeats 3

Both tools run non-interactively with ``--split-ratio 8,1,1 --num-workers 2 --skip-dataset-yaml
--no-progress`` (re-runs add ``--force-overwrite``).  Energon re-indexes every shard on a re-run;
ours re-scans only shards whose size or mtime changed (``scanned`` column: ours from its summary
line, Energon always all), and with the same shards and few of them changed it updates a copy of
its previous ``index.sqlite`` instead of building a new one.  A last row times ours' ``prepare_dataset`` call alone, after the
process started and imported it (the part of the one-shard re-run that prepare itself costs).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
COMMON = ["--non-interactive", "--split-ratio", "8,1,1", "--skip-dataset-yaml", "--no-progress"]
TOOLS = {
    "ours": [str(BIN / "energon-lite"), "prepare"],
    "energon": [str(BIN / "energon"), "prepare"],
}
RUNS = ("full prepare", "re-run, nothing changed", "re-run, one shard rewritten")
API_RUN = "re-run, one shard rewritten: the API call alone"
# Ours only: prepare_dataset timed inside a fresh process, after its imports (no start-up).
API_SCRIPT = """
import sys, time
from megatron_energon_lite.format.prepare import prepare_dataset
start = time.perf_counter()
result = prepare_dataset(sys.argv[1], split_ratio=(8, 1, 1), num_workers=int(sys.argv[2]), progress=False, force_overwrite=True)
print(time.perf_counter() - start, len(result.scanned))
"""


def generate(root: Path, shards: int, samples_per_shard: int) -> None:
    from megatron_energon_lite.synthetic import make_text, write_tar

    for shard in range(shards):
        samples = [
            (f"{shard:05d}_{i:04d}", {"txt": make_text((shard, i), max_words=40).encode()})
            for i in range(samples_per_shard)
        ]
        write_tar(root / f"shards/{shard // 100:03d}/shard_{shard:05d}.tar", samples)


def rewrite_one(root: Path, samples_per_shard: int) -> None:
    """Rewrites the middle shard with ``samples_per_shard + 1`` samples (new size and mtime)."""
    from megatron_energon_lite.synthetic import make_text, write_tar

    shards = sorted(root.glob("shards/*/*.tar"))
    path = shards[len(shards) // 2]
    shard = int(path.stem.split("_")[1])
    samples = [
        (f"{shard:05d}_{i:04d}", {"txt": make_text((shard, i, 1), max_words=40).encode()})
        for i in range(samples_per_shard + 1)
    ]
    write_tar(path, samples)
    os.sync()


def timed(cmd: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-3000:]}")
    return seconds, done.stdout


def scanned_count(tool: str, output: str, shards: int) -> int:
    if tool == "energon":
        return shards
    found = re.search(r"\((\d+) scanned, (\d+) unchanged\)", output)
    return int(found.group(1)) if found else -1


def run_tool(tool: str, pristine: Path, work: Path, args: argparse.Namespace, shards: int) -> list[tuple[float, int]]:
    if work.exists():
        shutil.rmtree(work)
    subprocess.run(["cp", "-a", str(pristine), str(work)], check=True)
    os.sync()  # the copy's writeback must not run during the timed prepare
    cmd = [*TOOLS[tool], str(work), "--num-workers", str(args.num_workers), *COMMON]
    rows = []
    seconds, out = timed(cmd)
    rows.append((seconds, scanned_count(tool, out, shards)))
    seconds, out = timed([*cmd, "--force-overwrite"])
    rows.append((seconds, scanned_count(tool, out, shards)))
    rewrite_one(work, args.samples_per_shard)
    seconds, out = timed([*cmd, "--force-overwrite"])
    rows.append((seconds, scanned_count(tool, out, shards)))
    if tool == "ours":
        rewrite_one(work, args.samples_per_shard + 1)
        _, out = timed([sys.executable, "-c", API_SCRIPT, str(work), str(args.num_workers)])
        seconds, scanned = out.split()
        rows.append((float(seconds), int(scanned)))
    shutil.rmtree(work)
    return rows


def startup(tool: str, repeats: int) -> float:
    """``TOOL prepare --help``: process start and the imports of the prepare command."""
    timed([*TOOLS[tool], "--help"])  # warm the page cache
    return statistics.median(timed([*TOOLS[tool], "--help"])[0] for _ in range(max(3, repeats)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, nargs="+", default=[2000, 10000])
    parser.add_argument("--samples-per-shard", type=int, default=10)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tools", nargs="+", default=list(TOOLS), choices=list(TOOLS))
    parser.add_argument("--workdir", type=Path, default=None, help="where to put the shards (default: a temp folder)")
    args = parser.parse_args()

    base = Path(tempfile.mkdtemp(prefix="bench-prepare-many-", dir=args.workdir))
    lines = []
    try:
        start_times = {tool: startup(tool, args.repeats) for tool in args.tools}
        for shards in args.shards:
            pristine = base / f"pristine-{shards}"
            start = time.perf_counter()
            generate(pristine, shards, args.samples_per_shard)
            print(f"generated {shards} shards in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
            results: dict[str, list[list[tuple[float, int]]]] = {tool: [] for tool in args.tools}
            for repeat in range(args.repeats):
                order = args.tools if repeat % 2 == 0 else list(reversed(args.tools))
                for tool in order:
                    rows = run_tool(tool, pristine, base / "work", args, shards)
                    results[tool].append(rows)
                    print(f"{shards} shards, repeat {repeat}, {tool}: " + ", ".join(f"{s:.2f} s ({n})" for s, n in rows), file=sys.stderr, flush=True)
            shutil.rmtree(pristine)
            lines.append(f"\n{shards} shards x {args.samples_per_shard} samples, --num-workers {args.num_workers}, median of {args.repeats}\n")
            header = "| run | " + " | ".join(f"{tool} s (scanned)" for tool in args.tools)
            lines.append(header + (" | ours / energon |" if len(args.tools) == 2 else " |"))
            lines.append("| --- |" + " ---: |" * (len(args.tools) + (1 if len(args.tools) == 2 else 0)))
            for i, name in enumerate((*RUNS, API_RUN)):
                cells, medians = [], {}
                for tool in args.tools:
                    if i >= len(results[tool][0]):
                        cells.append("n/a")
                        continue
                    medians[tool] = statistics.median(r[i][0] for r in results[tool])
                    cells.append(f"{medians[tool]:.2f} ({results[tool][0][i][1]})")
                ratio = f" {medians['ours'] / medians['energon']:.2f} |" if len(medians) == 2 else (" |" if len(args.tools) == 2 else "")
                lines.append(f"| {name} | " + " | ".join(cells) + " |" + ratio)
        lines.append("\nstart-up alone (`TOOL prepare --help`, median): " + ", ".join(f"{tool} {s:.2f} s" for tool, s in start_times.items()))
        lines.append(f"(load average at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())})")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
