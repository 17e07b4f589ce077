"""GPT token windows from a Megatron ``.bin/.idx`` dataset: our loader against Megatron-Core's ``GPTDataset``.

Writes one dataset (``--documents`` documents, lengths uniform in [1, 2000] uint16 tokens) and
reads batches of ``--batch`` windows of ``--seq`` tokens (+1 for the labels), as ``tokens``,
``labels``, ``loss_mask``, ``position_ids`` (no attention mask: both sides leave it to the
model's causal kernel), through

* ours, streaming: ``get_train_dataset`` of a YAML leaf with ``sequence_length`` and
  ``GPTWindowTaskEncoder(attention_mask=False)``, ``--workers`` each;
* ours, map-style: ``get_map_dataset`` of the same YAML, ``DataLoader(RandomSampler, collate_fn=ds.collate)``;
* Megatron-Core's ``GPTDataset`` (when ``megatron.core`` imports; ``--mcore-path DIR`` adds a
  ``pip install --target DIR megatron-core==0.16.1`` to ``sys.path``), ``create_attention_mask=False``,
  through ``DataLoader`` in index order (its own shuffle index makes that a random order).

Runs alternate between the readers, ``--repeats`` times; the table gives medians of windows/s.
It also checks that Megatron-Core's ``IndexedDataset`` reads our writer's files as we do.

    .venv/bin/python benchmarks/bench_token_windows.py --mcore-path /work/scratch/mcore_pkgs
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from megatron_energon_lite import (
    WorkerConfig,
    get_map_dataset,
    get_savable_loader,
    get_train_dataset,
)
from megatron_energon_lite.encoders import GPTWindowTaskEncoder
from megatron_energon_lite.format.indexed import IndexedReader, IndexedWriter


def write_dataset(prefix: Path, documents: int) -> None:
    rng = np.random.default_rng(0)
    with IndexedWriter(prefix, np.uint16) as writer:
        for length in rng.integers(1, 2001, size=documents):
            writer.add_document(rng.integers(0, 60000, size=int(length)).astype(np.uint16))


def timed(batches, count: int, batch: int) -> float:
    it = iter(batches)
    next(it)  # startup (workers, first reads) is not what this measures
    start = time.perf_counter()
    for _ in range(count):
        next(it)
    return count * batch / (time.perf_counter() - start)


def ours_streaming(yaml: Path, args, workers: int) -> float:
    ds = get_train_dataset(yaml, batch_size=args.batch, shuffle_buffer_size=100, max_samples_per_sequence=100,
                           worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers),
                           task_encoder=GPTWindowTaskEncoder(args.seq, attention_mask=False))
    return timed(get_savable_loader(ds), args.batches, args.batch)


def ours_map(yaml: Path, args, workers: int) -> float:
    ds = get_map_dataset(yaml, split_part="train", task_encoder=GPTWindowTaskEncoder(args.seq, attention_mask=False))
    loader = torch.utils.data.DataLoader(ds, batch_size=args.batch, sampler=torch.utils.data.RandomSampler(ds, generator=torch.Generator().manual_seed(0)),
                                         num_workers=workers, collate_fn=ds.collate)
    return timed(loader, args.batches, args.batch)


def megatron_dataset(prefix: Path, args):
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.tokenizers import MegatronTokenizer

    tokenizer = MegatronTokenizer.from_pretrained(metadata_path={"library": "null"}, vocab_size=65536)
    config = GPTDatasetConfig(random_seed=1, sequence_length=args.seq, blend=([str(prefix)], None), split="100,0,0",
                              path_to_cache=str(prefix.parent / "mcore_cache"), reset_position_ids=False, reset_attention_mask=False,
                              eod_mask_loss=False, create_attention_mask=False, tokenizer=tokenizer)
    train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [None, None, None], lambda: True, config).build()
    return train


def megatron(dataset, args, workers: int) -> float:
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch, num_workers=workers)
    return timed(loader, args.batches, args.batch)


def check_megatron_reads_our_files(prefix: Path) -> str:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    theirs, ours = IndexedDataset(str(prefix)), IndexedReader(prefix)
    picks = np.random.default_rng(1).integers(0, len(ours), size=200)
    same = all(np.array_equal(theirs[int(i)], ours.document(int(i))) for i in picks)
    return f"Megatron-Core IndexedDataset reads our writer's files: {'identical' if same else 'DIFFERENT'} on 200 random documents"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, default=20000)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--mcore-path", default=None, help="a folder holding megatron-core (pip install --target)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    warnings.filterwarnings("ignore")
    if args.mcore_path:
        sys.path.insert(0, args.mcore_path)
    root = Path(tempfile.mkdtemp(prefix="bench_windows_"))
    prefix = root / "tokens"
    write_dataset(prefix, args.documents)
    yaml = root / "windows.yaml"
    yaml.write_text(f"__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    path: {prefix}\n    sequence_length: {args.seq}\n")
    size = os.path.getsize(f"{prefix}.bin")
    print(f"{args.documents} documents, {size / 2**20:.0f} MiB of uint16 tokens; batches of {args.batch} windows of {args.seq}+1 tokens, {args.batches} timed batches per run")

    runs = {}
    for workers in args.workers:
        runs[f"ours, streaming, {workers} workers"] = lambda w=workers: ours_streaming(yaml, args, w)
        runs[f"ours, map-style, {workers} workers"] = lambda w=workers: ours_map(yaml, args, w)
    try:
        theirs = megatron_dataset(prefix, args)
        print(check_megatron_reads_our_files(prefix))
        for workers in args.workers:
            runs[f"Megatron-Core GPTDataset, {workers} workers"] = lambda w=workers: megatron(theirs, args, w)
    except ImportError as exc:
        print(f"Megatron-Core not measured ({exc}); pass --mcore-path")
    rates: dict[str, list[float]] = {name: [] for name in runs}
    for repeat in range(args.repeats):
        for name, run in runs.items():
            rates[name].append(run())
        print(f"repeat {repeat + 1}/{args.repeats} done", flush=True)
    print(f"\n| reader | windows/s (median of {args.repeats}) | runs |\n|---|---:|---|")
    for name, values in rates.items():
        print(f"| {name} | {statistics.median(values):,.0f} | {' / '.join(f'{v:,.0f}' for v in values)} |")


if __name__ == "__main__":
    main()
