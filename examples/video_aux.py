"""Video from an ``aux:`` folder: a crude dataset names its clips, a cache pool fetches them.

Generates a crude dataset (``CrudeWebdataset``) whose samples hold only a ``json`` part
(``{"video": "clips/clip_0003.mp4", "question": ..., "answer": ...}``, several samples per clip)
and a plain folder ``media/clips/*.mp4`` of small H.264 videos with their media metadata
(``energon-lite prepare-media media --media-metadata-by-extension``). A metadataset names the
folder as the crude entry's ``aux: {media: filesystem://./media}``; the cooker reads the clip's
metadata and asks the ``FileStoreCachePool`` for the clip (``cache.get_lazy``: fetched in the
background), and ``encode_sample`` resolves the lazy in the worker (the task encoder's decoder
makes the ``.mp4`` a lazy ``AVDecoder``) and keeps ``--frames`` uniform frames, resized.

    .venv/bin/python examples/video_aux.py --frames 4 --size 64x48 --batches 3 --workers 2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path

from megatron_energon_lite import (
    Cooker,
    DefaultTaskEncoder,
    Sample,
    WorkerConfig,
    basic_sample_keys,
    cooker,
    get_savable_loader,
    get_train_dataset,
    stateless,
)
from megatron_energon_lite.cache import FileStoreCachePool
from megatron_energon_lite.decode.av import get_single_frames_uniform
from megatron_energon_lite.format.media_metadata import MediaFilter
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.energon.media.filesystem_prepare import prepare_media_folder
from megatron_energon_lite.synthetic import make_video, write_tar

CRUDE_YAML = "__module__: megatron.energon\n__class__: CrudeWebdataset\n"
METADATASET_YAML = """\
__module__: megatron.energon
__class__: MetadatasetV2
splits:
  train:
    path: crude
    aux:
      media: filesystem://./media
"""
SIZES = [(64, 48), (48, 64), (80, 60)]
FPS = 8


def generate(root: Path, samples: int, clips: int) -> None:
    """``clips`` videos in ``root/media/clips`` and ``samples`` questions about them in ``root/crude``."""
    for c in range(clips):
        path = root / f"media/clips/clip_{c:04d}.mp4"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(make_video(frames=8 + 4 * (c % 5), fps=FPS, size=SIZES[c % len(SIZES)]))
    prepare_media_folder(root / "media", MediaFilter.by_extension(), progress=False, num_workers=1)
    records = []
    for i in range(samples):
        c = (i * 3) % clips  # several samples per clip
        qa = {"video": f"clips/clip_{c:04d}.mp4", "question": f"What does clip {c} show?", "answer": f"{8 + 4 * (c % 5)} gray frames"}
        records.append((f"{i:05d}", {"json": json.dumps(qa).encode()}))
    half = (samples + 1) // 2
    write_tar(root / "crude/shards/qa-0.tar", records[:half])
    write_tar(root / "crude/shards/qa-1.tar", records[half:])
    prepare_dataset(root / "crude", split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=CRUDE_YAML)
    (root / "video_aux.yaml").write_text(METADATASET_YAML)


@dataclasses.dataclass
class ClipQA(Sample):
    video: object = None  # a FileCacheLazy once cooked, (frames, 3, h, w) uint8 once encoded
    decoded_as: str = ""  # what the lazy resolved to, for the printout
    duration: float = 0.0  # seconds, from the folder's media metadata
    question: str = ""
    answer: str = ""


@stateless
@cooker(need_cache=True)
def cook(crude: dict, media, cache) -> ClipQA:
    """Crude dict -> ClipQA: the clip is only asked for here (fetched in the background)."""
    qa = crude["json"]
    info = media.get_media_metadata(qa["video"])  # AVMetadata from media/.nv-meta/index.sqlite
    return ClipQA(**basic_sample_keys(crude), video=cache.get_lazy(media, qa["video"]), duration=info.video_duration, question=qa["question"], answer=qa["answer"])


class AuxFrames(DefaultTaskEncoder):
    """Resolves each sample's clip and keeps ``num_frames`` uniform frames of ``size`` = (width, height)."""

    cookers = [Cooker(cook)]

    def __init__(self, num_frames: int, size: tuple[int, int]) -> None:
        super().__init__()
        self.num_frames, self.size = num_frames, size

    @stateless
    def encode_sample(self, sample: ClipQA) -> ClipQA:
        decoder = sample.video.get(sample)  # in the worker; appends the aux file to __sources__
        sample.decoded_as = type(decoder).__name__
        sample.video = get_single_frames_uniform(decoder, self.num_frames, video_out_frame_size=self.size)
        return sample


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=None, help="Where to generate the data (default: a temporary folder).")
    parser.add_argument("--samples", type=int, default=24)
    parser.add_argument("--clips", type=int, default=8)
    parser.add_argument("--frames", type=int, default=4, help="Frames per video.")
    parser.add_argument("--size", default="64x48", help="Frame size WIDTHxHEIGHT.")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    size = tuple(int(v) for v in args.size.lower().split("x"))
    root = (args.data_dir or Path(tempfile.mkdtemp())) / "video_aux"
    if not (root / "video_aux.yaml").is_file():
        generate(root, args.samples, args.clips)

    ds = get_train_dataset(root / "video_aux.yaml", worker_config=WorkerConfig(rank=0, world_size=1, num_workers=args.workers), batch_size=args.batch_size,
                           shuffle_buffer_size=8, max_samples_per_sequence=4, task_encoder=AuxFrames(args.frames, size))
    pool = FileStoreCachePool(parent_cache_dir=root / "cache", max_cache_size_gbytes=0.01, num_workers=2)
    loader = get_savable_loader(ds, cache_pool=pool)
    for index, batch in zip(range(args.batches), loader):
        print(f"batch {index}: keys {list(batch.__key__)}, frames {tuple(batch.video.shape)} {batch.video.dtype}, decoded as {sorted(set(batch.decoded_as))}")
        for key, sources, duration in zip(batch.__key__, batch.__sources__, batch.duration):
            aux = [f"{Path(s.dataset_path).name}/{s.index}" for s in sources if s.dataset_path == str(root / "media")]
            print(f"  {key}: sources {aux} ({float(duration):.3f} s)")
    pool.close()


if __name__ == "__main__":
    main()
