"""Blend three datasets 6/3/1 through a metadataset YAML and watch the realized mix converge.

Generates a small image-caption dataset and two text datasets, prepares them, writes a
metadataset YAML that blends them, then streams batches and prints, every ``--every`` batches,
what ``loader.blend_report()`` says was read so far next to the target weights.

``--mode random`` draws each sample's dataset by weight (Energon's behaviour): the mix converges
slowly.  ``--mode exact`` (ours) follows a deterministic schedule: each dataset's count stays
within one sample of its target at every step of the global stream; the shuffle buffer after the
blend (``shuffle_buffer_size=32``) then reorders a few samples, so the report, which counts samples
that left the buffer, can be a few samples off.

    .venv/bin/python examples/blend_mix.py --mode exact --batches 100 --every 25
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

from megatron_energon_lite import (
    CaptioningSample,
    DefaultTaskEncoder,
    TextSample,
    WorkerConfig,
    get_savable_loader,
    get_train_dataset,
)
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.synthetic import generate_captioning_dataset, generate_text_dataset

logger = logging.getLogger("blend_mix")

TEXT_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"
CAPTION_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: CaptioningSample\nfield_map:\n  image: jpg\n  caption: txt\n"

BLEND_YAML = """\
# Written by examples/blend_mix.py: paths are relative to this file.
__module__: megatron.energon
__class__: MetadatasetV2
splits:
  train:
    blend_mode: {mode}
    blend:
      - weight: 6
        path: captions
      - weight: 3
        path: text_a
      - weight: 1
        path: text_b
"""


class AllText(DefaultTaskEncoder):
    """A blend mixes sample types; batches must not, so every sample becomes a TextSample."""

    def encode_sample(self, sample):
        if isinstance(sample, CaptioningSample):
            return TextSample.derive_from(sample, text=sample.caption)
        return sample


def make_datasets(data_dir: Path, mode: str) -> Path:
    """Generates and prepares the three datasets (once) and writes the blend YAML; returns its path."""
    datasets = {
        "captions": (lambda root: generate_captioning_dataset(root, num_shards=4, samples_per_shard=40, image_size=(16, 12), seed=1), CAPTION_YAML),
        "text_a": (lambda root: generate_text_dataset(root, num_shards=4, samples_per_shard=40, max_words=20, seed=2), TEXT_YAML),
        "text_b": (lambda root: generate_text_dataset(root, num_shards=2, samples_per_shard=40, max_words=20, seed=3), TEXT_YAML),
    }
    for name, (generate, dataset_yaml) in datasets.items():
        root = data_dir / name
        if (root / ".nv-meta").is_dir():
            logger.info("reusing %s", root)
            continue
        generate(root)
        prepare_dataset(root, split_ratio=(8, 1, 1), progress=False, num_workers=1, dataset_yaml=dataset_yaml)
        logger.info("prepared %s", root)
    yaml_path = data_dir / f"blend_{mode}.yaml"
    yaml_path.write_text(BLEND_YAML.format(mode=mode))
    return yaml_path


def print_mix(step: int, report: list[dict]) -> None:
    print(f"after {step} batches:")
    print(f"  {'dataset':<10} {'target':>7} {'samples':>8} {'realized':>9}")
    for row in report:
        print(f"  {Path(row['path']).name:<10} {row['target_share']:>7.1%} {row['samples']:>8} {row['share']:>9.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=None, help="Where to generate the datasets (default: a temporary folder).")
    parser.add_argument("--blend", type=Path, default=None, help="A metadataset YAML of your own (its datasets' samples must become TextSample, as AllText does); default: generate three datasets and blend them.")
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--every", type=int, default=50, help="Print the realized mix every N batches.")
    parser.add_argument("--mode", choices=("random", "exact"), default="random", help="The YAML's blend_mode.")
    parser.add_argument("--workers", type=int, default=2, help="Dataloader worker processes (0: in this process).")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    with tempfile.TemporaryDirectory(prefix="blend_mix_") as tmp:
        data_dir = args.data_dir or Path(tmp)
        data_dir.mkdir(parents=True, exist_ok=True)
        yaml_path = args.blend or make_datasets(data_dir, args.mode)
        print(f"blend {yaml_path} (blend_mode: {args.mode}), {args.workers} worker(s)")
        dataset = get_train_dataset(
            yaml_path,
            worker_config=WorkerConfig(rank=0, world_size=1, num_workers=args.workers),
            batch_size=8,
            shuffle_buffer_size=32,
            max_samples_per_sequence=16,
            blend_mode=None,  # the YAML's blend_mode decides
            task_encoder=AllText(),
        )
        loader = get_savable_loader(dataset)
        for step, _batch in enumerate(loader, start=1):
            if step % args.every == 0 or step == args.batches:
                print_mix(step, loader.blend_report())
            if step == args.batches:
                break


if __name__ == "__main__":
    main()
