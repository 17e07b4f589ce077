"""Video question answering: N frames spread uniformly over each video, resized, batched.

Generates a small video-QA dataset (an H.264 ``mp4`` of 8-23 frames in one of three sizes and a
``json`` with the question and its answers per sample), prepares it as ``VidQASample`` with a
field map, and loads it with a task encoder whose ``encode_sample`` turns the lazy ``AVDecoder``
into ``(frames, 3, height, width)`` uint8 frames: only the frames it asks for are decoded.

    .venv/bin/python examples/video_qa.py --frames 8 --size 64x48 --batches 5
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from megatron_energon_lite import DefaultTaskEncoder, VidQASample, WorkerConfig, get_loader, get_train_dataset, stateless
from megatron_energon_lite.decode.av import get_single_frames_uniform
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.synthetic import make_video, write_tar

VIDQA_YAML = """\
sample_type:
  __module__: megatron.energon
  __class__: VidQASample
field_map:
  video: mp4
  context: json[question]
  answers: json[answers]
"""
SIZES = [(64, 48), (48, 64), (80, 60)]


def generate(root: Path, samples: int) -> None:
    """Writes ``samples`` videos + questions in two shards and prepares them."""
    records = []
    for i in range(samples):
        frames = 8 + i % 16
        qa = {"question": f"How many frames does clip {i} have?", "answers": [str(frames), f"{frames} frames"]}
        records.append((f"{i:05d}", {"mp4": make_video(frames=frames, fps=8, size=SIZES[i % len(SIZES)]), "json": json.dumps(qa).encode()}))
    half = (samples + 1) // 2
    write_tar(root / "shards/videos-0.tar", records[:half])
    write_tar(root / "shards/videos-1.tar", records[half:])
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=VIDQA_YAML)


class UniformFrames(DefaultTaskEncoder):
    """Replaces each sample's video by ``num_frames`` uniform frames of ``size`` = (width, height)."""

    def __init__(self, num_frames: int, size: tuple[int, int]) -> None:
        super().__init__()
        self.num_frames, self.size = num_frames, size

    @stateless
    def encode_sample(self, sample: VidQASample) -> VidQASample:
        sample.video = get_single_frames_uniform(sample.video, self.num_frames, video_out_frame_size=self.size)
        return sample


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=None, help="Where to generate the dataset (default: a temporary folder).")
    parser.add_argument("--dataset", type=Path, default=None, help="A prepared dataset of your own (videos with questions, as the generated one: a CrudeWebdataset with mp4 and json parts); default: generate a small one under --data-dir.")
    parser.add_argument("--samples", type=int, default=48)
    parser.add_argument("--frames", type=int, default=8, help="Frames per video.")
    parser.add_argument("--size", default="64x48", help="Frame size WIDTHxHEIGHT.")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    size = tuple(int(v) for v in args.size.lower().split("x"))
    root = args.dataset or (args.data_dir or Path(tempfile.mkdtemp())) / "video_qa"
    if args.dataset is None and not (root / ".nv-meta").is_dir():
        generate(root, args.samples)

    ds = get_train_dataset(root, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=args.workers), batch_size=args.batch_size,
                           shuffle_buffer_size=16, max_samples_per_sequence=8, task_encoder=UniformFrames(args.frames, size), repeat=False)
    batches = samples = 0
    for batch in get_loader(ds):
        if batches < 3:
            print(f"batch {batches}: video {tuple(batch.video.shape)} {batch.video.dtype}, {len(batch.context)} questions, "
                  f"e.g. {batch.context[0]!r} -> {batch.answers[0]}")
        batches += 1
        samples += len(batch.__key__)
    print(f"one epoch: {samples} samples in {batches} batches")


if __name__ == "__main__":
    main()
