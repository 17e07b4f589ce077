"""Audio captioning: a fixed-length 16 kHz clip of each recording, with its caption, batched.

Generates a small crude dataset (``CrudeWebdataset``) of recordings, each a ``wav`` or a
``flac`` at 16, 22.05 or 44.1 kHz and 0.3-2 s long, plus a ``txt`` caption. A cooker turns each
crude dict into a typed ``AudioCaption`` sample (the lazy ``AVDecoder`` and the caption), and
``encode_sample`` decodes the first ``--seconds`` of audio resampled to 16 kHz, zero-padded to a
fixed length, keeping the number of real samples in ``audio_length``.

    .venv/bin/python examples/audio_captioning.py --seconds 1.0 --batch-size 4
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path

import torch

from megatron_energon_lite import Cooker, DefaultTaskEncoder, Sample, WorkerConfig, basic_sample_keys, get_loader, get_train_dataset, stateless
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.synthetic import make_audio, write_tar

CRUDE_YAML = "__module__: megatron.energon\n__class__: CrudeWebdataset\n"
RATE = 16000
SOURCE_RATES = [16000, 22050, 44100]


def generate(root: Path, samples: int) -> None:
    """Writes ``samples`` recordings + captions in one shard and prepares them as crude."""
    records = []
    for i in range(samples):
        fmt, seconds, rate = ("wav", "flac")[i % 2], 0.3 + 0.1 * (i % 18), SOURCE_RATES[i % 3]
        caption = f"recording {i}: a {seconds:.1f} second 440 Hz tone at {rate} Hz"
        records.append((f"{i:05d}", {fmt: make_audio(seconds, rate, fmt), "txt": caption.encode()}))
    write_tar(root / "shards/audio-0.tar", records)
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=CRUDE_YAML)


@dataclasses.dataclass
class AudioCaption(Sample):
    audio: object = None  # an AVDecoder once cooked, a (1, samples) float32 tensor once encoded
    audio_length: int = 0  # samples before padding
    caption: str = ""


@stateless
def cook(crude: dict) -> AudioCaption:
    """Crude dict (parts decoded by extension) -> a typed sample, whichever audio part it has."""
    audio = crude["wav"] if "wav" in crude else crude["flac"]
    return AudioCaption(**basic_sample_keys(crude), audio=audio, caption=crude["txt"])


class FixedClips(DefaultTaskEncoder):
    cookers = [Cooker(cook)]

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.length = round(seconds * RATE)

    @stateless
    def encode_sample(self, sample: AudioCaption) -> AudioCaption:
        clips, _ = sample.audio.get_audio_clips([(0.0, self.length / RATE)], sample_rate=RATE)
        clip = clips[0].mean(dim=0, keepdim=True)[:, : self.length]  # mono, at most `length` samples
        sample.audio_length = clip.shape[1]
        sample.audio = torch.nn.functional.pad(clip, (0, self.length - clip.shape[1]))
        return sample


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=None, help="Where to generate the dataset (default: a temporary folder).")
    parser.add_argument("--dataset", type=Path, default=None, help="A prepared dataset of your own (audio clips with captions, as the generated one: a CrudeWebdataset with wav and txt parts); default: generate a small one under --data-dir.")
    parser.add_argument("--samples", type=int, default=48)
    parser.add_argument("--seconds", type=float, default=1.0, help="Clip length in seconds.")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    root = args.dataset or (args.data_dir or Path(tempfile.mkdtemp())) / "audio_captioning"
    if args.dataset is None and not (root / ".nv-meta").is_dir():
        generate(root, args.samples)

    ds = get_train_dataset(root, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=args.workers), batch_size=args.batch_size,
                           shuffle_buffer_size=16, max_samples_per_sequence=8, task_encoder=FixedClips(args.seconds), repeat=False)
    batches = samples = padded = 0
    for batch in get_loader(ds):
        if batches < 3:
            print(f"batch {batches}: audio {tuple(batch.audio.shape)} {batch.audio.dtype}, lengths {batch.audio_length}, "
                  f"e.g. {batch.caption[0]!r}")
        batches += 1
        samples += len(batch.__key__)
        padded += sum(n < batch.audio.shape[-1] for n in batch.audio_length)
    print(f"one epoch: {samples} samples in {batches} batches, {padded} clips padded")


if __name__ == "__main__":
    main()
