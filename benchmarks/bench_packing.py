"""Packing text to 4096 tokens: packed sequences/s for ours and Energon 7.4.1, and padding waste.

Uses the text set of bench_loader.py (4 shards x 2500 texts of 5..400 words, prepared with
Energon's CLI; generated on first use), a byte-level tokenizer (one token per UTF-8 byte), and
the same packing logic for both loaders: megatron_energon_lite's TextPackingTaskEncoder
(first-fit-decreasing over a buffer of 64 samples), called from an Energon TaskEncoder subclass
for Energon.  Batches of 8 packs, 2 workers by default, each measurement in a fresh process.

Padding waste = pad tokens / all tokens in the sequences, with packing and without (one sample
per 4096-token sequence, padded).

    .venv/bin/python benchmarks/bench_packing.py --data-dir /tmp/bench_loader
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

SEQ = 4096
CHILD_FLAG = "--child"


def tokenizer(text: str) -> list[int]:
    return [b + 1 for b in text.encode("utf-8")]  # 0 is padding


def child(loader_name: str, data: Path, workers: int, batches: int, warmup: int, buffer: int) -> dict:
    from megatron_energon_lite.encoders import TextPackingTaskEncoder

    ours = TextPackingTaskEncoder(tokenizer, SEQ)
    if loader_name == "ours":
        import megatron_energon_lite as module

        encoder = ours
    else:
        import megatron.energon as module

        class EnergonPacking(module.DefaultTaskEncoder):
            """The same hooks, delegated to our encoder so both run identical packing code."""

            @module.stateless
            def encode_sample(self, sample):
                return ours.encode_sample(sample)

            def select_samples_to_pack(self, samples):
                return ours.select_samples_to_pack(samples)

            @module.stateless
            def pack_selected_samples(self, samples):
                return ours.pack_selected_samples(samples)

            def batch(self, samples):
                return ours.batch(samples)

            def encode_batch(self, batch):
                return batch

        encoder = EnergonPacking()
    config = module.WorkerConfig(rank=0, world_size=1, num_workers=workers)
    ds = module.get_train_dataset(str(data), worker_config=config, batch_size=8, shuffle_buffer_size=100, max_samples_per_sequence=100, packing_buffer_size=buffer, task_encoder=encoder)
    loader = module.get_savable_loader(ds)
    it = iter(loader)
    for _ in range(warmup):
        next(it)
    pad = total = packs = 0
    start = time.perf_counter()
    for _ in range(batches):
        batch = next(it)
        packs += batch.tokens.shape[0]
        pad += int((batch.tokens == 0).sum())
        total += batch.tokens.numel()
    elapsed = time.perf_counter() - start
    return {"packs_per_s": packs / elapsed, "padding": pad / total}


def unpacked_padding(data: Path, samples: int) -> float:
    """Padding of one sample per sequence: 1 - mean(tokens) / SEQ, over the first samples."""
    import megatron_energon_lite as lite

    ds = lite.get_val_dataset(str(data), split_part="train", worker_config=lite.WorkerConfig(rank=0, world_size=1, num_workers=0), batch_size=None)
    lengths = []
    for sample in lite.get_loader(ds):
        lengths.append(min(SEQ, len(tokenizer(sample.text))))
        if len(lengths) >= samples:
            break
    return 1 - sum(lengths) / (len(lengths) * SEQ)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/bench_loader"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batches", type=int, default=150)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--buffer", type=int, default=64, help="packing_buffer_size")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(CHILD_FLAG, nargs=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], args.data_dir / "text", args.workers, args.batches, args.warmup, args.buffer)))
        return
    if not (args.data_dir / "text" / ".nv-meta").is_dir():
        subprocess.run([sys.executable, str(Path(__file__).with_name("bench_loader.py")), "--data-dir", str(args.data_dir), "--datasets", "text", "--only", "ours", "--quick"], check=True)
    from tqdm import tqdm

    results: dict[str, list[dict]] = {"ours": [], "energon": []}
    runs = [(name, r) for r in range(args.repeats) for name in results]
    for name, _ in tqdm(runs, desc="packing runs"):
        cmd = [sys.executable, __file__, CHILD_FLAG, name, "--data-dir", str(args.data_dir), "--workers", str(args.workers), "--batches", str(args.batches), "--warmup", str(args.warmup), "--buffer", str(args.buffer)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        results[name].append(json.loads(out))
    median = {name: sorted(r["packs_per_s"] for r in runs_)[len(runs_) // 2] for name, runs_ in results.items()}
    print(f"\nPacking text to {SEQ} tokens, batch 8, packing_buffer_size {args.buffer}, {args.workers} workers, median of {args.repeats}:\n")
    print("| loader | packed sequences/s | padding with packing |")
    print("| --- | ---: | ---: |")
    for name in results:
        print(f"| {name} | {median[name]:,.0f} | {results[name][0]['padding']:.1%} |")
    print(f"\nours / Energon: {median['ours'] / median['energon']:.2f}x")
    print(f"Padding without packing (one sample per {SEQ}-token sequence): {unpacked_padding(args.data_dir / 'text', 2000):.1%}")


if __name__ == "__main__":
    main()
