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

Dataset ``"text-packed"`` reads the text shards through a packing task encoder (ours and Energon
only): consecutive samples of each ``packing_buffer_size`` buffer are grouped while their texts
stay within ``pack_chars`` characters, and each group becomes one TextSample (texts joined by a
newline, keys by ``+``). Batches hold packs; ``input_samples_per_s`` counts the texts in them.

Loader ``"ceiling"`` (captioning only) is no loader: the JPEG bytes of the shards are read into
memory with ``tarfile`` (untimed), then decoded with our loader's own image decoder for
``image_decode="torchrgb8"`` (``megatron_energon_lite.decode.image.decode_image``) into CHW uint8
tensors, in 1 process (``workers`` 0, in this process) or ``workers`` forked processes each
decoding its share; timed from the start signal until every process is done.
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


#: Joins the keys of the texts in one pack (synthetic keys are digits and slashes, never a '+').
PACK_KEY_SEPARATOR = "+"


# -- the three loaders -------------------------------------------------------------------------


def energon_like(package: str, cfg: dict):
    """A factory of new loaders for ours (`megatron_energon_lite`) or Energon (`megatron.energon`).

    The same code for both: only the import differs.
    """
    if package == "ours":
        from megatron_energon_lite import (
            DefaultTaskEncoder,
            TextSample,
            WorkerConfig,
            get_savable_loader,
            get_train_dataset,
            stateless,
        )
        from megatron_energon_lite.decode import SampleDecoder
    else:
        from megatron.energon import (
            DefaultTaskEncoder,
            SampleDecoder,
            TextSample,
            WorkerConfig,
            get_savable_loader,
            get_train_dataset,
            stateless,
        )

    class Uint8TaskEncoder(DefaultTaskEncoder):
        # Images as uint8 CHW tensors (the default, "torchrgb", gives float32 in 0..1).
        decoder = SampleDecoder(image_decode="torchrgb8")

    budget = cfg.get("pack_chars", 0)

    class TextPackingTaskEncoder(Uint8TaskEncoder):
        """Packs consecutive texts of the buffer while their total length stays within ``budget``."""

        def select_samples_to_pack(self, samples):
            groups, current, used = [], [], 0
            for sample in samples:
                length = len(sample.text)
                if current and used + length > budget:  # a text longer than the budget is a pack alone
                    groups.append(current)
                    current, used = [], 0
                current.append(sample)
                used += length
            if current:
                groups.append(current)
            return groups

        @stateless
        def pack_selected_samples(self, samples):
            # The loaders set the pack's restore key themselves; the joined key lets the parent count texts.
            return TextSample.derive_from(
                samples[0],
                __key__=PACK_KEY_SEPARATOR.join(s.__key__ for s in samples),
                text="\n".join(s.text for s in samples),
            )

    packed = cfg["dataset"] == "text-packed"
    extra = {"packing_buffer_size": cfg["packing_buffer"]} if packed else {}

    def make():
        dataset = get_train_dataset(
            cfg["path"],
            worker_config=WorkerConfig(rank=0, world_size=1, num_workers=cfg["workers"]),
            batch_size=cfg["batch_size"],
            shuffle_buffer_size=cfg["shuffle_buffer"],
            max_samples_per_sequence=cfg["max_samples_per_sequence"],
            task_encoder=TextPackingTaskEncoder() if packed else Uint8TaskEncoder(),
            **extra,
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


# -- the decode ceiling: no loader ----------------------------------------------------------------

#: Images each decoding process decodes before the start signal (imports, caches), untimed.
CEILING_WARMUP_IMAGES = 8


def read_jpegs(shards: list, count: int) -> list:
    """The bytes of the first ``count`` JPEG members of the shards in order, cycled if they hold fewer."""
    import tarfile

    images = []
    for shard in shards:
        with tarfile.open(shard) as tar:
            for member in tar:
                if member.isfile() and member.name.lower().endswith((".jpg", ".jpeg")):
                    images.append(tar.extractfile(member).read())
                    if len(images) == count:
                        return images
    if not images:
        raise RuntimeError(f"no .jpg members in {len(shards)} shards")
    return [images[i % len(images)] for i in range(count)]  # the same bytes objects again: no copies


def decode_ceiling(cfg: dict) -> None:
    """JPEG bytes in memory -> CHW uint8 tensors with our loader's decoder, in 1 or N processes."""
    import multiprocessing
    import threading

    # Our loader's registered image decoder with the settings of SampleDecoder(image_decode="torchrgb8"):
    # the very calls the loader makes per image (simplejpeg where installed, else Pillow; then CHW).
    from megatron_energon_lite.decode import SampleDecoder
    from megatron_energon_lite.decode.image import decode_image

    decoder = SampleDecoder(image_decode="torchrgb8")
    emit(import_s=time.time() - cfg["t_spawn"])
    # As many images as the loaders decode in their timed batches.
    images = read_jpegs(cfg["shards"], cfg["batches"] * cfg["batch_size"])
    first = decode_image(images[0], decoder)  # imports what decoding needs before timing and forking
    emit(batch=f"{str(first.dtype).replace('torch.', '')}{list(first.shape)}")

    def decode_all(share: list) -> int:
        for data in share:
            decode_image(data, decoder)
        return len(share)

    if cfg["workers"] == 0:
        decode_all(images[:CEILING_WARMUP_IMAGES])
        start = time.perf_counter()
        decoded = decode_all(images)
        elapsed = time.perf_counter() - start
    else:
        context = multiprocessing.get_context("fork")  # as DataLoader workers on Linux: the bytes are inherited
        processes = cfg["workers"]
        ready = context.Barrier(processes + 1)
        results = context.SimpleQueue()

        def work(share: list) -> None:
            try:
                import torch

                torch.set_num_threads(1)  # as DataLoader does in its workers
                decode_all(share[:CEILING_WARMUP_IMAGES])
                ready.wait()
                results.put(decode_all(share))
            except BaseException as exc:  # noqa: BLE001 - hand it to the parent, which reports it
                results.put(f"{type(exc).__name__}: {exc}")
                ready.abort()  # a failure before the start must not leave the parent waiting

        workers = [context.Process(target=work, args=(images[i::processes],), daemon=True) for i in range(processes)]
        for worker in workers:
            worker.start()
        try:
            ready.wait()
        except threading.BrokenBarrierError:
            raise RuntimeError(f"a decoding process failed before the start: {results.get()}") from None
        start = time.perf_counter()
        counts = [results.get() for _ in workers]
        elapsed = time.perf_counter() - start
        for worker in workers:
            worker.join()
        failed = [count for count in counts if not isinstance(count, int)]
        if failed:
            raise RuntimeError(f"a decoding process failed: {failed[0]}")
        decoded = sum(counts)
    emit(samples_per_s=decoded / elapsed, timed_samples=decoded, timed_s=elapsed)


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
        if cfg["loader"] == "ceiling":
            phase = "decode ceiling"
            decode_ceiling(cfg)
            return
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
        samples = inputs = 0
        packed = cfg["dataset"] == "text-packed"
        start = time.perf_counter()
        for _ in range(cfg["batches"]):
            batch = next(iterator)
            samples += batch_len(batch)
            if packed:  # counted in the timed loop, as the other loaders' batch_len is
                inputs += sum(len(key.split(PACK_KEY_SEPARATOR)) for key in batch_keys(batch))
        elapsed = time.perf_counter() - start
        emit(samples_per_s=samples / elapsed, timed_samples=samples, timed_s=elapsed)
        if packed:
            emit(input_samples_per_s=inputs / elapsed, texts_per_pack=inputs / samples)

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
