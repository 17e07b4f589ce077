"""The loader's queues write in the caller's thread when that cannot block (``loader/handover/queues.py``).

Between real processes: messages of every size, including ones larger than the pipe, arrive
whole and in order, also from two writers at once; ``put`` returns when nobody reads; the sender
thread ends once it has written its backlog.  In the loader: a worker has no thread sending batches (the
feeder thread of multiprocessing's queue is what this removes), unless the switch turns it off,
and batches and states equal those of multiprocessing's queues.
"""

from __future__ import annotations

import gc
import hashlib
import threading
from pathlib import Path

import pytest
from energon_lite_dev.synthetic import prepared_text_dataset

from megatron_energon_lite import (
    DefaultTaskEncoder,
    WorkerConfig,
    get_savable_loader,
    get_train_dataset,
)
from megatron_energon_lite.loader.handover.queues import (
    DIRECT_QUEUES_ENV,
    PIPE_BYTES,
    DirectForkContext,
    DirectQueue,
)

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

#: Sizes that take the direct path, the sender (over half the pipe), and back.
SIZES = [10, 100_000, 3 * PIPE_BYTES, 20, 400_000, 700_000, 5, 2 * PIPE_BYTES, 1]


def _message(writer: int, seq: int, size: int) -> tuple[int, int, bytes, str]:
    payload = bytes([(writer * 31 + seq) % 251]) * size
    return writer, seq, payload, hashlib.sha1(payload).hexdigest()


def _write(q: DirectQueue, writer: int, sizes: list[int]) -> None:
    for seq, size in enumerate(sizes):
        q.put(_message(writer, seq, size))


def _check(message: tuple[int, int, bytes, str]) -> None:
    writer, seq, payload, digest = message
    assert hashlib.sha1(payload).hexdigest() == digest, f"writer {writer} message {seq} arrived damaged"


def test_messages_of_every_size_arrive_whole_and_in_order() -> None:
    ctx = DirectForkContext()
    q = ctx.Queue()
    child = ctx.Process(target=_write, args=(q, 0, SIZES))
    child.start()
    got = [q.get(timeout=60) for _ in SIZES]
    child.join(timeout=60)
    assert child.exitcode == 0
    for message in got:
        _check(message)
    assert [(m[1], len(m[2])) for m in got] == list(enumerate(SIZES))


def test_two_writers_at_once_do_not_mix_their_messages() -> None:
    ctx = DirectForkContext()
    q = ctx.Queue()
    sizes = [SIZES[i % len(SIZES)] // 3 + i for i in range(60)]
    children = [ctx.Process(target=_write, args=(q, w, sizes)) for w in range(2)]
    for child in children:
        child.start()
    got = [q.get(timeout=60) for _ in range(2 * len(sizes))]
    for child in children:
        child.join(timeout=60)
        assert child.exitcode == 0
    for message in got:
        _check(message)
    for w in range(2):
        assert [m[1] for m in got if m[0] == w] == list(range(len(sizes)))


def _senders() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "DirectQueueSender"]


def test_put_returns_when_nobody_reads_and_the_sender_ends_after_its_backlog() -> None:
    """A writer that blocked in ``put`` would hold up the loader's shutdown: far more than the pipe
    holds is put with no reader, then read back in order."""
    q = DirectForkContext().Queue()
    sizes = [300_000] * 12 + [10] * 50
    putter = threading.Thread(target=_write, args=(q, 0, sizes), daemon=True)
    putter.start()
    putter.join(timeout=60)
    assert not putter.is_alive(), "put blocked while nobody read the queue"
    assert _senders(), "3.6 MB cannot all be in a 1 MiB pipe: a sender thread writes the rest"
    got = [q.get(timeout=60) for _ in sizes]
    assert [m[1] for m in got] == list(range(len(sizes)))
    for message in got:
        _check(message)
    for _ in range(600):  # the sender thread ends once its backlog is written
        if not _senders():
            break
        threading.Event().wait(0.05)
    assert not _senders()


# --- in the loader ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def texts(tmp_path_factory) -> Path:
    return prepared_text_dataset(tmp_path_factory.mktemp("worker_queue") / "text", num_shards=3, samples_per_shard=40, min_words=1, max_words=8, seed=5)


class ThreadNames(DefaultTaskEncoder):
    """Records the other threads of the process that made a batch."""

    def encode_batch(self, batch):
        batch.__subflavors__ = [{"threads": [t.name for t in threading.enumerate() if t is not threading.current_thread()]}]
        return batch


def _run(root: Path, monkeypatch: pytest.MonkeyPatch, direct: str, steps: int = 40) -> tuple[list, list, set]:
    monkeypatch.setenv(DIRECT_QUEUES_ENV, direct)
    config = WorkerConfig(rank=0, world_size=1, num_workers=2)
    dataset = get_train_dataset(root, batch_size=3, shuffle_buffer_size=5, max_samples_per_sequence=4, worker_config=config, task_encoder=ThreadNames())
    loader = get_savable_loader(dataset)
    keys, states, threads = [], [], set()
    it = iter(loader)
    for _ in range(steps):
        batch = next(it)
        keys.append(batch.__key__)
        threads.update(batch.__subflavors__[0]["threads"])
        states.append(loader.save_state_rank())
    del it, loader
    gc.collect()
    return keys, states, threads


def test_a_worker_sends_from_its_main_thread_and_its_batches_are_those_of_multiprocessings_queues(texts: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keys, states, threads = _run(texts, monkeypatch, "1")
    expected_keys, expected_states, feeder_threads = _run(texts, monkeypatch, "0")
    assert keys == expected_keys
    assert states == expected_states
    # Besides the main thread a worker runs our watchdog, which sleeps, and no feeder thread: it
    # writes its batches itself. Only when the pipe is full (the main process is slow to read, as
    # on a loaded machine) does a sender thread take the backlog (tested above); the run over
    # multiprocessing's queues shows that the recording sees threads.
    assert "QueueFeederThread" not in threads, threads
    assert all(name.startswith("energon-lite-watchdog") or name == "DirectQueueSender" for name in threads), threads
    assert "QueueFeederThread" in feeder_threads  # multiprocessing's queue starts its feeder thread
