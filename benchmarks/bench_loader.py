"""Compares loading speed of megatron_energon_lite, Megatron Energon 7.4.1 and plain webdataset.

Generates two data sets once (captioning: JPEG + caption per sample; text: variable-length texts),
prepares each ONCE with Energon's own CLI (`energon prepare`; ours reads Energon-prepared datasets
unchanged), then measures every (dataset, worker count, loader) cell on the same shards with the
same batch size, each measurement in a fresh Python process (`bench_loader_child.py`):

- samples/s over a fixed number of batches after a warm-up;
- time to the first batch, counted from process start, so the loader's import is included;
- save_state_rank(): mean time per call, one call after each of a number of batches (ours, Energon);
- restore: a new loader, restore_state_rank() of the state saved after the last of those calls
  (pickled and unpickled on the way), until its first batch; the batch is compared by sample key
  with the one that followed the save in the original run (ours, Energon);
- peak memory of the process tree (the process and its DataLoader workers), polled: PSS summed
  (from /proc/<pid>/smaps_rollup; shared pages split between the processes) and RSS summed
  (counts pages shared between parent and forked workers once per process); and peak memory:
  the summed PSS less its shared-memory part, plus the growth of the machine's shared memory
  (Shmem in /proc/meminfo) since the measurement began.  PSS alone under-counts torch's
  hand-over: a batch in /dev/shm that a worker has written and unmapped and the main process has
  not touched yet is in no process's page tables, so no PSS counts it, yet it is memory in use.
  The machine-wide figure counts it (and any other process's shared memory that grows meanwhile:
  measure on an otherwise quiet machine).

Datasets (`--datasets`, all three by default):

- captioning: images are decoded to uint8 CHW tensors in every loader: ours and Energon with a
  DefaultTaskEncoder subclass whose `decoder = SampleDecoder(image_decode="torchrgb8")`, webdataset
  with `.decode("torchrgb8")`. Its table also has a row "decode ceiling (no loader)" at each worker
  count N: the JPEG bytes of the shards (as many images as the loaders decode in their timed
  batches) are read into memory with tarfile first, untimed, then decoded with our loader's own
  image decoder for "torchrgb8" (`megatron_energon_lite.decode.image.decode_image`) into CHW uint8
  tensors: in 1 process (in-process) for N = 0, in N forked processes each decoding its share for
  N >= 1, timed from the start signal until all are done; images/s. A column gives each loader's
  samples/s as a % of that ceiling at the same worker count.
- text: the text shards, one text per sample.
- text-packed: the same text shards through a packing task encoder (ours and Energon, with
  `packing_buffer_size=--packing-buffer`): `select_samples_to_pack` groups consecutive samples of
  the buffer while their texts total at most `--pack-chars` characters, `pack_selected_samples`
  joins each group into one TextSample. samples/s counts packs; a column counts the texts packed
  in. webdataset has no packing: n/a.

With `--repeats R`, the cells of one dataset are measured in R rounds, each round every cell once
and every other round in reversed order, so that machine load drifting over the run hits all
cells alike; the tables show medians. After each table, a summary line gives ours with N workers
over ours with 0 workers (e.g. `ours 2 workers / ours 0 workers: 1.22x`) and, for captioning,
ours as a % of the decode ceiling at each worker count (`--workers`, default 0 1 2).

Run with the project's environment, e.g.

    .venv/bin/python benchmarks/bench_loader.py --data-dir /tmp/bench_loader --repeats 3
    .venv/bin/python benchmarks/bench_loader.py --quick --workers 0 2 --datasets captioning text-packed
    .venv/bin/python benchmarks/bench_loader.py --quick --only energon

`--quick` is a smoke test of the benchmark on small data with few batches, not figures to quote.
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

from megatron_energon_lite.synthetic import (
    generate_captioning_dataset,
    generate_text_dataset,
)

CHILD = Path(__file__).with_name("bench_loader_child.py")
REPO = Path(__file__).resolve().parent.parent
LOADERS = {"ours": "megatron_energon_lite", "energon": "Energon 7.4.1", "webdataset": "webdataset"}
#: The decode ceiling runs in the child like a loader, under this name (captioning only).
CEILING = "ceiling"
LABELS = {**LOADERS, CEILING: "decode ceiling (no loader)"}
DATASETS = ("captioning", "text", "text-packed")
#: The generated and prepared data each dataset reads: text-packed reads the text shards.
DATA_OF = {"captioning": "captioning", "text": "text", "text-packed": "text"}
#: Loaders that can pack (webdataset has no packing: n/a on text-packed).
PACKING_LOADERS = ("ours", "energon")
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
    ("peak_memory_mb", "peak memory MB (PSS + unmapped shm)", "{:,.0f}", False),
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


def _memory_kb(pid: int) -> tuple[int | None, int | None, int]:
    """(PSS, RSS, PSS of shared memory) of one process in KiB; PSS is None where smaps_rollup
    cannot be read."""
    pss = rss = None
    pss_shmem = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as file:
            for line in file:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1])
                elif line.startswith("Pss_Shmem:"):
                    pss_shmem = int(line.split()[1])
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
    return pss, rss, pss_shmem


def _machine_shmem_kb() -> int | None:
    """The machine's shared memory in KiB (/proc/meminfo Shmem: tmpfs, /dev/shm, shared
    anonymous mappings), mapped by some process or not; None where it cannot be read."""
    try:
        with open("/proc/meminfo") as file:
            for line in file:
                if line.startswith("Shmem:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class TreeMemoryPoller(threading.Thread):
    """Polls the summed PSS and RSS of a process and all its descendants, and the peak memory
    (see the module's doc); keeps the peaks (KiB)."""

    def __init__(self, pid: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.peak_pss = self.peak_rss = self.peak_memory = 0
        self.pss_complete = True
        # Taken when the measured process has just started: what grows after is its own.
        self._shmem_start = _machine_shmem_kb()
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            pss_sum = rss_sum = shmem_pss_sum = 0
            for pid in _tree(self.pid):
                pss, rss, pss_shmem = _memory_kb(pid)
                if rss is not None and pss is None:
                    self.pss_complete = False
                pss_sum += pss or 0
                rss_sum += rss or 0
                shmem_pss_sum += pss_shmem
            self.peak_pss = max(self.peak_pss, pss_sum)
            self.peak_rss = max(self.peak_rss, rss_sum)
            shmem = _machine_shmem_kb()
            if shmem is not None and self._shmem_start is not None:
                grown = max(0, shmem - self._shmem_start)
                self.peak_memory = max(self.peak_memory, pss_sum - shmem_pss_sum + grown)
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


def warmup_and_batches(dataset: str, args: argparse.Namespace) -> tuple[int, int]:
    if dataset == "captioning":
        return args.warmup, args.batches
    return args.text_warmup, args.packed_batches if dataset == "text-packed" else args.text_batches


def measure(loader: str, dataset: str, workers: int, root: Path, args: argparse.Namespace) -> Measurement:
    warmup, batches = warmup_and_batches(dataset, args)
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
        "warmup": warmup,
        "batches": batches,  # the ceiling decodes batches x batch_size images
        "pack_chars": args.pack_chars,
        "packing_buffer": args.packing_buffer,
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
            if poller.peak_memory:
                result.figures["peak_memory_mb"] = poller.peak_memory / 1024
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
    """Median of each figure over the repeats; the first error wins.

    Values that are not numbers ("resume exact", the batch) are shown once each, so that one repeat
    that did not resume exactly is not hidden behind a first one that did.
    """
    merged = Measurement()
    for key in {k for run in runs for k in run.figures}:
        values = [run.figures[key] for run in runs if key in run.figures]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            merged.figures[key] = statistics.median(values)
        else:
            merged.figures[key] = " / ".join(dict.fromkeys(str(v) for v in values))
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


def table_columns(dataset: str) -> list[tuple]:
    """COLUMNS with the dataset's own columns after samples/s: % of the decode ceiling, or packed texts/s."""
    columns = list(COLUMNS)
    if dataset == "captioning":
        columns.insert(1, ("ceiling_pct", "% of decode ceiling", "{:.0f}%", False))
    elif dataset == "text-packed":
        columns[0] = ("samples_per_s", "samples/s (packs)", "{:,.0f}", False)
        columns.insert(1, ("input_samples_per_s", "texts/s (packed in)", "{:,.0f}", False))
    return columns


def fmt(columns: list[tuple], key: str, value) -> str:
    fmt_spec = next(spec for k, _, spec, _ in columns if k == key)
    return fmt_spec.format(value)


def workers_phrase(workers: int) -> str:
    return f"{workers} worker{'' if workers == 1 else 's'}"


def ceiling_processes(workers: int) -> int:
    return max(1, workers)  # 0 workers: decoding in the main process, so the 1-process ceiling


def samples_per_s(results: dict, dataset: str, workers: int, loader: str) -> float | None:
    result = results.get((dataset, workers, loader))
    value = result.figures.get("samples_per_s") if result is not None else None
    return value if isinstance(value, (int, float)) and value > 0 else None


def print_table(dataset: str, results: dict, args: argparse.Namespace, info: str) -> None:
    print(f"\n### {dataset}\n\n{info}\n")
    columns = table_columns(dataset)
    headers = ["loader", "workers", *(header for _, header, _, _ in columns), "resume exact", "state KB", "batch"]
    print("| " + " | ".join(headers) + " |")
    print("| --- | ---: | " + " | ".join("---:" for _ in columns) + " | --- | ---: | --- |")

    def print_error(label: str, workers: int, error: str) -> None:
        error = error.replace("|", "\\|").replace("\n", " ")
        print(f"| ↳ **{label} failed** | {workers} | " + f"{error[:600]} |" + " |" * (len(headers) - 3))

    for workers in args.workers:
        ceiling = results.get((dataset, workers, CEILING))
        if ceiling is not None:  # the reference first: only images/s applies
            cells = [fmt(columns, key, ceiling.figures[key]) if key == "samples_per_s" and key in ceiling.figures
                     else "100%" if key == "ceiling_pct" and "samples_per_s" in ceiling.figures
                     else "n/a" for key, *_ in columns]
            cells += ["n/a", "n/a", f"{ceiling.figures.get('batch', '-')} per image"]
            print(f"| {LABELS[CEILING]} | {workers} | " + " | ".join(cells) + " |")
            if ceiling.error:
                print_error(LABELS[CEILING], workers, ceiling.error)
        ceiling_sps = samples_per_s(results, dataset, workers, CEILING)
        row_results = {loader: results.get((dataset, workers, loader)) for loader in args.loaders}
        for loader, result in row_results.items():
            if result is None:
                if dataset == "text-packed" and loader not in PACKING_LOADERS:
                    cells = ["n/a"] * (len(columns) + 3)
                    print(f"| {LABELS[loader]} (no packing) | {workers} | " + " | ".join(cells) + " |")
                continue
            figures = dict(result.figures)
            if ceiling_sps is not None and isinstance(figures.get("samples_per_s"), (int, float)):
                figures["ceiling_pct"] = 100 * figures["samples_per_s"] / ceiling_sps
            cells = []
            for key, _, _, stateful in columns:
                if stateful and loader == "webdataset":
                    cells.append("n/a")
                elif key in figures:
                    cells.append(fmt(columns, key, figures[key]))
                else:
                    cells.append("-")
            state_kb = f"{figures['state_bytes'] / 1024:,.1f}" if "state_bytes" in figures else ("n/a" if loader == "webdataset" else "-")
            resume = "n/a" if loader == "webdataset" else figures.get("resume_exact", "-")
            cells += [resume, state_kb, figures.get("batch", "-")]
            print(f"| {LABELS[loader]} | {workers} | " + " | ".join(cells) + " |")
            if result.error:
                print_error(LABELS[loader], workers, result.error)
        ours, energon = row_results.get("ours"), row_results.get("energon")
        if ours is not None and energon is not None:
            cells = []
            for key, *_ in columns:
                a, b = ours.figures.get(key), energon.figures.get(key)
                if key == "ceiling_pct":  # the ratio of the percentages is the samples/s ratio again
                    cells.append("")
                    continue
                cells.append(f"{a / b:.2f}x" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else "-")
            print(f"| *ours / Energon* | {workers} | " + " | ".join(cells) + " | | | |")
    if "ours" in args.loaders and "energon" in args.loaders:
        print("\n*ours / Energon*: above 1 is better for samples/s, below 1 for every other column.")
    print_summary(dataset, results, args)


def print_summary(dataset: str, results: dict, args: argparse.Namespace) -> None:
    """ours with workers against ours without; for captioning, ours against the decode ceiling."""
    if "ours" not in args.loaders:
        return
    parts = []
    base = samples_per_s(results, dataset, 0, "ours")
    for workers in args.workers:
        value = samples_per_s(results, dataset, workers, "ours")
        if workers == 0 or value is None or base is None:
            continue
        parts.append(f"ours {workers_phrase(workers)} / ours 0 workers: {value / base:.2f}x")
    if dataset == "captioning":
        for workers in args.workers:
            value = samples_per_s(results, dataset, workers, "ours")
            ceiling = samples_per_s(results, dataset, workers, CEILING)
            if value is not None and ceiling is not None:
                processes = ceiling_processes(workers)
                parts.append(f"ours {workers_phrase(workers)}: {100 * value / ceiling:.0f}% of the {processes}-process decode ceiling")
    if parts:
        print(f"\n**Summary, {dataset}**: " + "; ".join(parts) + ".")


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
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2],
                        help="DataLoader worker counts to measure (and decode ceiling processes: 0 is 1 in-process).")
    parser.add_argument("--warmup", type=int, default=20, help="Image batches before timing.")
    parser.add_argument("--batches", type=int, default=300, help="Timed image batches.")
    parser.add_argument("--text-warmup", type=int, default=50, help="Text batches before timing.")
    parser.add_argument("--text-batches", type=int, default=1500, help="Timed text batches.")
    parser.add_argument("--packed-batches", type=int, default=500,
                        help="Timed batches of packs (text-packed; its warm-up is --text-warmup).")
    parser.add_argument("--pack-chars", type=int, default=4096,
                        help="text-packed: consecutive texts are packed while their total length stays within this many characters.")
    parser.add_argument("--packing-buffer", type=int, default=64, help="text-packed: packing_buffer_size.")
    parser.add_argument("--save-calls", type=int, default=100, help="save_state_rank() calls, one after each batch.")
    parser.add_argument("--shuffle-buffer", type=int, default=100, help="shuffle_buffer_size (webdataset: .shuffle(n)).")
    parser.add_argument("--max-samples-per-sequence", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=1,
                        help="Rounds per dataset, each measuring every cell once, in reversed order every other round; "
                        "the table shows medians.")
    parser.add_argument("--datasets", nargs="+", choices=DATASETS, default=list(DATASETS))
    parser.add_argument("--only", choices=list(LOADERS), help="Measure one loader only (and the captioning decode ceiling, its reference).")
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
        args.packed_batches = 20
    if min(args.shards, args.samples_per_shard, args.image_size, args.text_shards, args.text_samples_per_shard,
           args.batch_size, args.batches, args.text_batches, args.packed_batches, args.pack_chars, args.packing_buffer,
           args.save_calls, args.repeats, args.gen_workers) < 1:
        parser.error("sizes, --batches, --text-batches, --packed-batches, --pack-chars, --packing-buffer, --save-calls, "
                     "--repeats and --gen-workers must be >= 1")
    if min(args.workers) < 0 or min(args.warmup, args.text_warmup) < 0:
        parser.error("--workers, --warmup and --text-warmup must be >= 0")
    args.workers = list(dict.fromkeys(args.workers))  # a worker count given twice is measured once
    args.datasets = list(dict.fromkeys(args.datasets))
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


def dataset_cells(dataset: str, args: argparse.Namespace) -> list[tuple[int, str]]:
    """The (workers, loader) cells of one dataset, in the order of an even round."""
    cells = []
    for workers in args.workers:
        if dataset == "captioning":
            cells.append((workers, CEILING))
        for loader in args.loaders:
            if dataset != "text-packed" or loader in PACKING_LOADERS:
                cells.append((workers, loader))
    return cells


def measure_dataset(dataset: str, root: Path, args: argparse.Namespace) -> dict[tuple, list[Measurement]]:
    """Every cell of one dataset, args.repeats times, in rounds: each round measures every cell once,
    every other round in reversed order, so that load drifting over the rounds hits all cells alike."""
    runs: dict[tuple, list[Measurement]] = {}
    cells = dataset_cells(dataset, args)
    for round_index in range(args.repeats):
        order = cells if round_index % 2 == 0 else cells[::-1]
        for workers, loader in order:
            print(f"[round {round_index + 1}/{args.repeats}] {dataset}, {workers_phrase(workers)}, {LABELS[loader]} ...",
                  file=sys.stderr, flush=True)
            try:
                result = measure(loader, dataset, workers, root, args)
            except Exception as exc:  # one loader's crash must not lose the others' figures
                result = Measurement(error=f"benchmark error: {type(exc).__name__}: {exc}")
            print(f"    {result.wall_s:.1f} s" + (f", failed: {result.error[:300]}" if result.error else ""),
                  file=sys.stderr, flush=True)
            if result.error and args.verbose:
                print(result.traceback, file=sys.stderr, flush=True)
            runs.setdefault((dataset, workers, loader), []).append(result)
    return runs


def run(work: Path, args: argparse.Namespace) -> int:
    load_before = load_average()
    data_roots = {}
    for data in dict.fromkeys(DATA_OF[dataset] for dataset in args.datasets):  # text and text-packed: one text set
        data_roots[data] = work / f"{'quick-' if args.quick else ''}{data}"
        prepare_dataset(data_roots[data], data, args)
        warm_page_cache(data_roots[data])
    roots = {dataset: data_roots[DATA_OF[dataset]] for dataset in args.datasets}

    runs: dict[tuple, list[Measurement]] = {}
    for dataset in args.datasets:
        runs.update(measure_dataset(dataset, roots[dataset], args))
    results = {key: merge(value) for key, value in runs.items()}

    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print("## loader benchmark\n")
    print(
        f"Machine: {cpu_model()}, {os.cpu_count()} CPUs ({affinity} usable), {platform.system()} {platform.release()}; "
        f"Python {platform.python_version()}, torch {version('torch')}, megatron-energon {version('megatron-energon')}, "
        f"megatron-energon-lite {version('megatron-energon-lite')}, webdataset {version('webdataset')}, "
        f"Pillow {version('pillow')}, simplejpeg {version('simplejpeg')}, numpy {version('numpy')}. "
        f"Load average (1/5/15 min) before: {load_before}, "
        f"after: {load_average()} (other work on the machine makes figures noisy; use --repeats).\n"
    )
    print(
        f"Batch size {args.batch_size}; ours and Energon: get_train_dataset(shuffle_buffer_size={args.shuffle_buffer}, "
        f"max_samples_per_sequence={args.max_samples_per_sequence}) + get_savable_loader(), a DefaultTaskEncoder subclass "
        f"with decoder = SampleDecoder(image_decode=\"torchrgb8\"); webdataset: WebDataset(shards, shardshuffle=<#shards>, "
        f"split_by_worker).shuffle({args.shuffle_buffer}).decode(\"torchrgb8\").to_tuple(\"jpg\", \"txt\")"
        f".batched({args.batch_size}).repeat() (text: .decode().to_tuple(\"txt\")) in DataLoader(batch_size=None). "
        f"Every measurement is a fresh process; shards are in the page cache; median of {args.repeats} run(s), "
        f"measured in {args.repeats} round(s) per dataset, each round every cell once, every other round in reversed "
        f"order; torch threads in the measured process: {args.torch_threads or 'torch default'} (workers: 1)."
    )
    print(
        "\nFirst batch counts from process spawn (interpreter + import + build + first batch). save_state_rank: mean "
        f"of {args.save_calls} calls, one after each batch. Shutdown: `del` of the iterator and loader + gc.collect() "
        "(worker processes joined). New loader / restore: a second loader in the same process "
        "(imports warm), plain or after restore_state_rank() of the last saved state (pickled round trip); "
        "'resume exact' compares its first batch by key with the batch that followed the save. Memory: the "
        f"process and its workers, polled every {args.poll_interval * 1e3:.0f} ms over the whole run (short spikes "
        "can be missed); PSS splits shared pages between processes, RSS counts pages shared with forked workers "
        "once per process, so the RSS sum over-states real use with workers. Peak memory: PSS less its shared-memory "
        "part, plus the growth of the machine's Shmem (/proc/meminfo) since the run began, so that batches in "
        "/dev/shm that no process maps at that moment (torch's hand-over) count too."
    )
    for dataset in args.datasets:
        params = dataset_params(args, DATA_OF[dataset])
        size_mb = sum(p.stat().st_size for p in roots[dataset].rglob("*.tar")) / 1e6
        warmup, batches = warmup_and_batches(dataset, args)
        restored = f"state restored as saved after {1 + warmup + batches + args.save_calls} batches."
        if dataset == "captioning":
            what = (f"{params['shards']} shards x {params['samples_per_shard']} samples, {args.image_size}x{args.image_size} "
                    f"JPEG + txt (+ json, cls unused), {size_mb:,.1f} MB; {warmup} warm-up + {batches} timed batches; "
                    f"{restored} Decode ceiling (no loader): the first {batches * args.batch_size:,} JPEGs of the shards "
                    "(as many as the loaders decode in their timed batches), read into memory with tarfile first "
                    "(untimed), then decoded to CHW uint8 tensors by our loader's own decoder for "
                    "image_decode=\"torchrgb8\" (megatron_energon_lite.decode.image.decode_image: simplejpeg where "
                    "installed, else Pillow open + convert(\"RGB\"), then numpy HWC -> contiguous CHW -> "
                    "torch.from_numpy), each process its share, timed from the start signal until all are done; at 0 "
                    "workers in 1 process (in-process), at N workers in N forked processes, nothing else. "
                    "'% of decode ceiling': samples/s over the ceiling's images/s at the same worker count. Energon and "
                    "webdataset decode with Pillow only, so their ceiling would be lower where simplejpeg is installed.")
        else:
            what = (f"{params['shards']} shards x {params['samples_per_shard']} texts of 5..{args.max_words} words, "
                    f"{size_mb:,.1f} MB; {warmup} warm-up + {batches} timed batches; {restored}")
            if dataset == "text-packed":
                what += (f" The same text shards through a packing task encoder (ours and Energon; webdataset has no "
                         f"packing): packing_buffer_size={args.packing_buffer}, select_samples_to_pack groups consecutive "
                         f"samples of the buffer while their texts total at most {args.pack_chars:,} characters (a longer "
                         "text is a pack alone), pack_selected_samples joins a group's texts into one TextSample. A "
                         "batch holds packs: samples/s counts packs, 'texts/s (packed in)' the texts in them.")
        print_table(dataset, results, args, what)

    print("\nPrepared once per dataset with Energon's CLI:\n")
    for data in data_roots:
        print(f"    {shlex.join([*energon_prepare(), '--non-interactive', '--split-ratio', '1,0,0', *PREPARE_FLAGS[data], 'PATH'])}")
    print(f"\nBenchmark: {shlex.join([sys.executable, *sys.argv])}")
    print(f"Per measurement: {shlex.join([sys.executable, str(CHILD)])} '<json config>'")

    warned = [(key, r.warnings) for key, r in results.items() if r.warnings]
    if warned:
        print("\nWarnings on stderr (first 3 distinct per measurement):\n")
        for (dataset, workers, loader), warnings in warned:
            for warning in warnings[:3]:
                print(f"- {LABELS[loader]}, {dataset}, {workers} workers: `{warning}`")
    return 1 if any(r.error for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
