"""Each dataset's metadata is read once, by the process that makes the loader; workers read none.

Every file opened (``open`` audit events, SQLite connections included) is recorded with the pid
that opened it, through a pipe that forked workers inherit."""

from __future__ import annotations

import itertools
import os
import sys
from collections import Counter
from pathlib import Path

import pytest
from energon_lite_dev.synthetic import write_tar

from megatron_energon_lite import (
    WorkerConfig,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
)
from megatron_energon_lite.format.prepare import prepare_dataset

TEXT_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"

_sink: int | None = None  # write end of the pipe while recording (the hook cannot be removed)


def _audit(event: str, args: tuple) -> None:
    if _sink is None or event not in ("open", "sqlite3.connect"):
        return
    path = args[0]
    if isinstance(path, (str, bytes, os.PathLike)):
        os.write(_sink, f"{os.getpid()}\t{os.fsdecode(path)}\n".encode())


sys.addaudithook(_audit)


class _Opens:
    """Files opened while recording, as (pid, path) pairs."""

    def __enter__(self) -> _Opens:
        global _sink
        self._read, _sink = os.pipe()
        os.set_blocking(self._read, False)
        self._chunks: list[bytes] = []
        return self

    def drain(self) -> None:
        while True:
            try:
                chunk = os.read(self._read, 65536)
            except BlockingIOError:
                return
            if not chunk:
                return
            self._chunks.append(chunk)

    def __exit__(self, *exc) -> None:
        global _sink
        sink, _sink = _sink, None
        os.close(sink)
        self.drain()
        os.close(self._read)
        lines = b"".join(self._chunks).decode().splitlines()
        self.records = [(int(pid), path) for pid, path in (line.split("\t", 1) for line in lines)]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("resolve_once") / "ds"
    for shard in range(6):
        write_tar(root / f"shards/{shard:03d}.tar", [(f"{shard}_{i}", {"txt": f"text {shard} {i}".encode()}) for i in range(8)])
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=TEXT_YAML)
    (root.parent / "blend.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
        "      - weight: 1\n        path: ds\n      - weight: 2\n        path: ds\n        subflavors: {second: 1}\n"
    )
    return root


#: What the main process reads of a prepared dataset when it makes a loader: the split cache, the
#: info and split files it must match (read for their bytes, parsed only when it does not), and
#: dataset.yaml.
METADATA_READ_ONCE = Counter({".lite-split-cache.json": 1, ".info.json": 1, "split.yaml": 1, "dataset.yaml": 1})


def _metadata_opens(records: list[tuple[int, str]]) -> dict[int, Counter]:
    found: dict[int, Counter] = {}
    for pid, path in records:
        if "/.nv-meta/" in path:
            found.setdefault(pid, Counter())[path.rsplit("/", 1)[-1]] += 1
    return found


@pytest.mark.parametrize("target", ["ds", "blend.yaml"])
def test_workers_read_no_metadata_and_the_main_process_reads_each_file_once(dataset: Path, target: str) -> None:
    path = dataset if target == "ds" else dataset.parent / "blend.yaml"
    with _Opens() as opens:
        loader = get_savable_loader(get_train_dataset(path, batch_size=4, shuffle_buffer_size=8, max_samples_per_sequence=4, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=2)))
        batches = list(itertools.islice(loader, 10))
        state = loader.save_state_rank()
        opens.drain()
    assert len(batches) == 10 and state is not None
    by_pid = _metadata_opens(opens.records)
    main = by_pid.pop(os.getpid(), Counter())
    # The workers ran (they opened the shards' .tar.idx files) but no metadata file.
    worker_pids = {pid for pid, p in opens.records if p.endswith(".tar.idx")} - {os.getpid()}
    assert len(worker_pids) == 2, opens.records[:20]
    assert by_pid == {}, f"workers read metadata: {by_pid}"
    # The main process: .info.json, split.yaml, prepare's split cache and dataset.yaml once each,
    # also when a blend names the dataset twice.
    assert main == METADATA_READ_ONCE, main


def test_val_dataset_and_restore_read_metadata_only_when_made(dataset: Path) -> None:
    def make():
        return get_savable_loader(get_val_dataset(dataset, split_part="train", batch_size=5, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=2)))

    loader = make()
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    state = loader.save_state_rank()
    with _Opens() as opens:
        restored = make()
        restored.restore_state_rank(state)
        rest = list(restored)
    assert sorted(k for b in head + rest for k in b.__key__) == sorted(f"{s}_{i}" for s in range(6) for i in range(8))
    by_pid = _metadata_opens(opens.records)
    main = by_pid.pop(os.getpid(), Counter())
    assert by_pid == {} and main == METADATA_READ_ONCE, (main, by_pid)
