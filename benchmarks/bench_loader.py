"""Compares loading speed of megatron_energon_lite, Megatron Energon 7.4.1 and plain webdataset.

Generates two datasets once (captioning: JPEG + caption per sample; text: variable-length texts),
prepares each ONCE with Energon's own CLI (`energon prepare`; ours reads Energon-prepared datasets
unchanged), then measures every (dataset, worker count, loader) on the same shards with the same
batch size, each measurement in a fresh Python process (`bench_loader_child.py`):

- samples/s over a fixed number of batches after a warm-up;
- time to the first batch, counted from process start, so the loader's import is included;
- save_state_rank(): mean time per call, one call after each of a number of batches (ours, Energon);
- restore: a new loader, restore_state_rank() of the state saved after the last of those calls
  (pickled and unpickled on the way), until its first batch; the batch is compared by sample key
  with the one that followed the save in the original run (ours, Energon);
- peak memory of the process tree (the process and its DataLoader workers), polled: PSS summed
  (from /proc/<pid>/smaps_rollup; shared pages split between the processes) and RSS summed
  (counts pages shared between parent and forked workers once per process).

Images are decoded to uint8 CHW tensors in every loader: ours and Energon with a DefaultTaskEncoder
subclass whose `decoder = SampleDecoder(image_decode="torchrgb8")`, webdataset with
`.decode("torchrgb8")`. Run with the project's environment, e.g.

    .venv/bin/python benchmarks/bench_loader.py --data-dir /tmp/bench_loader
    .venv/bin/python benchmarks/bench_loader.py --quick --only energon
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from energon_lite_dev.synthetic import generate_captioning_dataset, generate_text_dataset

CHILD = Path(__file__).with_name("bench_loader_child.py")
REPO = Path(__file__).resolve().parent.parent
LOADERS = {"ours": "megatron_energon_lite", "energon": "Energon 7.4.1", "webdataset": "webdataset"}
DATASETS = ("captioning", "text")
PREPARE_FLAGS = {
    "captioning": ["--sample-type", "CaptioningSample", "--field-map", '{"image": "jpg", "caption": "txt"}'],
    "text": ["--sample-type", "TextSample", "--field-map", '{"text": "txt"}'],
}
#: The figures of one measurement, in table order: (key, header, format, stateful loaders only).
COLUMNS = [
    ("samples_per_s", "samples/s", "{:,.0f}", False),
    ("first_batch_s", "1st batch s (incl. import)", "{:.2f}", False),
    ("import_s", "import s", "{:.2f}", False),
    ("save_state_ms", "save_state_rank ms", "{:.3f}", True),
    ("shutdown_s", "shutdown s", "{:.2f}", False),
    ("fresh_first_batch_s", "new loader→1st batch s", "{:.2f}", True),
    ("restore_first_batch_s", "restore→1st batch s", "{:.2f}", True),
    ("peak_pss_mb", "peak PSS MB", "{:,.0f}", False),
    ("peak_rss_mb", "peak RSS MB", "{:,.0f}", False),
]
#: For these, smaller is better; for samples/s bigger is. Only used to word the ratio row.
LOWER_IS_BETTER = {key for key, *_ in COLUMNS} - {"samples_per_s"}


# -- data ---------------------------------------------------------------------------------------


def dataset_params(args: argparse.Namespace, name: str) -> dict:
    if name == "captioning":
        return {"shards": args.shards, "samples_per_shard": args.samples_per_shard, "image_size": args.image_size, "seed": args.seed}
    return {"shards": args.text_shards, "samples_per_shard": args.text_samples_per_shard, "max_words": args.max_words, "seed": args.seed}


def prepare_dataset(root: Path, name: str, args: argparse.Namespace) -> None:
    """Generates and prepares one dataset; a --data-dir holding the same parameters is reused."""
    params = dataset_params(args, name)
    marker = root.parent / f"{root.name}-params.json"
    if marker.is_file() and json.loads(marker.read_text()) == params and (root / ".nv-meta" / ".info.json").is_file():
        print(f"Reusing the prepared {name} dataset in {root}", file=sys.stderr)
        return
    shutil.rmtree(root, ignore_errors=True)
    marker.unlink(missing_ok=True)
    common = dict(num_shards=params["shards"], samples_per_shard=params["samples_per_shard"], seed=args.seed,
                  num_workers=args.gen_workers, progress=True)
    if name == "captioning":
        generate_captioning_dataset(root, image_size=(args.image_size, args.image_size), **common)
    else:
        generate_text_dataset(root, max_words=args.max_words, **common)
    command = [*energon_prepare(), "--non-interactive", "--split-ratio", "1,0,0", *PREPARE_FLAGS[name],
               "--num-workers", str(args.gen_workers), "--no-progress", str(root)]
    print(f"Preparing: {shlex.join(command)}", file=sys.stderr, flush=True)
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"energon prepare failed (exit code {result.returncode}):\n{result.stdout}\n{result.stderr}")
    marker.write_text(json.dumps(params))


def energon_prepare() -> list[str]:
    return [str(Path(sys.executable).parent / "energon"), "prepare"]


def warm_page_cache(root: Path) -> None:
    """Reads every shard once, so that no loader pays for cold reads the others do not."""
    for shard in sorted(root.rglob("*.tar")):
        with open(shard, "rb") as file:
            while file.read(1 << 24):
                pass


# -- memory of a process tree ---------------------------------------------------------------------


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as file:
                stat = file.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: the fields after the LAST ')'.
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def _tree(pid: int) -> list[int]:
    children = _children_map()
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, []))
    return tree


def _memory_kb(pid: int) -> tuple[int | None, int | None]:
    """(PSS, RSS) of one process in KiB; PSS is None where smaps_rollup cannot be read."""
    pss = rss = None
    try:
        with open(f"/proc/{pid}/smaps_rollup") as file:
            for line in file:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1])
                    break
    except OSError:
        pass
    try:
        with open(f"/proc/{pid}/status") as file:
            for line in file:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
                    break
    except OSError:
        pass
    return pss, rss


class TreeMemoryPoller(threading.Thread):
    """Polls the summed PSS and RSS of a process and all its descendants; keeps the peaks (KiB)."""

    def __init__(self, pid: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.peak_pss = self.peak_rss = 0
        self.pss_complete = True
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            pss_sum = rss_sum = 0
            for pid in _tree(self.pid):
                pss, rss = _memory_kb(pid)
                if rss is not None and pss is None:
                    self.pss_complete = False
                pss_sum += pss or 0
                rss_sum += rss or 0
            self.peak_pss = max(self.peak_pss, pss_sum)
            self.peak_rss = max(self.peak_rss, rss_sum)
            self._stop_event.wait(self.interval)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


# -- one measurement ----------------------------------------------------------------------------


@dataclass
class Measurement:
    figures: dict = field(default_factory=dict)
    error: str | None = None
    traceback: str = ""
    warnings: list[str] = field(default_factory=list)
    wall_s: float = 0.0


def measure(loader: str, dataset: str, workers: int, root: Path, args: argparse.Namespace) -> Measurement:
    text = dataset == "text"
    cfg = {
        "loader": loader,
        "dataset": dataset,
        "workers": workers,
        "path": str(root),
        "shards": [str(p) for p in sorted(root.rglob("*.tar"))],
        "batch_size": args.batch_size,
        "shuffle_buffer": args.shuffle_buffer,
        "max_samples_per_sequence": args.max_samples_per_sequence,
        "seed": args.seed,
        "warmup": args.text_warmup if text else args.warmup,
        "batches": args.text_batches if text else args.batches,
        "save_calls": args.save_calls,
        "torch_threads": args.torch_threads,
    }
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    cfg["t_spawn"] = time.time()
    process = subprocess.Popen(
        [sys.executable, str(CHILD), json.dumps(cfg)], cwd=REPO, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )
    poller = TreeMemoryPoller(process.pid, args.poll_interval)
    poller.start()
    timed_out = False
    try:
        stdout, stderr = process.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(process.pid, signal.SIGKILL)  # the child's own session: it and its workers only
        stdout, stderr = process.communicate()
    finally:
        poller.stop()
    result = Measurement()
    for line in stdout.splitlines():
        if line.startswith("@@BENCH "):
            result.figures.update(json.loads(line[len("@@BENCH "):]))
    result.wall_s = time.time() - cfg["t_spawn"]
    if "error" in result.figures:
        where = result.figures.pop("where", "").splitlines()[:1]
        result.error = result.figures.pop("error") + (f" [{where[0]}]" if where else "")
        result.traceback = result.figures.pop("traceback", "")
    elif timed_out:
        done = [key for key, *_ in COLUMNS if key in result.figures]
        result.error = f"timed out after {args.timeout:.0f} s (--timeout); measured before that: {', '.join(done) or 'nothing'}"
    elif process.returncode != 0:
        tail = " | ".join(stderr.strip().splitlines()[-3:])
        result.error = f"exit code {process.returncode}: {tail}"
    else:  # memory only of complete runs: a run that stopped early did not hold what a full one does
        result.figures["peak_rss_mb"] = poller.peak_rss / 1024
        if poller.pss_complete:
            result.figures["peak_pss_mb"] = poller.peak_pss / 1024
    seen = set()
    for line in stderr.splitlines():
        stripped = line.strip()
        if "warn" in stripped.lower() and stripped not in seen:
            seen.add(stripped)
            result.warnings.append(stripped[:300])
    if args.verbose and stderr.strip():
        print(stderr.rstrip(), file=sys.stderr)
    return result


def merge(runs: list[Measurement]) -> Measurement:
    """Median of each figure over the repeats; the first error wins."""
    merged = Measurement()
    for key in {k for run in runs for k in run.figures}:
        values = [run.figures[key] for run in runs if key in run.figures]
        merged.figures[key] = statistics.median(values) if all(isinstance(v, (int, float)) for v in values) else values[0]
    merged.error = next((run.error for run in runs if run.error), None)
    merged.wall_s = statistics.median(run.wall_s for run in runs)
    merged.warnings = list(dict.fromkeys(w for run in runs for w in run.warnings))
    return merged


# -- report -------------------------------------------------------------------------------------


def version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as file:
            for line in file:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def fmt(key: str, value) -> str:
    fmt_spec = next(spec for k, _, spec, _ in COLUMNS if k == key)
    return fmt_spec.format(value)


def print_table(dataset: str, results: dict, args: argparse.Namespace, info: str) -> None:
    print(f"\n### {dataset}\n\n{info}\n")
    headers = ["loader", "workers", *(header for _, header, _, _ in COLUMNS), "resume exact", "state KB", "batch"]
    print("| " + " | ".join(headers) + " |")
    print("| --- | ---: | " + " | ".join("---:" for _ in COLUMNS) + " | --- | ---: | --- |")
    for workers in args.workers:
        row_results = {loader: results.get((dataset, workers, loader)) for loader in args.loaders}
        for loader, result in row_results.items():
            if result is None:
                continue
            cells = []
            for key, _, _, stateful in COLUMNS:
                if stateful and loader == "webdataset":
                    cells.append("n/a")
                elif key in result.figures:
                    cells.append(fmt(key, result.figures[key]))
                else:
                    cells.append("-")
            state_kb = f"{result.figures['state_bytes'] / 1024:,.1f}" if "state_bytes" in result.figures else ("n/a" if loader == "webdataset" else "-")
            resume = "n/a" if loader == "webdataset" else result.figures.get("resume_exact", "-")
            cells += [resume, state_kb, result.figures.get("batch", "-")]
            print(f"| {LOADERS[loader]} | {workers} | " + " | ".join(cells) + " |")
            if result.error:
                error = result.error.replace("|", "\\|").replace("\n", " ")
                print(f"| ↳ **{LOADERS[loader]} failed** | {workers} | " + f"{error[:600]} |" + " |" * (len(headers) - 3))
        ours, energon = row_results.get("ours"), row_results.get("energon")
        if ours is not None and energon is not None:
            cells = []
            for key, *_ in COLUMNS:
                a, b = ours.figures.get(key), energon.figures.get(key)
                cells.append(f"{a / b:.2f}x" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else "-")
            print(f"| *ours / Energon* | {workers} | " + " | ".join(cells) + " | | | |")
    if "ours" in args.loaders and "energon" in args.loaders:
        print("\n*ours / Energon*: above 1 is better for samples/s, below 1 for every other column.")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=20, help="Captioning shards.")
    parser.add_argument("--samples-per-shard", type=int, default=1000, help="Captioning samples per shard.")
    parser.add_argument("--image-size", type=int, default=256, help="Square JPEG side in pixels (256: ~20 KB).")
    parser.add_argument("--text-shards", type=int, default=4)
    parser.add_argument("--text-samples-per-shard", type=int, default=2500)
    parser.add_argument("--max-words", type=int, default=400, help="Text length is 5..this many words.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2], help="DataLoader worker counts to measure.")
    parser.add_argument("--warmup", type=int, default=20, help="Image batches before timing.")
    parser.add_argument("--batches", type=int, default=300, help="Timed image batches.")
    parser.add_argument("--text-warmup", type=int, default=50, help="Text batches before timing.")
    parser.add_argument("--text-batches", type=int, default=1500, help="Timed text batches.")
    parser.add_argument("--save-calls", type=int, default=100, help="save_state_rank() calls, one after each batch.")
    parser.add_argument("--shuffle-buffer", type=int, default=100, help="shuffle_buffer_size (webdataset: .shuffle(n)).")
    parser.add_argument("--max-samples-per-sequence", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=1, help="Measurements per cell; the table shows medians.")
    parser.add_argument("--datasets", nargs="+", choices=DATASETS, default=list(DATASETS))
    parser.add_argument("--only", choices=list(LOADERS), help="Measure one loader only.")
    parser.add_argument("--quick", action="store_true",
                        help="Small data and few batches (a smoke test of the benchmark, not figures to quote).")
    parser.add_argument("--gen-workers", type=int, default=os.cpu_count() or 1, help="Processes generating/preparing the data.")
    parser.add_argument("--data-dir", type=Path, help="Work here (kept, generated data reused) instead of a temp dir.")
    parser.add_argument("--timeout", type=float, default=1200, help="Seconds before one measurement counts as failed.")
    parser.add_argument("--torch-threads", type=int, default=0,
                        help="torch.set_num_threads() in the measured process before the loader's import (0: torch's default). "
                        "Batch collation in the main process (0 workers) can be several times slower with torch's default "
                        "thread count on few cores; DataLoader workers always use 1 thread.")
    parser.add_argument("--poll-interval", type=float, default=0.1, help="Seconds between memory polls.")
    parser.add_argument("--verbose", action="store_true", help="Pass each measurement's stderr through.")
    args = parser.parse_args()
    if args.quick:
        args.shards, args.samples_per_shard, args.image_size = 4, 100, 128
        args.text_shards, args.text_samples_per_shard = 2, 500
        args.warmup, args.batches, args.text_warmup, args.text_batches, args.save_calls = 3, 20, 5, 60, 10
    if min(args.shards, args.samples_per_shard, args.image_size, args.text_shards, args.text_samples_per_shard,
           args.batch_size, args.batches, args.text_batches, args.save_calls, args.repeats, args.gen_workers) < 1:
        parser.error("sizes, --batches, --text-batches, --save-calls, --repeats and --gen-workers must be >= 1")
    if min(args.workers) < 0 or min(args.warmup, args.text_warmup) < 0:
        parser.error("--workers, --warmup and --text-warmup must be >= 0")
    args.loaders = [args.only] if args.only else list(LOADERS)

    work = args.data_dir or Path(tempfile.mkdtemp(prefix="bench_loader_"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        return run(work, args)
    finally:
        if args.data_dir is None:
            shutil.rmtree(work, ignore_errors=True)


def load_average() -> str:
    try:
        return "/".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "unknown"


def run(work: Path, args: argparse.Namespace) -> int:
    load_before = load_average()
    roots = {}
    for dataset in args.datasets:
        roots[dataset] = work / f"{'quick-' if args.quick else ''}{dataset}"
        prepare_dataset(roots[dataset], dataset, args)
        warm_page_cache(roots[dataset])

    runs: dict[tuple, list[Measurement]] = {}
    for repeat in range(args.repeats):
        for dataset in args.datasets:
            for workers in args.workers:
                for loader in args.loaders:  # interleaved, so that drift hits every loader alike
                    print(f"[{repeat + 1}/{args.repeats}] {dataset}, {workers} workers, {LOADERS[loader]} ...", file=sys.stderr, flush=True)
                    try:
                        result = measure(loader, dataset, workers, roots[dataset], args)
                    except Exception as exc:  # one loader's crash must not lose the others' figures
                        result = Measurement(error=f"benchmark error: {type(exc).__name__}: {exc}")
                    print(f"    {result.wall_s:.1f} s" + (f", failed: {result.error[:300]}" if result.error else ""),
                          file=sys.stderr, flush=True)
                    if result.error and args.verbose:
                        print(result.traceback, file=sys.stderr, flush=True)
                    runs.setdefault((dataset, workers, loader), []).append(result)
    results = {key: merge(value) for key, value in runs.items()}

    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print("## loader benchmark\n")
    print(
        f"Machine: {cpu_model()}, {os.cpu_count()} CPUs ({affinity} usable), {platform.system()} {platform.release()}; "
        f"Python {platform.python_version()}, torch {version('torch')}, megatron-energon {version('megatron-energon')}, "
        f"megatron-energon-lite {version('megatron-energon-lite')}, webdataset {version('webdataset')}, "
        f"Pillow {version('pillow')}, numpy {version('numpy')}. Load average (1/5/15 min) before: {load_before}, "
        f"after: {load_average()} (other work on the machine makes figures noisy; use --repeats).\n"
    )
    print(
        f"Batch size {args.batch_size}; ours and Energon: get_train_dataset(shuffle_buffer_size={args.shuffle_buffer}, "
        f"max_samples_per_sequence={args.max_samples_per_sequence}) + get_savable_loader(), a DefaultTaskEncoder subclass "
        f"with decoder = SampleDecoder(image_decode=\"torchrgb8\"); webdataset: WebDataset(shards, shardshuffle=<#shards>, "
        f"split_by_worker).shuffle({args.shuffle_buffer}).decode(\"torchrgb8\").to_tuple(\"jpg\", \"txt\")"
        f".batched({args.batch_size}).repeat() (text: .decode().to_tuple(\"txt\")) in DataLoader(batch_size=None). "
        f"Every measurement is a fresh process; shards are in the page cache; median of {args.repeats} run(s); "
        f"torch threads in the measured process: {args.torch_threads or 'torch default'} (workers: 1)."
    )
    print(
        "\nFirst batch counts from process spawn (interpreter + import + build + first batch). save_state_rank: mean "
        f"of {args.save_calls} calls, one after each batch. Shutdown: `del` of the iterator and loader + gc.collect() "
        "(worker processes joined). New loader / restore: a second loader in the same process "
        "(imports warm), plain or after restore_state_rank() of the last saved state (pickled round trip); "
        "'resume exact' compares its first batch by key with the batch that followed the save. Memory: the "
        f"process and its workers, polled every {args.poll_interval * 1e3:.0f} ms over the whole run (short spikes "
        "can be missed); PSS splits shared pages between processes, RSS counts pages shared with forked workers "
        "once per process, so the RSS sum over-states real use with workers."
    )
    for dataset in args.datasets:
        params = dataset_params(args, dataset)
        size_mb = sum(p.stat().st_size for p in roots[dataset].rglob("*.tar")) / 1e6
        if dataset == "captioning":
            what = (f"{params['shards']} shards x {params['samples_per_shard']} samples, {args.image_size}x{args.image_size} "
                    f"JPEG + txt (+ json, cls unused), {size_mb:,.1f} MB; {args.warmup} warm-up + {args.batches} timed batches; "
                    f"state restored as saved after {1 + args.warmup + args.batches + args.save_calls} batches.")
        else:
            what = (f"{params['shards']} shards x {params['samples_per_shard']} texts of 5..{args.max_words} words, "
                    f"{size_mb:,.1f} MB; {args.text_warmup} warm-up + {args.text_batches} timed batches; "
                    f"state restored as saved after {1 + args.text_warmup + args.text_batches + args.save_calls} batches.")
        print_table(dataset, results, args, what)

    print("\nPrepared once per dataset with Energon's CLI:\n")
    for dataset in args.datasets:
        print(f"    {shlex.join([*energon_prepare(), '--non-interactive', '--split-ratio', '1,0,0', *PREPARE_FLAGS[dataset], 'PATH'])}")
    print(f"\nBenchmark: {shlex.join([sys.executable, *sys.argv])}")
    print(f"Per measurement: {shlex.join([sys.executable, str(CHILD)])} '<json config>'")

    warned = [(key, r.warnings) for key, r in results.items() if r.warnings]
    if warned:
        print("\nWarnings on stderr (first 3 distinct per measurement):\n")
        for (dataset, workers, loader), warnings in warned:
            for warning in warnings[:3]:
                print(f"- {LOADERS[loader]}, {dataset}, {workers} workers: `{warning}`")
    return 1 if any(r.error for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
