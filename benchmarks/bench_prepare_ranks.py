"""``prepare`` on one process against ``prepare`` across ranks (torchrun, gloo) on one machine.

The shards are generated once; every run starts from a fresh ``cp -a`` copy without
``.nv-meta/`` or ``.tar.idx`` (a full prepare).  Configurations (the CLI as a subprocess, so
start-up and imports count for all of them; they alternate, the first one rotating per repeat):

* ``1 process, N workers``: ``energon-lite prepare --num-workers N``, today's single-machine way;
* ``torchrun R ranks x W workers``: ``torchrun --nproc-per-node R -m megatron_energon_lite.cli.main
  prepare --num-workers W`` (each rank scans its byte-balanced share, rank 0 merges);
* ``--rank: R ranks x W workers`` (config ``RxWf``): R processes ``energon-lite prepare --rank r
  --world-size R --num-workers W`` started side by side, meeting through the dataset folder (no
  torch import, no rendezvous).

On one machine the ranks only share its cores: this measures what the split and the merge cost
(and torchrun's start), not what more nodes bring.  Reported: median wall time over ``--repeats``.

    .venv/bin/python benchmarks/bench_prepare_ranks.py --shards 300 --samples-per-shard 200 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMON = ["--non-interactive", "--split-ratio", "8,1,1", "--skip-dataset-yaml", "--no-progress"]
CLI = [sys.executable, "-m", "megatron_energon_lite.cli.main", "prepare"]


def generate(root: Path, shards: int, samples_per_shard: int) -> None:
    from megatron_energon_lite.synthetic import make_text, write_tar

    for shard in range(shards):
        # Uneven shards (1x to 3x), so that a share by bytes is not a share by count.
        count = samples_per_shard * (1 + shard % 3)
        samples = [(f"{shard:05d}_{i:05d}", {"txt": make_text((shard, i), max_words=40).encode()}) for i in range(count)]
        write_tar(root / f"shards/{shard // 100:03d}/{shard:05d}.tar", samples)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def commands(config: str, root: Path) -> list[list[str]]:
    """The processes of one run, started side by side."""
    ranks, workers = (int(v) for v in config.rstrip("f").split("x"))
    flags = [str(root), *COMMON, "--num-workers", str(workers)]
    if ranks == 1:
        return [[*CLI, *flags]]
    if config.endswith("f"):
        return [[*CLI, *flags, "--rank", str(rank), "--world-size", str(ranks)] for rank in range(ranks)]
    return [[
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-addr", "127.0.0.1",
        "--master-port", str(_free_port()), "-m", "megatron_energon_lite.cli.main", "prepare", *flags,
    ]]


def label(config: str) -> str:
    ranks, workers = (int(v) for v in config.rstrip("f").split("x"))
    if ranks == 1:
        return f"1 process, {workers} worker(s)"
    return f"{'--rank' if config.endswith('f') else 'torchrun'}: {ranks} ranks x {workers} worker(s)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=300)
    parser.add_argument("--samples-per-shard", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--configs", default="1x1,1x2,2x1,2x1f", help="RANKSxWORKERS[f], comma-separated (f: --rank)")
    parser.add_argument("--compare-with", default=None, metavar="DIR",
                        help="Also run every configuration with the package of another checkout (e.g. a `git archive` of an "
                        "earlier commit), alternating with this one's; its rows are marked 'before'.")
    args = parser.parse_args()
    configs = args.configs.split(",")
    if args.compare_with:
        configs = [variant for config in configs for variant in (config, f"{config}@before")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    before_env = {**env, "PYTHONPATH": os.pathsep.join([args.compare_with or "", env.get("PYTHONPATH", "")])}
    with tempfile.TemporaryDirectory(prefix="bench-prepare-ranks-") as tmp:
        source = Path(tmp) / "source"
        generate(source, args.shards, args.samples_per_shard)
        size = sum(p.stat().st_size for p in source.rglob("*.tar"))
        times: dict[str, list[float]] = {c: [] for c in configs}
        for repeat in range(args.repeats):
            for config in configs[repeat % len(configs) :] + configs[: repeat % len(configs)]:
                copy = Path(tmp) / "copy"
                shutil.rmtree(copy, ignore_errors=True)
                subprocess.run(["cp", "-a", str(source), str(copy)], check=True)
                start = time.perf_counter()
                shape, _, variant = config.partition("@")
                run_env = before_env if variant else env
                processes = [subprocess.Popen(c, env=run_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for c in commands(shape, copy)]
                outputs = [p.communicate()[0] for p in processes]
                elapsed = time.perf_counter() - start
                if any(p.returncode != 0 for p in processes):
                    sys.exit(f"{config} failed:\n" + "\n".join(o[-2000:] for o in outputs))
                times[config].append(elapsed)
    print(f"{args.shards} shards, {size / 1e6:.1f} MB, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"median of {args.repeats} (alternating)\n")
    print("| configuration | wall time (s) | all runs (s) |\n|---|---|---|")
    for config in configs:
        runs = ", ".join(f"{t:.2f}" for t in times[config])
        shape, _, variant = config.partition("@")
        print(f"| {label(shape)}{', before' if variant else ''} | {statistics.median(times[config]):.2f} | {runs} |")


if __name__ == "__main__":
    main()
