"""Bytes written per byte of image in the batches, counted while the loader runs.

Issue 17 asks how often an image crosses memory between the JPEG decoder and the batch the
training loop sees.  This counts it from what the code does, not from reading it: the functions
that write image bytes are wrapped (in this process, before the DataLoader workers are forked,
so the workers count too, into counters in shared memory), the loader runs ``--batches``
batches of 32 256x256 JPEGs, and each kind of write is divided by the bytes of the batches
made (workers run ahead of the loop, so that is more than the loop received):

- decode: simplejpeg's output (``decode.image._fast_jpeg_rgb``): for torch outputs RGBX, four
  bytes a pixel, so 4/3 of the image;
- CHW copy: the decoder's contiguous CHW image (``decode.image._from_rgbx_array``, the planes of
  the RGBX pixels, or ``_from_rgb_array`` for what Pillow decoded);
- batch: the stacked (or padded) batch (``samples.batch_stack``);
- hand-over: a worker's copy of a batch tensor into a slab (``handover.slabs._Placement._place``
  when the tensor was not made there), or into torch's shared memory (a tensor that goes
  torch's way: no slab, or ``ENERGON_LITE_SLAB_MIB=0``).  The main process maps the slabs and
  copies nothing.

Configurations: the default task encoder at 0 and 2 workers, and at 2 workers without slabs.
(Until 2026-11-25 the default batching took JPEGs as CHW views of their HWC pixels and wrote
them once, transposed, into the batch: one write fewer, but the byte-wise transpose cost more
than splitting RGBX into planes and copying those.)

    .venv/bin/python benchmarks/bench_copies.py --data-dir /work/scratch/bench_full

Uses the captioning shards that ``benchmarks/bench_loader.py --data-dir DIR`` generated (256x256
JPEGs), or generates a small set in a temporary directory without ``--data-dir``.
"""

from __future__ import annotations

import argparse
import dataclasses
import mmap
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

KINDS = ("decode", "CHW copy", "batch", "hand-over")
#: Counter rows: the main process and up to this many workers minus one.
ROWS = 16


def _tensors(value, seen: set) -> list:
    """The tensors in an item (dataclass fields, lists, tuples, dicts), each once."""
    import torch

    if isinstance(value, torch.Tensor):
        if id(value) in seen:
            return []
        seen.add(id(value))
        return [value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [t for f in dataclasses.fields(value) for t in _tensors(getattr(value, f.name, None), seen)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v, seen)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v, seen)]
    return []


def measure(workers: int, root: str, batches: int) -> None:
    """One configuration, in this (fresh) process: prints the bytes of each kind per byte of the batches made."""
    import torch

    from megatron_energon_lite import (
        DefaultTaskEncoder,
        WorkerConfig,
        get_loader,
        get_train_dataset,
        samples,
        worker_slabs,
    )
    from megatron_energon_lite.decode import SampleDecoder
    from megatron_energon_lite.decode import image as image_module
    from megatron_energon_lite.loader.handover import slabs as handover

    shared = mmap.mmap(-1, ROWS * len(KINDS) * 8)
    counts = np.frombuffer(shared, dtype=np.int64).reshape(ROWS, len(KINDS))

    def add(kind: str, nbytes: int) -> None:
        info = torch.utils.data.get_worker_info()
        counts[0 if info is None else 1 + info.id, KINDS.index(kind)] += nbytes

    fast_jpeg, from_rgb, from_rgbx, batch_stack = image_module._fast_jpeg_rgb, image_module._from_rgb_array, image_module._from_rgbx_array, samples.batch_stack
    place, dump = handover._Placement._place, handover.dump_for_main

    def counted_fast_jpeg(*args, **kwargs):
        array = fast_jpeg(*args, **kwargs)
        if array is not None:
            add("decode", array.nbytes)
        return array

    def counted_from_rgb(array, *args, **kwargs):
        result = from_rgb(array, *args, **kwargs)
        if isinstance(result, torch.Tensor):  # always a contiguous CHW copy
            add("CHW copy", result.nbytes)
        return result

    def counted_from_rgbx(array, *args, **kwargs):
        result = from_rgbx(array, *args, **kwargs)
        add("CHW copy", result.nbytes)
        return result

    def counted_batch_stack(values):
        out = batch_stack(values)
        add("batch", out.nbytes)
        return out

    def counted_place(self, obj):
        made_there = self.ring.allocation_of(self.worker, obj) is not None
        descriptor = place(self, obj)
        if not made_there:  # copied into a slab, or (None) going torch's way: a copy too
            add("hand-over", obj.nbytes)
        return descriptor

    def counted_dump(payload):
        if worker_slabs.active is None:  # no slabs: every tensor goes torch's way
            for tensor in _tensors(payload, set()):
                if not tensor.is_shared():
                    add("hand-over", tensor.nbytes)
        return dump(payload)

    image_module._fast_jpeg_rgb = counted_fast_jpeg
    image_module._from_rgb_array = counted_from_rgb
    image_module._from_rgbx_array = counted_from_rgbx
    samples.batch_stack = counted_batch_stack
    handover._Placement._place = counted_place
    handover.dump_for_main = counted_dump
    import megatron_energon_lite.loader.streams as streams_module

    streams_module.dump_for_main = counted_dump  # the name the loader's streams imported

    class Uint8(DefaultTaskEncoder):
        decoder = SampleDecoder(image_decode="torchrgb8")

    dataset = get_train_dataset(root, batch_size=32, shuffle_buffer_size=100, max_samples_per_sequence=100, task_encoder=Uint8(),
                                worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers))
    loader = get_loader(dataset)
    it = iter(loader)
    for _ in range(batches):
        next(it)
    del it, loader
    totals = counts.sum(axis=0)
    made = totals[KINDS.index("batch")]
    figures = {kind: totals[i] / made for i, kind in enumerate(KINDS)}
    print(" | ".join(f"{figures[kind]:.2f}" for kind in KINDS) + f" | {sum(figures.values()):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, help="bench_loader.py's --data-dir (its captioning shards)")
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--measure", nargs=2, metavar=("WORKERS", "ROOT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        measure(int(args.measure[0]), args.measure[1], args.batches)
        return
    with tempfile.TemporaryDirectory() as tmp:
        if args.data_dir is not None:
            root = args.data_dir / "captioning"
        else:
            from megatron_energon_lite.synthetic import prepared_captioning_dataset

            root = prepared_captioning_dataset(Path(tmp) / "cap", num_shards=4, samples_per_shard=200, image_size=(256, 256), seed=1)
        print("Bytes written per byte of image in the batches made (uint8 CHW, batch 32, shuffle buffer 100):\n")
        print("| workers | slabs | " + " | ".join(KINDS) + " | total |")
        print("| ---: | --- |" + " ---: |" * (len(KINDS) + 1))
        for workers, slabs in [(0, "-"), (2, "yes"), (2, "no")]:
            env = dict(os.environ)
            if slabs == "no":
                env["ENERGON_LITE_SLAB_MIB"] = "0"
            result = subprocess.run([sys.executable, __file__, "--batches", str(args.batches), "--measure", str(workers), str(root)],
                                    env=env, capture_output=True, text=True, check=False)
            line = result.stdout.strip().splitlines()[-1] if result.returncode == 0 and result.stdout.strip() else f"failed: {result.stderr.strip()[-300:]}"
            print(f"| {workers} | {slabs} | {line} |")


if __name__ == "__main__":
    main()
