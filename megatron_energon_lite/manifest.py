"""The per-step data manifest: which samples made each batch, on every rank (issue 41).

A loader made with ``get_savable_loader(..., manifest=DIR)`` (or ``ENERGON_LITE_MANIFEST=DIR``)
appends one record per batch it delivers to ``DIR/rank{R:05d}-{seq:05d}.emf``.  Layout:

* ``DIR/run.json``: the run's identity (the loader's configuration fingerprint without the
  topology, and the data it reads).  A loader of another run or dataset is refused, naming both.
* A file: ``MAGIC``, a little-endian u32 header length, the JSON header (rank, world size, workers,
  per dataset its path, split and shard names with sample counts), its CRC32 (u32); then records.
* A record: varint payload length, payload, CRC32 of the payload (u32).  A payload is a record
  kind (one byte) then varints: ``BATCH``: step, worker, batch index, sample count, and per sample
  its key-shape id and the integers of its restore key (``("Blend", 1, "Webdataset", 29)`` ->
  shape ``("Blend", "Webdataset")``, integers ``1 29``); ``SHAPE``: a new key shape (JSON list of
  tags), defined before its first use; ``RAW``: step then the batch's restore key as JSON (keys of
  other forms: packed or grouped items, unbatched samples).

A plain dataset costs 1 byte (shape) + the varint of the split index (3 bytes below 2M samples)
per sample, plus about 15 bytes per batch.  A torn tail (the process was killed mid-write) fails
its length or CRC: readers keep the valid prefix and report the rest.  Each process that opens a
manifest starts new files (``seq`` + 1), and a file is rotated at ``rotate_bytes``; a resumed run
may repeat steps the killed one wrote after its checkpoint, and the reader keeps the latest file's.

The step of a batch is the rank's count of batches delivered before it, restored with the loader
state (``RankState.manifest_step``), so a resumed run continues the numbering.
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
import json
import logging
import mmap
import os
import queue
import re
import struct
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from .errors import ConfigError, DatasetError, format_message

__all__ = [
    "MANIFEST_ENV",
    "ManifestSample",
    "ManifestStep",
    "ManifestWriter",
    "read_manifest",
    "read_rank_files",
    "read_run",
    "manifest_problems",
    "RankFile",
]

logger = logging.getLogger("megatron_energon_lite.manifest")

MANIFEST_ENV = "ENERGON_LITE_MANIFEST"
MAGIC = b"EMF1"
RUN_FILE = "run.json"
BATCH, SHAPE, RAW = 0, 1, 2
_FILE_NAME = re.compile(r"^rank(\d{5})-(\d{5})\.emf$")
_U32 = struct.Struct("<I")
#: Records are flushed after this many batches (and at save_state_rank and close).
FLUSH_EVERY = 64
DEFAULT_ROTATE_BYTES = 64 << 20
#: Batches queued for the writer thread at most (then add() waits for it).
QUEUE_BATCHES = 1024
_TOPOLOGY_KEYS = ("worker_config.rank", "worker_config.world_size", "worker_config.num_workers")


def _varint(value: int, out: bytearray) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _read_varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _dataset_name(record: dict) -> str:
    """How ``run.json`` and messages name a dataset (a data record or a file header's table)."""
    return f"{record.get('path')} (split {record.get('split_part')})"


def run_identity(config: dict, data: list | None) -> dict[str, Any]:
    """What ``run.json`` records: a fingerprint of the loader's configuration (the topology may
    change on an elastic resume) and of its data, and the datasets by name for messages."""
    stable = {k: v for k, v in config.items() if k not in _TOPOLOGY_KEYS}
    digest = hashlib.sha256(json.dumps([stable, data], sort_keys=True, default=str).encode()).hexdigest()[:32]
    names = [_dataset_name(d) for d in (data or [])] or [str(config.get("path"))]
    return {"format": "energon-lite manifest", "version": 1, "fingerprint": digest, "datasets": names, "config": json.loads(json.dumps(stable, default=str))}


def _claim_run(folder: Path, identity: dict[str, Any]) -> None:
    """Writes ``run.json`` (first writer wins, atomically) or refuses a folder of another run."""
    target = folder / RUN_FILE
    if not target.exists():
        tmp = folder / f".{RUN_FILE}.{os.getpid()}"
        tmp.write_text(json.dumps(identity, indent=1))
        try:
            os.link(tmp, target)  # fails when another rank was first: then compare with its
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    try:
        found = json.loads(target.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(format_message("the manifest folder's run.json cannot be read", where=str(target), found=str(exc), fix="give the loader an empty folder for its manifest")) from exc
    if not isinstance(found, dict) or found.get("fingerprint") != identity["fingerprint"]:
        theirs = found.get("datasets") if isinstance(found, dict) else None
        saved = found.get("config") if isinstance(found, dict) and isinstance(found.get("config"), dict) else {}
        differences = [f"{k}: {saved.get(k, '<missing>')!r} there, {identity['config'].get(k, '<missing>')!r} here" for k in sorted(set(saved) | set(identity["config"])) if saved.get(k, "<missing>") != identity["config"].get(k, "<missing>")]
        raise ConfigError(
            format_message(
                "the manifest folder belongs to another run or dataset",
                where=str(folder),
                expected=f"run {identity['fingerprint']} reading {', '.join(identity['datasets'])}",
                found=f"run {found.get('fingerprint') if isinstance(found, dict) else '?'} reading {', '.join(map(str, theirs or ['?']))}"
                + "".join(f"\n    {line}" for line in differences[:10]),
                fix="give this run its own manifest folder (a resumed run appends to its own run's folder)",
            )
        )


def dataset_tables(spec: Any) -> list[dict[str, Any]]:
    """Per dataset of a pipeline spec: path, split and shards with counts (for the file header)."""
    tables = []
    for leaf, resolved in zip(spec.plan.leaves, spec.datasets):
        starts = list(resolved.shard_starts)
        names = list(resolved.split.names) if resolved.split is not None else [f"part {i}" for i in range(len(starts) - 1)]
        tables.append({"path": str(leaf.path), "split_part": spec.split_part, "shards": names, "counts": [b - a for a, b in zip(starts, starts[1:])]})
    return tables


class ManifestWriter:
    """One rank's writer.  :meth:`add` only queues the batch's step and key (a bounded queue: a
    slow disk slows the loop instead of growing memory); a background thread encodes the records
    while the loop waits for its next batch, and appends them every :data:`FLUSH_EVERY` batches
    and on :meth:`flush`; files rotate at ``rotate_bytes``."""

    def __init__(self, folder: str | os.PathLike[str], *, rank: int, world_size: int, num_workers: int, config: dict, data: list | None, datasets: list[dict[str, Any]], rotate_bytes: int | None = None) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        _claim_run(self.folder, run_identity(config, data))
        self.rank = rank
        self.rotate_bytes = DEFAULT_ROTATE_BYTES if rotate_bytes is None else rotate_bytes
        self._header = {"rank": rank, "world_size": world_size, "num_workers": num_workers, "datasets": datasets}
        self._seq = 0  # numbered when the first file opens (_open)
        self._fd: int | None = None
        self._size = 0
        self._shapes: dict[tuple[str, ...], int] = {}
        self._buffer = bytearray()
        self._pending = 0
        self._queue: queue.Queue = queue.Queue(maxsize=QUEUE_BATCHES)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        # A forked DataLoader worker holds a copy of this writer and its buffer: only the
        # process that made it writes, or a worker's exit could append the records again.
        self._pid = os.getpid()

    def add(self, step: int, restore_key: tuple) -> None:
        """Records the batch delivered at ``step`` with ``restore_key`` (its ``__restore_key__``)."""
        self._raise_error()
        if self._thread is None:
            self._thread = threading.Thread(target=self._drain, name=f"manifest-writer-rank{self.rank}", daemon=True)
            self._thread.start()
        self._queue.put((step, restore_key))

    def flush(self) -> None:
        """Returns when every batch added so far is on disk (in the file, not yet synced)."""
        if os.getpid() != self._pid:
            return
        if self._thread is not None and self._thread.is_alive():
            done = threading.Event()
            self._queue.put(done)
            done.wait()
        else:
            self._write()
        self._raise_error()

    def close(self) -> None:
        if os.getpid() != self._pid:
            return
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        if self._error is None:
            self._write()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._raise_error()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit the os module may be gone
            pass

    def _raise_error(self) -> None:
        if self._error is not None:
            raise DatasetError(format_message("the manifest could not be written", where=str(self.folder), found=f"{type(self._error).__name__}: {self._error}", fix="check the folder's disk space and permissions")) from self._error

    def _drain(self) -> None:
        """The background thread: encodes queued batches, writes on a flush or every FLUSH_EVERY.
        After an error it only drains the queue (and answers flushes), so add() never blocks."""
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, threading.Event):
                try:
                    if self._error is None:
                        self._write()
                except Exception as exc:  # noqa: BLE001 - raised in the loop's thread by flush()
                    self._error = exc
                finally:
                    item.set()
                continue
            if self._error is not None:
                continue
            try:
                self.encode(*item)
                self._pending += 1
                if self._pending >= FLUSH_EVERY:
                    self._write()
            except Exception as exc:  # noqa: BLE001 - raised in the loop's thread by the next add() or flush()
                self._error = exc
                self._buffer.clear()

    def encode(self, step: int, restore_key: tuple) -> bytes:
        """Appends the records of one batch to the buffer (a new key shape first); returns them."""
        if self._fd is None:
            self._open()
        start = len(self._buffer)
        payload = self._batch_payload(step, restore_key)
        if payload is None:
            payload = bytearray([RAW])
            _varint(step, payload)
            payload += json.dumps(list(restore_key), separators=(",", ":"), default=str).encode()
        self._append(payload)
        return bytes(self._buffer[start:])

    def _next_seq(self) -> int:
        """The sequence number after this rank's last file in the folder."""
        return 1 + max((int(m.group(2)) for m in map(_FILE_NAME.match, os.listdir(self.folder)) if m and int(m.group(1)) == self.rank), default=-1)

    def _open(self) -> None:
        header = json.dumps(self._header, separators=(",", ":")).encode()
        blob = MAGIC + _U32.pack(len(header)) + header + _U32.pack(zlib.crc32(header))
        # Numbered when opened, not when made: another loader of this rank (a resumed run made
        # while the old one still lived) may have opened files since; later files win a step.
        self._seq = max(self._seq, self._next_seq())
        while True:
            path = self.folder / f"rank{self.rank:05d}-{self._seq:05d}.emf"
            self._seq += 1
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
                break
            except FileExistsError:  # taken between the listing and the open: the next one
                continue
        try:
            os.write(fd, blob)
        except OSError:
            os.close(fd)
            raise
        self._fd = fd
        self._size = len(blob)
        self._shapes = {}  # each file defines its own shapes: it is read alone

    def _append(self, payload: bytearray | bytes) -> None:
        _varint(len(payload), self._buffer)
        self._buffer += payload
        self._buffer += _U32.pack(zlib.crc32(payload))

    def _batch_payload(self, step: int, key: tuple) -> bytearray | None:
        """The compact record, or None for a key not of the form ``("Worker", w, "Batch", n, *samples)``
        with samples made of ``(tag, int >= 0)`` pairs."""
        if len(key) < 4 or key[0] != "Worker" or key[2] != "Batch" or not _uint(key[1]) or not _uint(key[3]):
            return None
        out = bytearray([BATCH])
        for value in (step, key[1], key[3], len(key) - 4):
            _varint(value, out)
        # The hot path of the writer thread (about 1 us per sample): a known shape's tags were
        # checked when it was defined; values are checked as they are written.
        for sample in key[4:]:
            if type(sample) is not tuple or not sample or len(sample) % 2:
                return None
            tags = sample[0::2]
            try:
                shape = self._shapes.get(tags)
            except TypeError:  # an unhashable tag
                return None
            if shape is None:
                if not all(isinstance(t, str) for t in tags) or not all(map(_uint, sample[1::2])):
                    return None
                shape = self._shapes[tags] = len(self._shapes)
                self._append(bytes([SHAPE]) + json.dumps(list(tags)).encode())
            if shape < 0x80:
                out.append(shape)
            else:
                _varint(shape, out)
            for value in sample[1::2]:
                if type(value) is not int or value < 0:
                    return None
                if value < 0x80:
                    out.append(value)
                elif value < 0x4000:
                    out.append((value & 0x7F) | 0x80)
                    out.append(value >> 7)
                else:
                    _varint(value, out)
        return out

    def _write(self) -> None:
        """Appends the buffered records (one write); rotates the file when it is full."""
        if self._buffer and self._fd is not None:
            os.write(self._fd, self._buffer)
            self._size += len(self._buffer)
            self._buffer.clear()
        self._pending = 0
        if self._fd is not None and self._size >= self.rotate_bytes:
            os.close(self._fd)
            self._fd = None


def _uint(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# --- reading ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ManifestSample:
    """One sample of a batch: its dataset (index, path, split), shard and position in the shard,
    its split index, and its restore key (a whole batch's when it is not one sample)."""

    dataset: int
    dataset_path: str
    split_part: str
    shard: str | None
    index_in_shard: int | None
    split_index: int | None
    restore_key: tuple


@dataclass(frozen=True)
class ManifestStep:
    """One step: per rank, the batch's restore key and its samples."""

    step: int
    batches: dict[int, tuple[tuple, list[ManifestSample]]]

    def samples(self, rank: int | None = None) -> list[ManifestSample]:
        return [s for r, (_, samples) in sorted(self.batches.items()) if rank is None or r == rank for s in samples]


@dataclass
class RankFile:
    path: Path
    rank: int
    seq: int
    header: dict[str, Any]
    records: list[tuple[int, tuple, list[ManifestSample]]]
    problem: str | None


def _tuple(value: Any) -> Any:
    return tuple(_tuple(v) for v in value) if isinstance(value, list) else value


def _sample(header: dict, sample_key: tuple) -> ManifestSample:
    tags = sample_key[0::2]
    dataset = sample_key[tags.index("Blend") * 2 + 1] if "Blend" in tags else 0
    tables = header.get("datasets") or []
    table = tables[dataset] if dataset < len(tables) else {"path": "?", "split_part": "?", "shards": [], "counts": []}
    split_index = sample_key[-1] if tags and tags[-1] == "Webdataset" else None
    shard = index_in_shard = None
    if split_index is not None and table["counts"]:
        starts = [0]
        for count in table["counts"]:
            starts.append(starts[-1] + count)
        k = bisect.bisect_right(starts, split_index) - 1
        if 0 <= k < len(table["shards"]):
            shard, index_in_shard = table["shards"][k], split_index - starts[k]
    return ManifestSample(dataset, table["path"], table["split_part"], shard, index_in_shard, split_index, sample_key)


class _FileScan:
    """One manifest file, read lazily: :meth:`header` checks the header; :meth:`records` maps the
    file (its pages are read as the records are, not held) and yields the valid records, setting
    :attr:`problem` when the rest is torn or damaged."""

    def __init__(self, path: Path) -> None:
        self.path = path
        match = _FILE_NAME.match(path.name)
        self.rank, self.seq = (int(match.group(1)), int(match.group(2))) if match else (-1, -1)
        self.header: dict[str, Any] = {}
        self.problem: str | None = None
        self._records_from = 0

    def read_header(self) -> bool:
        """Whether the file starts with a valid header (else :attr:`problem` says why)."""
        with open(self.path, "rb") as f:
            head = f.read(8)
            if len(head) < 8 or head[:4] != MAGIC:
                self.problem = f"{self.path}: not a manifest file (no {MAGIC!r} header)"
                return False
            (length,) = _U32.unpack_from(head, 4)
            body = f.read(length + 4)
        if len(body) < length + 4 or _U32.unpack_from(body, length)[0] != zlib.crc32(body[:length]):
            self.problem = f"{self.path}: the header is truncated or damaged ({8 + len(body)} bytes, the header needs {length + 12}); no record read"
            return False
        try:
            header = json.loads(body[:length])
        except ValueError:
            header = None
        if not isinstance(header, dict) or not isinstance(header.get("datasets", []), list):
            self.problem = f"{self.path}: the header is not a manifest header (a JSON object with rank and datasets); no record read"
            return False
        self.header = header
        self._records_from = 12 + length
        return True

    def records(self) -> Iterator[tuple[int, tuple, list[ManifestSample]]]:
        """The valid records in order (steps increasing); after them, :attr:`problem` is set when
        bytes were left that are not a valid record."""
        with open(self.path, "rb") as f:  # the map outlives the descriptor: many files may be open at once
            size = os.fstat(f.fileno()).st_size
            if size <= self._records_from:
                return
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        with data:
            yield from self._parse(data, size)

    def _parse(self, data: mmap.mmap, size: int) -> Iterator[tuple[int, tuple, list[ManifestSample]]]:
        pos = self._records_from
        shapes: list[tuple[str, ...]] = []
        count, last_step = 0, -1
        while pos < size:
            start = pos
            try:
                length, pos = _read_varint(data, pos)
                if pos + length + 4 > size:
                    raise ValueError("length or CRC does not match")
                payload = data[pos : pos + length]
                if _U32.unpack_from(data, pos + length)[0] != zlib.crc32(payload):
                    raise ValueError("length or CRC does not match")
                pos += length + 4
                decoded = _decode(payload, shapes, self.header)
                if decoded and decoded[0][0] <= last_step:
                    raise ValueError(f"step {decoded[0][0]} after step {last_step}")
            except (ValueError, IndexError, KeyError) as exc:
                self.problem = f"{self.path}: {size - start} bytes from offset {start} are torn or damaged ({exc}); {count} batch record(s) before them read"
                return
            for record in decoded:
                last_step = record[0]
                count += 1
                yield record


def read_rank_file(path: Path) -> RankFile:
    """Reads one file: its valid records, and what is wrong with the rest (None: nothing)."""
    scan = _FileScan(path)
    records = list(scan.records()) if scan.read_header() else []
    return RankFile(path, scan.rank, scan.seq, scan.header, records, scan.problem)


def _decode(payload: bytes, shapes: list[tuple[str, ...]], header: dict) -> list[tuple[int, tuple, list[ManifestSample]]]:
    kind = payload[0]
    if kind == SHAPE:
        shapes.append(tuple(json.loads(payload[1:])))
        return []
    if kind == RAW:
        step, pos = _read_varint(payload, 1)
        key = _tuple(json.loads(payload[pos:]))
        return [(step, key, [_sample(header, key)])]
    if kind != BATCH:
        raise ValueError(f"unknown record kind {kind}")
    values = []
    pos = 1
    for _ in range(4):
        value, pos = _read_varint(payload, pos)
        values.append(value)
    step, worker, batch, count = values
    samples = []
    for _ in range(count):
        shape_id, pos = _read_varint(payload, pos)
        tags = shapes[shape_id]
        sample_key: list[Any] = []
        for tag in tags:
            value, pos = _read_varint(payload, pos)
            sample_key += [tag, value]
        samples.append(tuple(sample_key))
    if pos != len(payload):
        raise ValueError("record longer than its samples")
    return [(step, ("Worker", worker, "Batch", batch, *samples), [_sample(header, s) for s in samples])]


def read_rank_files(folder: str | os.PathLike[str]) -> list[RankFile]:
    """Every manifest file of ``folder``, by rank then sequence, its records read; a folder
    without ``run.json`` is refused; a file of another run gets no records and a problem."""
    run = read_run(folder)
    files = []
    for _, _, path in _listing(Path(folder)):
        rank_file = read_rank_file(path)
        foreign = _foreign(path, rank_file.header, run) if rank_file.header else None
        files.append(rank_file if foreign is None else RankFile(path, rank_file.rank, rank_file.seq, rank_file.header, [], foreign))
    return files


def _listing(folder: Path) -> list[tuple[int, int, Path]]:
    if not (folder / RUN_FILE).is_file():
        raise DatasetError(format_message("not a manifest folder", where=str(folder), expected=f"{RUN_FILE} and rank*.emf files written by a loader made with manifest=", found=", ".join(sorted(os.listdir(folder))[:5]) if folder.is_dir() else "no such folder"))
    return sorted((int(m.group(1)), int(m.group(2)), folder / name) for name in os.listdir(folder) if (m := _FILE_NAME.match(name)))


def _foreign(path: Path, header: dict[str, Any], run: dict[str, Any]) -> str | None:
    """Why a file whose header names other datasets than the folder's ``run.json`` (a file
    copied in from another run) is left out; None when it is of this run."""
    theirs = [_dataset_name(d) for d in header.get("datasets") or [] if isinstance(d, dict)]
    ours = run.get("datasets")
    if not theirs or not isinstance(ours, list) or theirs == ours:
        return None
    return f"{path}: written by a run reading {', '.join(theirs)}, but the folder's run.json is of a run reading {', '.join(map(str, ours))}; its records are left out (a file of another run)"


def read_run(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """``run.json``: the run's fingerprint, datasets and configuration ({} when unreadable)."""
    try:
        run = json.loads((Path(folder) / RUN_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return run if isinstance(run, dict) else {}


def manifest_problems(files: list[RankFile]) -> list[str]:
    return [f.problem for f in files if f.problem]


def read_manifest(folder: str | os.PathLike[str], *, files: list[RankFile] | None = None, problems: list[str] | None = None) -> Iterator[ManifestStep]:
    """The steps of a manifest in order, each with every rank's batch, read as they are asked
    for (the files are merged step by step, not loaded).  A step written again by a resumed run
    (after its checkpoint) is taken from the later file.  Torn or damaged file tails are skipped
    (their valid prefix is read) and files of another run left out; what is wrong is appended
    to ``problems`` as it is found (``files``: read by :func:`read_rank_files` already, whose
    :func:`manifest_problems` say so)."""
    if files is not None:
        sources = [((f.header.get("rank", f.rank), f.seq), iter(f.records)) for f in files]
    else:
        sources = []
        for scan in _scans(folder):
            if scan.problem is not None:
                if problems is not None:
                    problems.append(scan.problem)
                continue
            sources.append(((scan.header.get("rank", scan.rank), scan.seq), _noting(scan, problems)))
    # Each source yields its steps in increasing order: merged by (step, rank, newest file first).
    tagged = [_tagged(rank, seq, records) for (rank, seq), records in sources]
    current: ManifestStep | None = None
    for step, rank, _, key, samples in heapq.merge(*tagged, key=lambda r: r[:3]):
        if current is None or current.step != step:
            if current is not None:
                yield current
            current = ManifestStep(step, {})
        current.batches.setdefault(rank, (key, samples))  # the newest file's comes first
    if current is not None:
        yield current


def _tagged(rank: int, seq: int, records: Iterator[tuple[int, tuple, list[ManifestSample]]]) -> Iterator[tuple[int, int, int, tuple, list[ManifestSample]]]:
    for step, key, samples in records:
        yield step, rank, -seq, key, samples


def _scans(folder: str | os.PathLike[str]) -> Iterator[_FileScan]:
    """The files of a manifest folder with their headers read; a file of another run than the
    folder's ``run.json`` gets a problem."""
    folder = Path(folder)
    run = read_run(folder)
    for _, _, path in _listing(folder):
        scan = _FileScan(path)
        if scan.read_header():
            foreign = _foreign(path, scan.header, run)
            if foreign is not None:
                scan.problem = foreign
        yield scan


def _noting(scan: _FileScan, problems: list[str] | None) -> Iterator[tuple[int, tuple, list[ManifestSample]]]:
    yield from scan.records()
    if scan.problem is not None and problems is not None:
        problems.append(scan.problem)
