"""End-to-end demo: generate a small multimodal dataset, prepare it, inspect it, lint it, read it.

The samples mix optional parts (jpg or png images, text, JSON, class ids, numpy arrays), so the
dataset is prepared as crude (``CrudeWebdataset``): samples are dicts of decoded parts.

Run through ``bash scripts/demo.sh`` (which installs everything first), or directly with the
project's environment: ``.venv/bin/python examples/demo.py [--out demo_data]``.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from megatron_energon_lite.decode import SampleDecoder
from megatron_energon_lite.pipeline.load import SampleLoader
from megatron_energon_lite.samples import format_value
from megatron_energon_lite.synthetic import generate_demo_dataset


def run_cli(*args: str) -> None:
    command = [sys.executable, "-m", "megatron_energon_lite.cli.main", *args]
    print(f"\n$ energon-lite {' '.join(args)}", flush=True)
    subprocess.run(command, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("demo_data"), help="Where to generate the dataset.")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--samples-per-shard", type=int, default=50)
    args = parser.parse_args()

    root = args.out / "multimodal"
    if root.exists():
        shutil.rmtree(root)
    shards = generate_demo_dataset(root, num_shards=args.shards, samples_per_shard=args.samples_per_shard, seed=0)
    print(f"Generated {len(shards)} shards under {root}")

    run_cli(
        "prepare", str(root), "--non-interactive", "--split-ratio", "8,1,1",
        "--sample-type", "CrudeWebdataset", "--num-workers", "2",
    )
    run_cli("info", str(root))
    run_cli("lint", str(root), "--parallel", "2")
    run_cli("preview", str(root), "--split-parts", "val", "-n", "3")

    print("\nReading the first samples of the train split from Python:")
    loader = SampleLoader(root, "train", decoder=SampleDecoder(image_decode="torchrgb8"))
    for index in range(3):
        sample = loader.load(index)
        print(f"  {format_value({k: v for k, v in sample.items() if not k.startswith('__')})}")
    loader.close()
    print(f"\nDemo finished: {len(loader)} train samples readable.")


if __name__ == "__main__":
    main()
