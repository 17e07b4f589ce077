"""Start-up on object storage: what one rank of a large job sends to the store, ours against
Energon 7.4.1 (issue 39).

One simulated rank (the last of ``--world-size`` ranks; with 20 shards the last of 8, since 200
samples cannot feed 4096 ranks) builds its training dataset from a local S3 server (moto) and
takes batches until every dataloader worker has delivered its first one.  Per run: requests (and
how many were LISTs) and response bytes, counted by a :class:`FaultProxy` in front of the server,
and the time of each phase:

* build: ``get_train_dataset(...)`` (s3fs and Multi-Storage Client imported before; the first
  client session is made inside);
* workers: ``iter(get_loader(ds))`` until each of the ``--workers`` workers (or the main process)
  has delivered its first batch (the loader takes batches from the workers in turn); the
  requests are everything sent until then, read-ahead of other workers included.

The cells: ``--shards`` (20 and 10,000 shards of 10 text samples, prepared once by our
``prepare_dataset``: the same folder for both libraries, since ours writes Energon's format), 0/2/8
workers, and the proxy adding 0 or ``--latency-ms`` to every request.  Ours reads ``s3://`` through
s3fs; Energon reads object storage only through Multi-Storage Client, so its runs read
``msc://<profile>/...`` with an MSC profile whose endpoint is the same proxy.  Every run is a fresh
process with a cold index cache; the libraries alternate; the table shows medians of ``--repeats``.

The last table multiplies a rank's requests and bytes (build and every worker's first batch) by the
world size: what a 4096-rank x 8-worker job sends to the store before every rank has data.

The S3 server and its proxies run in a process of their own (so they do not share the loader's
interpreter lock).  Example (about 10 minutes on 2 cores, generating the data included)::

    .venv/bin/python benchmarks/bench_s3_startup.py --repeats 1 --out benchmarks/results/s3_startup.md
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "dev"))

BUCKET = "startup"
SAMPLES_PER_SHARD = 10
BATCH_SIZE = 2
TEXT_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"
SMALL_WORLD = 8  # the world size for datasets too small for --world-size ranks x 8 workers


# -- the child: one run in a fresh process --------------------------------------------------------


def child(cfg: dict) -> None:
    """Builds and takes the first batches, pausing after each phase so the parent can read the
    proxy's counters (``@@PHASE name seconds`` on stdout, a line on stdin to go on)."""

    def phase(name: str, seconds: float) -> None:
        print(f"@@PHASE {name} {seconds:.6f}", flush=True)
        sys.stdin.readline()

    os.environ["ENERGON_LITE_CACHE_DIR"] = cfg["cache"]
    # The storage clients are imported before the clock starts (both libraries import them lazily).
    import multistorageclient  # noqa: F401
    import s3fs  # noqa: F401

    if cfg["lib"] == "ours":
        from megatron_energon_lite import WorkerConfig, get_loader, get_train_dataset

        extra = {"storage_options": cfg["options"]}
        path = cfg["url"]
    else:
        os.environ["MSC_CONFIG"] = cfg["msc_config"]
        from megatron.energon import WorkerConfig, get_loader, get_train_dataset

        extra = {}
        path = cfg["msc_url"]
    phase("ready", 0.0)
    start = time.perf_counter()
    ds = get_train_dataset(
        path,
        batch_size=BATCH_SIZE,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=cfg["world_size"] - 1, world_size=cfg["world_size"], num_workers=cfg["workers"]),
        **extra,
    )
    phase("build", time.perf_counter() - start)
    start = time.perf_counter()
    loader = iter(get_loader(ds))
    firsts = []
    for _ in range(max(1, cfg["workers"])):
        next(loader)
        firsts.append(time.perf_counter() - start)
    print("@@FIRSTS " + json.dumps(firsts), flush=True)
    phase("workers", firsts[-1])
    sys.stdout.flush()
    os._exit(0)


def run_child(cfg: dict, server, proxy: str) -> dict:
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(cfg)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "dev"), os.environ.get("PYTHONPATH", "")])},
    )  # fmt: skip
    out: dict = {}
    for line in proc.stdout:
        if line.startswith("@@FIRSTS "):
            out["firsts"] = json.loads(line[len("@@FIRSTS ") :])
        elif line.startswith("@@PHASE "):
            _, name, seconds = line.split()
            stats = server.call("stats", proxy)
            server.call("reset", proxy)
            if name != "ready":
                out[name] = {"s": float(seconds), "requests": stats["requests"], "lists": stats["requests_list"], "bytes": stats["bytes_forwarded"]}
            proc.stdin.write("\n")
            proc.stdin.flush()
    proc.wait(timeout=600)
    if "workers" not in out:
        out["error"] = proc.stderr.read()[-3000:]
    return out


# -- data -----------------------------------------------------------------------------------------


def prepared(base: Path, shards: int) -> Path:
    root = base / f"shards-{shards}"
    if (root / ".ready").exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    from megatron_energon_lite.format.prepare import prepare_dataset
    from megatron_energon_lite.synthetic import write_tar

    for shard in range(shards):
        write_tar(root / f"shards/{shard:06d}.tar", [(f"{shard:06d}_{i:02d}", {"txt": f"text {shard} {i}".encode()}) for i in range(SAMPLES_PER_SHARD)])
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=2, dataset_yaml=TEXT_YAML)
    (root / ".ready").write_text("ok\n")
    return root


def msc_config(work: Path, info: dict) -> Path:
    profiles = {
        name: {
            "storage_provider": {"type": "s3", "options": {"base_path": BUCKET, "endpoint_url": endpoint, "region_name": info["region"]}},
            "credentials_provider": {"type": "S3Credentials", "options": {"access_key": info["key"], "secret_key": info["secret"]}},
        }
        for name, endpoint in info["endpoints"].items()
    }
    path = work / "msc_config.json"
    path.write_text(json.dumps({"profiles": profiles}))
    return path


# -- the parent -----------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", default="20,10000")
    parser.add_argument("--workers", default="0,2,8")
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--world-size", type=int, default=4096)
    parser.add_argument("--workers-in-job", type=int, default=8, help="Workers per rank of the whole-job estimate.")
    parser.add_argument("--libs", default="ours,energon")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--data-dir", default=None, help="Keep the generated datasets here (reused).")
    parser.add_argument("--out", default=None, help="Also write the tables to this file.")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return 0

    from energon_lite_dev.s3server import S3ServerProcess

    work = Path(tempfile.mkdtemp(prefix="bench-s3-startup-"))
    data = Path(args.data_dir) if args.data_dir else work / "data"
    latencies = {"plain": 0.0, "slow": args.latency_ms / 1000}
    server = S3ServerProcess(BUCKET, latencies)
    rows = []
    try:
        config = msc_config(work, server.info)
        sizes = [int(s) for s in args.shards.split(",")]
        for shards in sizes:
            root = prepared(data, shards)
            server.call("upload", str(root), f"s3://{BUCKET}/shards-{shards}")
        libs = args.libs.split(",")
        for shards in sizes:
            world = args.world_size if shards * SAMPLES_PER_SHARD >= args.world_size * args.workers_in_job * BATCH_SIZE else SMALL_WORLD
            for workers in [int(w) for w in args.workers.split(",")]:
                for proxy in latencies:
                    results: dict[str, list[dict]] = {lib: [] for lib in libs}
                    for repeat in range(args.repeats):
                        for lib in libs if repeat % 2 == 0 else libs[::-1]:
                            shutil.rmtree(work / "cache", ignore_errors=True)
                            cfg = {
                                "lib": lib, "workers": workers, "world_size": world, "cache": str(work / "cache"),
                                "url": f"s3://{BUCKET}/shards-{shards}", "options": server.options(proxy),
                                "msc_url": f"msc://{proxy}/shards-{shards}", "msc_config": str(config),
                            }  # fmt: skip
                            res = run_child(cfg, server, proxy)
                            results[lib].append(res)
                            print(f"{shards} shards, {workers} workers, {proxy}, {lib}: {json.dumps(res)[:300]}", file=sys.stderr, flush=True)
                    for lib in libs:
                        rows.append((shards, world, workers, args.latency_ms if proxy == "slow" else 0, lib, results[lib]))
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)

    lines = report(rows, args)
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


def med(runs: list[dict], phase: str, key: str) -> float | None:
    values = [r[phase][key] for r in runs if phase in r]
    return statistics.median(values) if values else None


def report(rows, args) -> list[str]:
    lines = [
        f"One rank (the last of the world size shown) of a job reading {SAMPLES_PER_SHARD}-sample text shards from moto "
        f"through a counting proxy; cold index cache; batch {BATCH_SIZE}; median of {args.repeats}. "
        "Ours: s3fs (`s3://`); Energon 7.4.1: Multi-Storage Client (`msc://`). Requests: all / LIST. "
        "'workers' = from `iter(loader)` until every worker delivered its first batch.",
        "",
        "| shards | world | workers | +ms/request | library | build: requests | build: bytes | build s | workers: requests | workers: bytes | first batch s | every worker's first batch s |",
        "| ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for shards, world, workers, latency, lib, runs in rows:
        ok = [r for r in runs if "workers" in r]
        if not ok:
            lines.append(f"| {shards:,} | {world} | {workers} | {latency:g} | {lib} | error: {runs[0].get('error', '?')[-200:]!r} |||||||")
            continue
        first = statistics.median(r["firsts"][0] for r in ok)
        lines.append(
            f"| {shards:,} | {world} | {workers} | {latency:g} | {lib} | {med(ok, 'build', 'requests'):.0f} / {med(ok, 'build', 'lists'):.0f} "
            f"| {med(ok, 'build', 'bytes') / 1024:,.1f} KiB | {med(ok, 'build', 's'):.2f} | {med(ok, 'workers', 'requests'):.0f} / {med(ok, 'workers', 'lists'):.0f} "
            f"| {med(ok, 'workers', 'bytes') / 1024:,.1f} KiB | {first:.2f} | {med(ok, 'workers', 's'):.2f} |"
        )
    lines += [
        "",
        f"What a {args.world_size} x {args.workers_in_job} job sends before every rank has data (a rank's build and its "
        f"{args.workers_in_job} workers' first batches, no added latency, times {args.world_size} ranks):",
        "",
        "| shards | library | requests | of which LIST | bytes |",
        "| ---: | --- | ---: | ---: | ---: |",
    ]
    for shards, world, workers, latency, lib, runs in rows:
        ok = [r for r in runs if "workers" in r]
        if world != args.world_size or workers != args.workers_in_job or latency != 0 or not ok:
            continue
        requests = (med(ok, "build", "requests") + med(ok, "workers", "requests")) * world
        lists = (med(ok, "build", "lists") + med(ok, "workers", "lists")) * world
        size = (med(ok, "build", "bytes") + med(ok, "workers", "bytes")) * world
        lines.append(f"| {shards:,} | {lib} | {requests:,.0f} | {lists:,.0f} | {size / 1e9:.2f} GB |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
