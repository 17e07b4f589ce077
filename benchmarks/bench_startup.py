"""Start-up cost of a training loader, ours against Energon 7.4: ``get_train_dataset`` (build) and
the first batch, as the number of shards grows and for one rank of a large topology.

Issue "Resolve once, start in O(1)": building the dataset and getting the first batch should cost
about the same for 20 shards as for 10,000, and building one rank's dataset should not depend on the
world size.  Usage (the table in the report; 2 to 3 minutes on 2 cores, generating the data included):

    .venv/bin/python benchmarks/bench_startup.py --shards 20,10000 --repeats 3

Options: ``--data-dir DIR`` keeps the generated and prepared datasets there (reused when present,
one ``shards-N`` folder per shard count; default: a temp folder removed at the end),
``--libs ours,ours-nocache,energon`` (``ours-nocache``: ours on the same dataset without the
split cache that our prepare writes, as for a dataset Energon prepared), ``--no-topology`` (skip
part 2), ``--warm`` (part 1 once more with imports warmed: in the same fresh process, a build and
a first batch on a 2-shard dataset before the timed calls, so lazily imported modules are not
counted; the measured dataset is still cold).

Datasets: ``N`` tiny WebDataset shards of 10 text samples (``synthetic.write_tar``), prepared once by
our ``prepare_dataset(split_ratio=(1, 0, 0))`` with a ``TextSample`` dataset.yaml; ours and Energon
read the same folder (ours writes Energon's format).

Every measurement is a fresh ``python`` process (this script with ``--child``), so nothing cached in
memory and no import carries over.  The child times, with ``time.perf_counter()``: the import of
the library's public API (``get_train_dataset``, ``get_loader``, ``WorkerConfig``), then
``get_train_dataset(path, batch_size=4, shuffle_buffer_size=None, max_samples_per_sequence=None,
worker_config=...)`` (build), then ``next(iter(get_loader(ds)))`` (first batch) and prints one JSON
line.  Import is reported on its own and is not part of build or first batch; a module that the
library imports lazily during the build is counted in the build (the ``+mods`` column: modules
newly in ``sys.modules`` after the build).  Ours and Energon run alternately (which goes first
alternates per repeat); the table gives medians over ``--repeats``.

Part 1: build and first batch with ``WorkerConfig(rank=0, world_size=1, num_workers=0)`` for each
shard count, and the ratio largest / smallest shard count per library (target for ours: <= 1.5x).

Part 2, on the largest dataset: the build alone for rank 4095 of world size 4096 with 8 workers per
rank (32,768 workers, ~3 samples each with 10,000 shards) and, for comparison, rank 0 of world size
1 with 8 workers (target for ours: <= 50 ms whatever the world size); the first batch is measured
only with ``num_workers=0`` (rank 4095 of 4096), since ``get_loader`` would start 8 worker processes.
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
import time
from pathlib import Path

SAMPLES_PER_SHARD = 10
BATCH_SIZE = 4
LIBS = ("ours", "ours-nocache", "energon")
#: "ours-nocache" reads the same dataset without prepare's split cache (``.lite-split-cache.json``),
#: as it would a dataset that Energon prepared: the same shards, a copy of .nv-meta without it.
NOCACHE = "-nocache"
TEXT_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"
READY = ".bench_startup_ready"  # written into a data folder once it is generated and prepared


# -- the child: one measurement in a fresh process -----------------------------------------------


def child(cfg: dict) -> None:
    out: dict = {}
    phase = "import"
    try:
        start = time.perf_counter()
        if cfg["lib"].startswith("ours"):
            from megatron_energon_lite import WorkerConfig, get_loader, get_train_dataset
        else:
            from megatron.energon import WorkerConfig, get_loader, get_train_dataset
        out["import"] = time.perf_counter() - start

        def build(path, rank=0, world_size=1, num_workers=0):
            return get_train_dataset(
                path,
                batch_size=BATCH_SIZE,
                shuffle_buffer_size=None,
                max_samples_per_sequence=None,
                worker_config=WorkerConfig(rank=rank, world_size=world_size, num_workers=num_workers),
            )

        if cfg.get("warm_path"):
            # Imports warmed: a build and a first batch on another (tiny) dataset first, so modules
            # that the library imports lazily are loaded; nothing about the measured dataset is.
            phase = "warm-up"
            next(iter(get_loader(build(cfg["warm_path"]))))

        phase = "build"
        if cfg["lib"] == "ours-nocache":
            cfg["path"] += NOCACHE
        modules = len(sys.modules)
        start = time.perf_counter()
        ds = build(cfg["path"], cfg["rank"], cfg["world_size"], cfg["num_workers"])
        out["build"] = time.perf_counter() - start
        out["modules"] = len(sys.modules) - modules

        if cfg["first_batch"]:
            phase = "first batch"
            start = time.perf_counter()
            batch = next(iter(get_loader(ds)))
            out["first_batch"] = time.perf_counter() - start
            out["batch_len"] = len(batch.text) if hasattr(batch, "text") else None
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        out["error"] = f"{phase}: {type(exc).__name__}: {exc}"[:2000]
    print("@@BENCH " + json.dumps(out), flush=True)
    # Skip interpreter teardown (loader/dataset finalizers): not measured, only slows the run down.
    sys.stdout.flush()
    os._exit(0)


def measure(cfg: dict) -> dict:
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(cfg)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    for line in done.stdout.splitlines():
        if line.startswith("@@BENCH "):
            return json.loads(line[len("@@BENCH ") :])
    return {"error": f"no result (exit {done.returncode}): {(done.stderr or done.stdout)[-2000:]}"}


# -- data ----------------------------------------------------------------------------------------


def prepared_dataset(base: Path, shards: int) -> Path:
    """``base/shards-N``: generated and prepared once, reused when a previous run finished it."""
    root = base / f"shards-{shards}"
    if (root / READY).exists():
        print(f"reusing {root}", file=sys.stderr, flush=True)
        _without_split_cache(root)
        return root
    if root.exists():
        shutil.rmtree(root)
    from megatron_energon_lite.synthetic import make_text, write_tar

    from megatron_energon_lite.format.prepare import prepare_dataset

    start = time.perf_counter()
    for shard in range(shards):
        samples = [
            (f"{shard:05d}_{i:04d}", {"txt": make_text((shard, i), max_words=40).encode()})
            for i in range(SAMPLES_PER_SHARD)
        ]
        write_tar(root / f"shards/{shard // 100:03d}/shard_{shard:05d}.tar", samples)
    generated = time.perf_counter() - start
    start = time.perf_counter()
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=2, dataset_yaml=TEXT_YAML)
    (root / READY).write_text("ok\n")
    _without_split_cache(root)
    print(
        f"{shards} shards: generated in {generated:.1f} s, prepared in {time.perf_counter() - start:.1f} s",
        file=sys.stderr,
        flush=True,
    )
    return root


def _without_split_cache(root: Path) -> None:
    """``root-nocache``: the shards of ``root`` (a link) and a copy of its .nv-meta without the
    split cache."""
    from megatron_energon_lite.format.split_cache import SPLIT_CACHE

    other = root.with_name(root.name + NOCACHE)
    if other.exists():
        shutil.rmtree(other)
    other.mkdir()
    (other / "shards").symlink_to(root / "shards")
    shutil.copytree(root / ".nv-meta", other / ".nv-meta", ignore=shutil.ignore_patterns(SPLIT_CACHE))


# -- the parent ----------------------------------------------------------------------------------


def run_alternating(case: dict, libs: list[str], repeats: int, label: str) -> dict[str, list[dict]]:
    """Runs ``case`` for each library ``repeats`` times, the libraries alternating."""
    results: dict[str, list[dict]] = {lib: [] for lib in libs}
    for repeat in range(repeats):
        order = libs if repeat % 2 == 0 else list(reversed(libs))
        for lib in order:
            cfg = dict(case, lib=lib)
            res = measure(cfg)
            results[lib].append(res)
            shown = ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in res.items())
            print(f"{label}, repeat {repeat}, {lib}: {shown}", file=sys.stderr, flush=True)
    return results


def med(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if key in r]
    return statistics.median(values) if values else None


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def cell(runs: list[dict], key: str) -> str:
    """The median in ms; 'error' when no run got that far because of an error."""
    value = med(runs, key)
    if value is None and any("error" in r for r in runs):
        return "error"
    return ms(value)


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def errors(runs: dict[str, list[dict]]) -> list[str]:
    seen = []
    for lib, rs in runs.items():
        for r in rs:
            if "error" in r and f"{lib}: {r['error']}" not in seen:
                seen.append(f"{lib}: {r['error']}")
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", default="20,10000", help="comma-separated shard counts (default 20,10000)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--libs", default=",".join(LIBS), help="comma-separated: " + ", ".join(LIBS))
    parser.add_argument("--data-dir", type=Path, default=None, help="keep (and reuse) the prepared datasets here")
    parser.add_argument("--no-topology", action="store_true", help="skip part 2 (rank 4095 of 4096)")
    parser.add_argument(
        "--warm", action="store_true", help="part 1 also with imports warmed (a build on a 2-shard dataset first)"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return

    shard_counts = sorted(int(s) for s in args.shards.split(",") if s.strip())
    libs = [lib.strip() for lib in args.libs.split(",") if lib.strip()]
    if not shard_counts or any(lib not in LIBS for lib in libs):
        parser.error("bad --shards or --libs")
    if args.data_dir is not None:
        args.data_dir.mkdir(parents=True, exist_ok=True)
        base, temporary = args.data_dir, False
    else:
        base, temporary = Path(tempfile.mkdtemp(prefix="bench-startup-")), True

    started = time.perf_counter()
    lines: list[str] = []
    problems: list[str] = []
    try:
        paths = {n: prepared_dataset(base, n) for n in shard_counts}

        # Part 1: build + first batch vs number of shards.
        part1: dict[int, dict[str, list[dict]]] = {}
        for n in shard_counts:
            case = {"path": str(paths[n]), "rank": 0, "world_size": 1, "num_workers": 0, "first_batch": True}
            part1[n] = run_alternating(case, libs, args.repeats, f"{n} shards")
            problems += [f"{n} shards, {e}" for e in errors(part1[n])]
        part1_warm: dict[int, dict[str, list[dict]]] = {}
        if args.warm:
            warm_path = str(prepared_dataset(base, 2))
            for n in shard_counts:
                case = {"path": str(paths[n]), "rank": 0, "world_size": 1, "num_workers": 0, "first_batch": True}
                part1_warm[n] = run_alternating(dict(case, warm_path=warm_path), libs, args.repeats, f"{n} shards, warm")
                problems += [f"{n} shards, imports warm, {e}" for e in errors(part1_warm[n])]

        lines.append(
            f"## 1. Build + first batch vs number of shards ({SAMPLES_PER_SHARD} text samples per shard, "
            f"batch_size {BATCH_SIZE}, rank 0 of 1, num_workers 0; fresh process each; median of {args.repeats}, ms)\n"
        )
        lines.append("| shards | lib | import | build | first batch | build + first batch | +mods in build |")
        lines.append("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
        totals: dict[tuple[int, str], float | None] = {}
        for n in shard_counts:
            for lib in libs:
                runs = part1[n][lib]
                totals[n, lib] = med([{"t": r["build"] + r["first_batch"]} for r in runs if "first_batch" in r], "t")
                mods = med(runs, "modules")
                lines.append(
                    f"| {n} | {lib} | {cell(runs, 'import')} | {cell(runs, 'build')} | {cell(runs, 'first_batch')} | "
                    f"{ms(totals[n, lib])} | "
                    f"{'-' if mods is None else int(mods)} |"
                )
        if len(shard_counts) >= 2:
            lo, hi = shard_counts[0], shard_counts[-1]
            lines.append(f"\nratio {hi} shards / {lo} shards (target for ours: build + first batch <= 1.5x):\n")
            lines.append("| lib | build | first batch | build + first batch |")
            lines.append("| --- | ---: | ---: | ---: |")
            for lib in libs:
                lines.append(
                    f"| {lib} | {ratio(med(part1[hi][lib], 'build'), med(part1[lo][lib], 'build'))} | "
                    f"{ratio(med(part1[hi][lib], 'first_batch'), med(part1[lo][lib], 'first_batch'))} | "
                    f"{ratio(totals[hi, lib], totals[lo, lib])} |"
                )
        if {"ours", "energon"} <= set(libs):
            lines.append("\nours / energon:\n")
            lines.append("| shards | import | build | first batch | build + first batch |")
            lines.append("| ---: | ---: | ---: | ---: | ---: |")
            for n in shard_counts:
                o, e = part1[n]["ours"], part1[n]["energon"]
                lines.append(
                    f"| {n} | {ratio(med(o, 'import'), med(e, 'import'))} | {ratio(med(o, 'build'), med(e, 'build'))} | "
                    f"{ratio(med(o, 'first_batch'), med(e, 'first_batch'))} | "
                    f"{ratio(totals[n, 'ours'], totals[n, 'energon'])} |"
                )

        if args.warm:
            lines.append(
                "\nimports warmed (in the same fresh process, a build and a first batch on a 2-shard dataset "
                "before the timed calls; median, ms):\n"
            )
            lines.append("| shards | lib | build | first batch | build + first batch | +mods in build |")
            lines.append("| ---: | --- | ---: | ---: | ---: | ---: |")
            warm_totals: dict[tuple[int, str], float | None] = {}
            for n in shard_counts:
                for lib in libs:
                    runs = part1_warm[n][lib]
                    warm_totals[n, lib] = med(
                        [{"t": r["build"] + r["first_batch"]} for r in runs if "first_batch" in r], "t"
                    )
                    mods = med(runs, "modules")
                    lines.append(
                        f"| {n} | {lib} | {cell(runs, 'build')} | {cell(runs, 'first_batch')} | "
                        f"{ms(warm_totals[n, lib])} | {'-' if mods is None else int(mods)} |"
                    )
            if len(shard_counts) >= 2:
                lo, hi = shard_counts[0], shard_counts[-1]
                lines.append(
                    f"\nimports warmed, ratio {hi} / {lo} shards: "
                    + ", ".join(
                        f"{lib} build {ratio(med(part1_warm[hi][lib], 'build'), med(part1_warm[lo][lib], 'build'))}"
                        f", build + first batch {ratio(warm_totals[hi, lib], warm_totals[lo, lib])}"
                        for lib in libs
                    )
                )

        # Part 2: one rank of a big topology, on the largest dataset.
        if not args.no_topology:
            n = shard_counts[-1]
            topologies = [
                ("rank 0 of 1, 8 workers", 0, 1, 8, False),
                ("rank 4095 of 4096, 8 workers", 4095, 4096, 8, False),
                ("rank 4095 of 4096, 0 workers", 4095, 4096, 0, True),
            ]
            part2 = {}
            for label, rank, world, workers, first in topologies:
                case = {"path": str(paths[n]), "rank": rank, "world_size": world, "num_workers": workers, "first_batch": first}
                part2[label] = run_alternating(case, libs, args.repeats, f"{n} shards, {label}")
                problems += [f"{n} shards, {label}, {e}" for e in errors(part2[label])]
            lines.append(
                f"\n## 2. One rank of a big topology ({n} shards; fresh process each; median of {args.repeats}, ms; "
                "target for ours: build <= 50 ms whatever the world size)\n"
            )
            header = "| worker config | " + " | ".join(f"{lib} build | {lib} first batch" for lib in libs)
            both = {"ours", "energon"} <= set(libs)
            lines.append(header + (" | build ours / energon |" if both else " |"))
            lines.append("| --- |" + " ---: | ---: |" * len(libs) + (" ---: |" if both else ""))
            for label, *_ in topologies:
                cells = []
                for lib in libs:
                    cells += [cell(part2[label][lib], "build"), cell(part2[label][lib], "first_batch")]
                row = f"| {label} | " + " | ".join(cells) + " |"
                if both:
                    row += f" {ratio(med(part2[label]['ours'], 'build'), med(part2[label]['energon'], 'build'))} |"
                lines.append(row)
            lines.append("\n(first batch '-': not measured, get_loader would start 8 worker processes; 'error': see below)")
    finally:
        if temporary:
            shutil.rmtree(base, ignore_errors=True)

    if problems:
        lines.append("\nerrors:")
        lines += [f"- {p}" for p in problems]
    lines.append(
        f"\n(python {sys.version.split()[0]}, {os.cpu_count()} CPUs; whole run {time.perf_counter() - started:.0f} s; "
        f"load average at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())})"
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
