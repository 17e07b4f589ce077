"""Auxiliary data: a crude dataset whose samples read 64 KiB-4 MiB files of an ``aux:`` folder.

The folder is (a) local and (b) on a local S3 server (moto) behind a proxy that adds
``--latency-ms`` (20 ms) to every request.  For each source, without a cache pool (the cooker
reads the file directly) and with a ``FileStoreCachePool`` of each ``--budget-mib`` (16 MiB, which
binds, and 1024 MiB, which never does), the same crude dataset is read by this library and by
Energon 7.4.1 (``megatron.energon``), one full epoch per run (``repeat=False``), 2 dataloader
workers.  Reported per configuration:

* samples/s: the epoch's samples over the time from ``iter(loader)`` to its end (worker start-up
  included: the first batch waits for the shuffle buffers to fill, so timing from the first batch
  would credit the reads done before it; the time to the first batch is shown too);
* bytes fetched per byte used: bytes read from the aux folder over the sum, over the samples
  delivered, of the size of the aux file each sample used.  Each file is used by two samples, so
  perfect sharing of fetches gives 0.50 and one read per sample 1.00.  For S3 "fetched" is the
  proxy's ``bytes_forwarded`` (every response body it served); for the local folder it is counted
  by wrapping ``SystemFileStore.__getitem__`` of each library (every read of a folder file goes
  through it, the cache pools' background fetches included) in the main process before the
  workers fork;
* requests per sample (S3): every request the proxy served, over the samples;
* peak cache folder size against the pool's budget: a thread of the main process walks the
  pool's ``parent_cache_dir`` (which holds one ``cache_*`` folder per process) every 5 ms and keeps
  the largest total.  The budget (``max_cache_size``) is per pool object and every worker has its
  own copy of the pool (forked), so the folder may hold up to ``workers x budget``: that is the
  limit printed next to the peak.

Data: ``--samples`` samples in 8 tar shards of a crude dataset (one ``json`` part per sample:
``{"file": "f00012.bin", "size": ...}``, a path relative to the aux folder) and ``ceil(samples /
2)`` aux files of random bytes whose sizes are log-uniform in 64 KiB..4 MiB (seeded).  Samples
``2k`` and ``2k+1`` use file ``k``: neighbours in a shard, so both references are usually in the
same worker within a shuffle buffer of each other, which is when a cache pool can serve both from
one fetch (the shared entry).  The dataset is read with shuffle buffer 32, batch 8 and
``max_samples_per_sequence`` 50.

The cooker is the same for both libraries (their APIs match): with the pool
``@cooker(need_cache=True)`` and ``cache.get_lazy(media, name)`` in the cooker, ``lazy.get(sample)``
in ``encode_sample`` (cooking happens before the shuffle buffer, so the fetch runs in the
background while the worker prepares other samples); without it ``media.get(name, sample)`` in the
cooker.  ``encode_sample`` computes ``zlib.crc32`` of the bytes and returns a ``TextSample`` with
``"<size>:<crc>"``, which the main process checks against the generated files.

Energon reads object storage only through Multi-Storage Client (``msc://`` paths): its S3 rows
use the aux folder ``filesystem+msc://benchaux/media`` with an MSC profile (written to a JSON file
named by ``MSC_CONFIG``) whose S3 endpoint is the same latency proxy; ours use
``filesystem+s3://bench/media`` (fsspec/s3fs, ``configure_storage("s3", ...)``).  One prepared
dataset serves both libraries (``prepare_dataset`` writes Energon's on-disk format).

Stalls: Energon 7.4.1's ``FileStoreCachePool`` can deadlock when the budget binds.  A consumer
whose file is being fetched sets ``entry.require_data_now``, notifies and waits for the fetch; if
the fetch thread has not reached its wait-for-room loop yet, it then waits on the condition first
and checks ``require_data_now`` only after a wake-up that never comes (the worker's only consumer is
the one blocked): ``_cache_out_task`` and ``_get_data`` in ``megatron/energon/cache/
file_cache_pool.py``.  A run that delivers no batch for ``--stall-timeout`` seconds (torch's
DataLoader ``timeout``) is abandoned, counted in "runs ok" and left out of the medians.

The S3 server and the proxy run in a process of their own (so they do not share the loader's
interpreter lock).  Runs alternate ours, Energon, ours, Energon, ...; the table shows medians of
``--repeats`` runs (peak cache: the largest of them) and the ratio ours/Energon.  Example::

    .venv/bin/python benchmarks/bench_aux.py --samples 256 --repeats 3 --workers 2 --budget-mib 16 1024
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import io
import json
import logging
import math
import multiprocessing
import os
import shutil
import statistics
import sys
import tarfile
import tempfile
import threading
import time
import warnings
import zlib
from pathlib import Path
from typing import Any

import numpy as np
from energon_lite_dev.s3server import S3ServerProcess

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.storage import configure_storage

BUCKET = "bench"
PROFILE = "benchaux"
CRUDE = "__module__: megatron.energon\n__class__: CrudeWebdataset\n"
SHARDS = 8
MIN_SIZE, MAX_SIZE = 64 * 1024, 4 * 1024 * 1024
MiB = 1024 * 1024


# -- the S3 server ------------------------------------------------------------------------------


# -- data ---------------------------------------------------------------------------------------


def generate(work: Path, samples: int, seed: int) -> tuple[dict[str, tuple[int, int]], int]:
    """Writes ``work/media`` (aux files) and ``work/crude`` (the prepared crude dataset).
    Returns {file name: (size, crc32)} and the sum over samples of the size of their file."""
    rng = np.random.default_rng(seed)
    files = math.ceil(samples / 2)
    sizes = np.exp(rng.uniform(math.log(MIN_SIZE), math.log(MAX_SIZE), files)).astype(np.int64)
    media = work / "media"
    media.mkdir(parents=True)
    table: dict[str, tuple[int, int]] = {}
    for j, size in enumerate(sizes):
        name = f"f{j:05d}.bin"
        data = rng.bytes(int(size))
        (media / name).write_bytes(data)
        table[name] = (int(size), zlib.crc32(data))
    per_shard = math.ceil(samples / SHARDS)
    used = 0
    (work / "crude/parts").mkdir(parents=True)
    for shard in range(SHARDS):
        with tarfile.open(work / f"crude/parts/data-{shard:02d}.tar", "w") as tar:
            for i in range(shard * per_shard, min(samples, (shard + 1) * per_shard)):
                name = f"f{i // 2:05d}.bin"
                used += table[name][0]
                payload = json.dumps({"file": name, "size": table[name][0]}).encode()
                info = tarfile.TarInfo(f"{i:06d}.json")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    prepare_dataset(work / "crude", split_ratio=(1, 0, 0), progress=False, dataset_yaml=CRUDE)
    return table, used


def write_yaml(work: Path, name: str, aux: str) -> Path:
    path = work / name
    path.write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    path: crude\n"
        f"    aux:\n      media: {aux}\n"
    )
    return path


def write_msc_config(work: Path, info: dict) -> Path:
    config = {
        "profiles": {
            PROFILE: {
                "storage_provider": {
                    "type": "s3",
                    "options": {"base_path": BUCKET, "endpoint_url": info["endpoints"]["slow"], "region_name": info["region"]},
                },
                "credentials_provider": {
                    "type": "S3Credentials",
                    "options": {"access_key": info["key"], "secret_key": info["secret"]},
                },
            }
        }
    }
    path = work / "msc_config.json"
    path.write_text(json.dumps(config))
    return path


# -- counting reads of aux folder files ----------------------------------------------------------

READ_BYTES = multiprocessing.get_context("fork").Value("q", 0)
READ_COUNT = multiprocessing.get_context("fork").Value("q", 0)


def count_reads(store_class: type) -> None:
    """Wraps ``store_class.__getitem__`` so every read adds to READ_BYTES (shared with the forked
    workers)."""
    original = store_class.__getitem__

    def __getitem__(self, key):
        result = original(self, key)
        with READ_BYTES.get_lock():
            READ_BYTES.value += len(result[0])
            READ_COUNT.value += 1
        return result

    store_class.__getitem__ = __getitem__


# -- the two libraries ---------------------------------------------------------------------------


class Library:
    """The same task encoder and loader calls, for ``megatron_energon_lite`` or ``megatron.energon``."""

    def __init__(self, name: str) -> None:
        self.name = name
        if name == "ours":
            import megatron_energon_lite as m
            from megatron_energon_lite.cache import FileStoreCachePool, SystemFileStore
        else:
            import megatron.energon as m
            from megatron.energon.cache import FileStoreCachePool, SystemFileStore
        self.m = m
        self.FileStoreCachePool = FileStoreCachePool
        count_reads(SystemFileStore)

        if name == "ours":
            @dataclasses.dataclass
            class AuxSample(m.Sample):
                data: Any = None
                size: int = 0
        else:
            @m.edataclass
            class AuxSample(m.Sample):
                data: Any = None
                size: int = 0

        @m.stateless
        @m.cooker(need_cache=True)
        def cook_cached(sample: dict, media, cache):
            meta = sample["json"]
            return AuxSample(**m.basic_sample_keys(sample), data=cache.get_lazy(media, meta["file"]), size=meta["size"])

        @m.stateless
        def cook_direct(sample: dict, media):
            meta = sample["json"]
            data = media.get(meta["file"], sample)
            return AuxSample(**m.basic_sample_keys(sample), data=data, size=meta["size"])

        def make_encoder(cook):
            class AuxEncoder(m.DefaultTaskEncoder):
                cookers = [m.Cooker(cook)]  # noqa: RUF012

                @m.stateless
                def encode_sample(self, sample):
                    data = sample.data if isinstance(sample.data, (bytes, bytearray, memoryview)) else sample.data.get(sample)
                    return m.TextSample(
                        __key__=sample.__key__, __restore_key__=sample.__restore_key__,
                        __subflavors__=sample.__subflavors__, text=f"{len(data)}:{zlib.crc32(data)}",
                    )

            return AuxEncoder

        self.encoders = {False: make_encoder(cook_direct), True: make_encoder(cook_cached)}

    def loader(self, path: Path, args, pool):
        m = self.m
        dataset = m.get_train_dataset(
            str(path),
            worker_config=m.WorkerConfig(rank=0, world_size=1, num_workers=args.workers),
            batch_size=args.batch_size,
            shuffle_buffer_size=args.shuffle_buffer,
            max_samples_per_sequence=args.max_samples_per_sequence,
            task_encoder=self.encoders[pool is not None](),
            repeat=False,
        )
        loader = m.get_loader(dataset, cache_pool=pool) if pool is not None else m.get_loader(dataset)
        # torch's DataLoader raises RuntimeError("DataLoader timed out ...") when no batch arrives
        # for this long (Energon's own watchdog only warns), so a deadlocked run ends.
        loader.timeout = args.stall_timeout
        return loader


class Stalled(Exception):
    """No batch arrived for ``--stall-timeout`` seconds (the run is abandoned)."""


# -- one run ------------------------------------------------------------------------------------


class FolderSampler(threading.Thread):
    """Samples the total size of the files under ``root`` every ``interval`` s; keeps the peak."""

    def __init__(self, root: Path, interval: float = 0.005) -> None:
        super().__init__(daemon=True)
        self.root, self.interval = root, interval
        self.peak = 0
        self.stop_event = threading.Event()

    @staticmethod
    def size(path: Path) -> int:
        total = 0
        try:
            entries = list(os.scandir(path))
        except OSError:
            return 0
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    total += FolderSampler.size(Path(entry.path))
                else:
                    total += entry.stat(follow_symlinks=False).st_size
            except OSError:  # removed while walking
                pass
        return total

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.peak = max(self.peak, self.size(self.root))
            self.stop_event.wait(self.interval)

    def finish(self) -> int:
        self.stop_event.set()
        self.join()
        self.peak = max(self.peak, self.size(self.root))
        return self.peak


def run_once(lib: Library, yaml: Path, args, budget_mib: float | None, work: Path, table: dict, s3: S3ServerProcess | None, proxied: bool) -> dict:
    cache_parent = work / "cache_pool"
    shutil.rmtree(cache_parent, ignore_errors=True)
    cache_parent.mkdir()
    pool = None
    if budget_mib is not None:
        pool = lib.FileStoreCachePool(parent_cache_dir=cache_parent, num_workers=args.pool_threads,
                                      max_cache_size_gbytes=budget_mib / 1024)
    with READ_BYTES.get_lock():
        READ_BYTES.value = 0
        READ_COUNT.value = 0
    if proxied:
        s3.call("reset", "slow")
    sampler = FolderSampler(cache_parent)
    sampler.start()
    loader = lib.loader(yaml, args, pool)
    expected = {f"{size}:{crc}" for size, crc in table.values()}
    count, used, first_at = 0, 0, None
    start = time.perf_counter()
    try:
        for batch in loader:
            for text in batch.text:
                if text not in expected:
                    raise AssertionError(f"{lib.name}: unexpected sample result {text!r}")
                used += int(text.split(":")[0])
            count += len(batch.text)
            if first_at is None:
                first_at = time.perf_counter()
    except RuntimeError as exc:
        if "timed out" not in str(exc):
            raise
        stalled = f"no batch for {args.stall_timeout:g} s after {count} of {args.samples} samples"
    else:
        stalled = None
    end = time.perf_counter()
    del loader
    gc.collect()  # shuts the workers down before the next run
    peak = sampler.finish()
    if pool is not None:
        pool.close()
    del pool
    if stalled:
        raise Stalled(stalled)
    if count != args.samples:
        raise AssertionError(f"{lib.name}: {count} samples delivered, expected {args.samples}")
    result = {
        "speed": count / (end - start),
        "startup": first_at - start,
        "used": used,
        "read_bytes": READ_BYTES.value,
        "reads": READ_COUNT.value,
        "peak": peak,
    }
    if proxied:
        stats = s3.call("stats", "slow")
        result["fetched"] = stats["bytes_forwarded"]
        result["requests"] = stats["requests"]
    else:
        result["fetched"] = READ_BYTES.value
        result["requests"] = None
    return result


# -- main ---------------------------------------------------------------------------------------


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=256, help="Samples in the crude dataset (one epoch per run).")
    parser.add_argument("--repeats", type=int, default=3, help="Runs per cell; the table shows medians.")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--budget-mib", type=float, nargs="+", default=[16.0, 1024.0],
                        help="FileStoreCachePool max_cache_size in MiB (per pool, i.e. per worker process); one pool row per value.")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="Added by the proxy to every S3 request.")
    parser.add_argument("--pool-threads", type=int, default=8, help="FileStoreCachePool num_workers (both libraries' default).")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--shuffle-buffer", type=int, default=32)
    parser.add_argument("--max-samples-per-sequence", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stall-timeout", type=float, default=20.0, help="Abandon a run when no batch arrives for this long (counted as a stall).")
    parser.add_argument("--skip-energon", action="store_true")
    parser.add_argument("--skip-s3", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    warnings.filterwarnings("ignore", message=".*pin_memory.*")  # torch, no GPU here

    work = Path(tempfile.mkdtemp(prefix="bench-aux-"))
    os.environ["ENERGON_LITE_CACHE_DIR"] = str(work / "lite_cache")
    s3 = None
    notes: list[str] = []
    try:
        print(f"generating {args.samples} samples and {math.ceil(args.samples / 2)} aux files ...", file=sys.stderr)
        table, used_total = generate(work, args.samples, args.seed)
        media_bytes = sum(size for size, _ in table.values())
        sources = [("local", write_yaml(work, "local.yaml", "filesystem://./media"), None)]
        if not args.skip_s3:
            s3 = S3ServerProcess(BUCKET, {"slow": args.latency_ms / 1000})
            print("uploading the aux folder to moto ...", file=sys.stderr)
            s3.call("upload", str(work / "media"), f"s3://{BUCKET}/media")
            configure_storage("s3", storage_options=s3.options("slow"))
            os.environ["MSC_CONFIG"] = str(write_msc_config(work, s3.info))
            sources.append((f"S3 + {args.latency_ms:g} ms", write_yaml(work, "s3.yaml", f"filesystem+s3://{BUCKET}/media"),
                            write_yaml(work, "msc.yaml", f"filesystem+msc://{PROFILE}/media")))

        libs = {"ours": Library("ours")}
        if not args.skip_energon:
            libs["energon"] = Library("energon")

        rows = []
        for label, yaml, energon_yaml in sources:
            for budget in [None, *args.budget_mib]:
                cell = "direct" if budget is None else f"pool {budget:g} MiB"
                results: dict[str, list[dict]] = {name: [] for name in libs}
                stalls: dict[str, list[str]] = {name: [] for name in libs}
                errors: dict[str, str] = {}
                for rep in range(args.repeats):
                    for name, lib in libs.items():
                        if name in errors:
                            continue
                        path = yaml if name == "ours" or energon_yaml is None else energon_yaml
                        print(f"  {label:>14} | {cell:>14} | {name:>7} | run {rep + 1}/{args.repeats} ...", file=sys.stderr, end=" ", flush=True)
                        try:
                            result = run_once(lib, path, args, budget, work, table, s3, proxied=energon_yaml is not None)
                        except Stalled as exc:
                            stalls[name].append(str(exc))
                            print(f"stalled: {exc}", file=sys.stderr)
                            continue
                        except Exception as exc:  # noqa: BLE001 - reported in the table
                            errors[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                            print(f"failed: {errors[name]}", file=sys.stderr)
                            continue
                        results[name].append(result)
                        print(f"{result['speed']:.1f} samples/s, fetched/used {result['fetched'] / result['used']:.2f}, "
                              f"peak cache {result['peak'] / MiB:.1f} MiB, start-up {result['startup']:.1f} s", file=sys.stderr)
                for name in libs:
                    runs = results[name]
                    row = {"source": label, "budget": budget, "lib": name, "ok": len(runs), "stalls": stalls[name], "error": errors.get(name)}
                    if runs:
                        row.update(
                            speed=statistics.median(r["speed"] for r in runs),
                            amp=statistics.median(r["fetched"] / r["used"] for r in runs),
                            requests=None if runs[0]["requests"] is None else statistics.median(r["requests"] / args.samples for r in runs),
                            peak=max(r["peak"] for r in runs) if budget is not None else None,
                            startup=statistics.median(r["startup"] for r in runs),
                        )
                    rows.append(row)
    finally:
        if s3 is not None:
            s3.stop()
        shutil.rmtree(work, ignore_errors=True)

    print(
        f"\naux data: {args.samples} samples, {len(table)} aux files ({media_bytes / MiB:.0f} MiB, 64 KiB-4 MiB "
        f"log-uniform, each used by 2 samples; {used_total / MiB:.0f} MiB used per epoch); {args.workers} workers, "
        f"batch {args.batch_size}, shuffle buffer {args.shuffle_buffer}; pool: {args.pool_threads} threads, budget "
        f"{' or '.join(f'{b:g}' for b in args.budget_mib)} MiB per pool (one pool per worker process); "
        f"S3 latency {args.latency_ms:g} ms/request; median of {args.repeats} (peak: max of {args.repeats})\n"
    )
    print("| aux folder | pool | library | samples/s | ours/Energon | fetched/used | requests/sample | peak cache MiB / limit | start-up s | runs ok |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    speeds = {(r["source"], r["budget"], r["lib"]): r.get("speed") for r in rows}
    for r in rows:
        pool = "none" if r["budget"] is None else f"FileStoreCachePool {r['budget']:g} MiB"
        ok = f"{r['ok']}/{args.repeats}"
        if r["stalls"]:
            ok += f" ({len(r['stalls'])} stalled)"
            notes.append(f"{r['lib']}, {r['source']}, {pool}: {len(r['stalls'])} of {args.repeats} runs stalled ({'; '.join(r['stalls'])})")
        if r["error"]:
            notes.append(f"{r['lib']}, {r['source']}, {pool}: failed: {r['error']}")
        if "speed" not in r:
            print(f"| {r['source']} | {pool} | {r['lib']} | - | - | - | - | - | - | {ok} |")
            continue
        other = speeds.get((r["source"], r["budget"], "energon"))
        ratio = f"{r['speed'] / other:.2f}x" if r["lib"] == "ours" and other else "-"
        peak = "-"
        if r["peak"] is not None:
            limit = r["budget"] * args.workers
            over = " OVER" if r["peak"] > limit * MiB else ""
            peak = f"{r['peak'] / MiB:.2f} / {limit:g}{over}"
        print(f"| {r['source']} | {pool} | {r['lib']} | {fmt(r['speed'], ',.1f')} | {ratio} | {fmt(r['amp'], '.2f')} | "
              f"{fmt(r['requests'], '.2f')} | {peak} | {fmt(r['startup'], '.1f')} | {ok} |")
    print(
        "\nsamples/s: the whole epoch, from iter(loader) to its end.  start-up: time to the first batch.  "
        "fetched/used: bytes read from the aux folder (S3: the proxy's bytes_forwarded; local: bytes returned by "
        "SystemFileStore reads, counted by a wrapper) over the sizes of the files the delivered samples used "
        "(0.50 = every file read once for its 2 samples, 1.00 = once per sample).  requests/sample: every request "
        "the S3 proxy served, over the samples.  peak cache: the largest total size of the pool's parent_cache_dir "
        "seen by a thread sampling every 5 ms, against the budget x workers (each worker has its own pool copy; "
        "OVER marks a peak above it).  "
        "runs ok: runs that finished; a run with no batch for --stall-timeout s is abandoned and left out of the "
        "medians.  Energon's S3 rows read the aux folder through MSC (msc://), ours through s3fs (s3://)."
    )
    for note in notes:
        print(note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
