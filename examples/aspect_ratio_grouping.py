"""Batches images by aspect-ratio bucket, with a smaller batch size for wide images.

Generates images of three shapes (wide, tall, square), prepares them as an ImageSample dataset
and loads them with AspectRatioGroupingTaskEncoder; every batch holds one bucket only.

    .venv/bin/python examples/aspect_ratio_grouping.py
"""

from __future__ import annotations

import argparse
import tempfile
from collections import Counter
from pathlib import Path

from megatron_energon_lite import WorkerConfig, get_loader, get_val_dataset
from megatron_energon_lite.encoders import AspectRatioGroupingTaskEncoder
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.synthetic import make_jpeg, write_tar

IMAGE_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: ImageSample\nfield_map:\n  image: jpg\n"
SHAPES = [(64, 32), (32, 64), (48, 48), (60, 32), (48, 50)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--dataset", type=Path, default=None, help="A prepared dataset of your own (ImageSample or CaptioningSample; its val split is read); default: generate a small one under --data-dir.")
    parser.add_argument("--images", type=int, default=100)
    args = parser.parse_args()
    root = args.dataset or (args.data_dir or Path(tempfile.mkdtemp())) / "images"
    if args.dataset is None and not (root / ".nv-meta").is_dir():
        write_tar(root / "shards/data-0.tar", [(f"{i:04d}", {"jpg": make_jpeg(*SHAPES[i % len(SHAPES)], seed=i)}) for i in range(args.images)])
        prepare_dataset(root, split_ratio=(0, 1, 0), progress=False, num_workers=1, dataset_yaml=IMAGE_YAML)
    encoder = AspectRatioGroupingTaskEncoder((0.5, 1.0, 2.0), batch_sizes={2.0: 4})
    ds = get_val_dataset(root, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), batch_size=8, task_encoder=encoder)
    sizes: Counter = Counter()
    for batch in get_loader(ds):
        bucket = encoder.bucket_of(batch.image.shape[-1], batch.image.shape[-2])
        sizes[(bucket, len(batch.__key__))] += 1
    for (bucket, size), count in sorted(sizes.items()):
        print(f"bucket {bucket:>4}: {count} batch(es) of {size}")
    print("validation keeps the partial batches at the end of the pass (batch_drop_last=True drops them)")


if __name__ == "__main__":
    main()
