"""One measurement of `bench_loader.py`, run in a fresh process so that import cost is counted.

Not meant to be run by hand: `bench_loader.py` starts it as

    python benchmarks/bench_loader_child.py '{"loader": "energon", "dataset": "captioning", ...}'

with the wall clock (``time.time()``) of the moment it spawned the process in ``"t_spawn"``. Only
the standard library is imported before the loader under test, so "first batch" includes the
loader's whole import. Figures go to stdout as ``@@BENCH {json}`` lines, one per phase, so a crash
half-way keeps what was measured before it; an error is reported as ``@@BENCH {"error": ...}``.

Phases: import -> build dataset + loader -> first batch -> warm-up -> timed batches (samples/s)
-> save_state_rank() after each of a few more batches (ours and Energon) -> keep the last state
(pickled and unpickled, as a checkpoint would) and the keys of the batch that follows it -> drop the
loader and time its shutdown (workers joined; webdataset stops here) -> a new loader to its first
batch (imports warm) -> a new loader + restore_state_rank() to its first batch, compared by sample
key with the batch that followed the save.
"""

import json
import sys
import time

T_MAIN = time.time()  # before anything but the interpreter and `json`/`sys`/`time`

import gc  # noqa: E402
import pickle  # noqa: E402
import traceback  # noqa: E402


def emit(**figures) -> None:
    print("@@BENCH " + json.dumps(figures), flush=True)


# -- the three loaders -------------------------------------------------------------------------


def energon_like(package: str, cfg: dict):
    """A factory of new loaders for ours (`megatron_energon_lite`) or Energon (`megatron.energon`).

    The same code for both: only the import differs.
    """
    if package == "ours":
        from megatron_energon_lite import DefaultTaskEncoder, WorkerConfig, get_savable_loader, get_train_dataset
        from megatron_energon_lite.decode import SampleDecoder
    else:
        from megatron.energon import (
            DefaultTaskEncoder,
            SampleDecoder,
            WorkerConfig,
            get_savable_loader,
            get_train_dataset,
        )

    class Uint8TaskEncoder(DefaultTaskEncoder):
        # Images as uint8 CHW tensors (the default, "torchrgb", gives float32 in 0..1).
        decoder = SampleDecoder(image_decode="torchrgb8")

    def make():
        dataset = get_train_dataset(
            cfg["path"],
            worker_config=WorkerConfig(rank=0, world_size=1, num_workers=cfg["workers"]),
            batch_size=cfg["batch_size"],
            shuffle_buffer_size=cfg["shuffle_buffer"],
            max_samples_per_sequence=cfg["max_samples_per_sequence"],
            task_encoder=Uint8TaskEncoder(),
        )
        return get_savable_loader(dataset)

    return make


def webdataset_plain(cfg: dict):
    """A factory of plain webdataset pipelines in a torch DataLoader (no state, no restore)."""
    import torch.utils.data
    import webdataset as wds

    def make():
        dataset = wds.WebDataset(
            cfg["shards"],
            shardshuffle=len(cfg["shards"]),  # an int: True is deprecated and warns in 1.0
            nodesplitter=wds.single_node_only,
            workersplitter=wds.split_by_worker,
            seed=cfg["seed"],
        ).shuffle(cfg["shuffle_buffer"])
        if cfg["dataset"] == "captioning":
            dataset = dataset.decode("torchrgb8").to_tuple("jpg", "txt")
        else:
            dataset = dataset.decode().to_tuple("txt")
        # .repeat(): loop over the shards forever like Energon's train datasets, inside each worker.
        dataset = dataset.batched(cfg["batch_size"]).repeat()
        return torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=cfg["workers"])

    return make


# -- batch inspection ---------------------------------------------------------------------------


def batch_keys(batch):
    """The sample keys of a batch as a list of str, or None where the batch carries none."""
    keys = getattr(batch, "__key__", None)
    if keys is None and isinstance(batch, dict):
        keys = batch.get("__key__")
    if keys is None:
        return None
    return [str(k) for k in keys]


def batch_fields(batch) -> list:
    if isinstance(batch, (tuple, list)):
        return list(batch)
    if isinstance(batch, dict):
        return list(batch.values())
    names = getattr(batch, "__dataclass_fields__", None) or vars(batch)
    return [getattr(batch, name, None) for name in names if not str(name).startswith("__")]


def batch_len(batch) -> int:
    keys = batch_keys(batch)
    if keys is not None:
        return len(keys)
    for value in batch_fields(batch):
        if hasattr(value, "shape") and len(value.shape) > 0:
            return int(value.shape[0])
        if isinstance(value, (list, tuple)):
            return len(value)
    raise TypeError(f"cannot count the samples in a {type(batch).__name__}")


def describe(batch) -> str:
    """``uint8[32, 3, 256, 256]`` for the first tensor in the batch, else the first list's type."""
    for value in batch_fields(batch):
        if hasattr(value, "dtype") and hasattr(value, "shape"):
            return f"{str(value.dtype).replace('torch.', '')}{list(value.shape)}"
    for value in batch_fields(batch):
        if isinstance(value, (list, tuple)) and value:
            return f"{len(value)} x {type(value[0]).__name__}"
    return type(batch).__name__


# -- the measurement ----------------------------------------------------------------------------


def main() -> None:
    cfg = json.loads(sys.argv[1])
    t_spawn = cfg["t_spawn"]
    emit(interpreter_s=T_MAIN - t_spawn)
    phase = "import"
    try:
        if cfg["torch_threads"] > 0:
            import torch

            torch.set_num_threads(cfg["torch_threads"])
        if cfg["loader"] == "webdataset":
            make = webdataset_plain(cfg)
        else:
            make = energon_like(cfg["loader"], cfg)
        emit(import_s=time.time() - t_spawn)

        phase = "build loader"
        loader = make()
        phase = "first batch"
        iterator = iter(loader)
        batch = next(iterator)
        emit(first_batch_s=time.time() - t_spawn, batch=describe(batch))

        phase = "warm-up"
        for _ in range(cfg["warmup"]):
            next(iterator)

        phase = "timed batches"
        samples = 0
        start = time.perf_counter()
        for _ in range(cfg["batches"]):
            samples += batch_len(next(iterator))
        elapsed = time.perf_counter() - start
        emit(samples_per_s=samples / elapsed, timed_samples=samples, timed_s=elapsed)

        stateful = cfg["loader"] != "webdataset"
        consumed = 1 + cfg["warmup"] + cfg["batches"]
        phase = "save_state_rank"
        save_times = []
        state = expected_keys = None
        for _ in range(cfg["save_calls"] if stateful else 0):
            next(iterator)
            consumed += 1
            start = time.perf_counter()
            state = loader.save_state_rank()
            save_times.append(time.perf_counter() - start)
        if stateful:
            blob = pickle.dumps(state)
            state = pickle.loads(blob)
            expected_keys = batch_keys(next(iterator))
            emit(
                save_state_ms=1e3 * sum(save_times) / len(save_times),
                save_state_max_ms=1e3 * max(save_times),
                save_calls=len(save_times),
                state_bytes=len(blob),
                saved_after=consumed,
            )

        phase = "shut down the first loader"
        start = time.perf_counter()
        del iterator, loader, batch
        gc.collect()
        emit(shutdown_s=time.perf_counter() - start)
        if not stateful:
            return

        phase = "new loader to first batch"
        start = time.perf_counter()
        fresh = make()
        fresh_iterator = iter(fresh)
        next(fresh_iterator)
        emit(fresh_first_batch_s=time.perf_counter() - start)
        del fresh_iterator, fresh
        gc.collect()

        phase = "restore_state_rank"
        start = time.perf_counter()
        restored = make()
        restored.restore_state_rank(state)
        restored_batch = next(iter(restored))
        restore_s = time.perf_counter() - start
        got_keys = batch_keys(restored_batch)
        if expected_keys is None or got_keys is None:
            exact = "no keys"
        else:
            exact = "yes" if got_keys == expected_keys else f"no ({len(set(got_keys) & set(expected_keys))}/{len(expected_keys)} keys)"
        emit(restore_first_batch_s=restore_s, resume_exact=exact)
    except BaseException as exc:  # noqa: BLE001 - report whatever broke, then exit non-zero
        lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
        where = next((line.strip() for line in reversed(lines) if line.strip().startswith("File ")), "")
        emit(error=f"{phase}: {type(exc).__name__}: {exc}".strip(), where=where, traceback="".join(lines[-12:]))
        sys.stdout.flush()
        raise SystemExit(1)


if __name__ == "__main__":
    main()
