"""Packs generated texts into fixed-length token sequences and shows what packing saves.

Generates a small text dataset, loads it with TextPackingTaskEncoder (a byte-level tokenizer
here; pass any `text -> list[int]` function, e.g. a Hugging Face tokenizer's `encode`), prints
padding with and without packing, saves the loader state half-way, restores it into a fresh
loader and checks that the continuation is the same.

    .venv/bin/python examples/text_packing.py --seq-length 1024 --batches 40
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

from megatron_energon_lite import WorkerConfig, get_savable_loader, get_train_dataset
from megatron_energon_lite.encoders import TextPackingTaskEncoder
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.synthetic import generate_text_dataset

TEXT_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"


def byte_tokenizer(text: str) -> list[int]:
    return [b + 1 for b in text.encode("utf-8")]  # 0 is the pad id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--dataset", type=Path, default=None, help="A prepared dataset of your own (TextSample); default: generate a small one under --data-dir.")
    parser.add_argument("--seq-length", type=int, default=1024)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    data = args.dataset or (args.data_dir or Path(tempfile.mkdtemp())) / "texts"
    if args.dataset is None and not (data / ".nv-meta").is_dir():
        generate_text_dataset(data, num_shards=4, samples_per_shard=200, min_words=5, max_words=150, seed=1)
        prepare_dataset(data, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=TEXT_YAML)

    def loader():
        encoder = TextPackingTaskEncoder(byte_tokenizer, args.seq_length)
        ds = get_train_dataset(data, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=args.workers), batch_size=4,
                               shuffle_buffer_size=50, max_samples_per_sequence=50, packing_buffer_size=64, task_encoder=encoder)
        return get_savable_loader(ds)

    first = loader()
    half = args.batches // 2
    seen, state, pad, total, samples = [], None, 0, 0, 0
    for step, batch in zip(range(args.batches), first):
        seen.append(batch.sample_keys)
        if step == half - 1:
            state = first.save_state_rank()  # after `half` batches
        pad += int((batch.tokens == 0).sum())
        total += batch.tokens.numel()
        samples += sum(len(keys) for keys in batch.sample_keys)
    tokens = total - pad
    print(f"{args.batches} batches of 4 x {args.seq_length} tokens: {samples} samples packed, {samples / (args.batches * 4):.1f} per sequence")
    print(f"padding with packing:    {pad / total:.1%}")
    print(f"padding without packing: {1 - tokens / (samples * args.seq_length):.1%} (one sample per sequence)")
    print(f"first batch cu_seqlens (flattened over the batch): {batch.cu_seqlens.tolist()[:8]} ...")

    resumed = loader()
    resumed.restore_state_rank(state)
    rest = [b.sample_keys for _, b in zip(range(args.batches - half), resumed)]
    print("restored half-way: continuation", "matches" if rest == seen[half:] else "DIFFERS")
    if rest != seen[half:]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
