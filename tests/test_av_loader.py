"""Video through the loader: VidQASample from a field map, clips cut in encode_sample, workers,
exact save/restore; a crude audio dataset whose cooker cuts clips."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from energon_lite_dev.resume import batch_identity, check_loader_resume
from energon_lite_dev.synthetic import make_audio, make_video, write_tar

from megatron_energon_lite import (
    Cooker,
    DefaultTaskEncoder,
    VidQASample,
    WorkerConfig,
    basic_sample_keys,
    get_loader,
    get_savable_loader,
    get_train_dataset,
    stateless,
)
from megatron_energon_lite.decode.av import AVDecoder, get_single_frames_uniform
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.samples import Sample

VIDQA_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: VidQASample\nfield_map:\n  video: mp4\n  context: txt\n"


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("av") / "vidqa"
    clips = [make_video(frames=8 + i % 3, fps=8, size=(32, 24)) for i in range(3)]
    samples = [(f"{i:03d}", {"mp4": clips[i % 3], "txt": f"what happens in clip {i}?".encode()}) for i in range(12)]
    write_tar(root / "shards/a.tar", samples[:6])
    write_tar(root / "shards/b.tar", samples[6:])
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=VIDQA_YAML)
    return root


class FourFrames(DefaultTaskEncoder):
    @stateless
    def encode_sample(self, sample: VidQASample) -> VidQASample:
        assert isinstance(sample.video, AVDecoder)
        sample.video = get_single_frames_uniform(sample.video, 4, video_out_frame_size=(16, 12))
        return sample


def loader(root: Path, workers: int):
    ds = get_train_dataset(root, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers), batch_size=2, shuffle_buffer_size=3, max_samples_per_sequence=2, task_encoder=FourFrames())
    return get_savable_loader(ds)


@pytest.mark.parametrize("workers", [0, 2])
def test_video_batches_and_exact_resume(videos: Path, workers: int) -> None:
    def video(batch):
        assert batch.video.shape == (2, 4, 3, 12, 16) and batch.video.dtype == torch.uint8
        return batch_identity(batch)

    check_loader_resume(lambda: loader(videos, workers), 10, at=(0, 3, 6, 10), identity=video)


def test_the_lazy_decoder_crosses_into_the_main_process(videos: Path) -> None:
    ds = get_train_dataset(videos, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=2), batch_size=None, shuffle_buffer_size=None, max_samples_per_sequence=None)
    sample = next(iter(get_loader(ds)))
    assert isinstance(sample.video, AVDecoder)
    assert sample.video.get_metadata().video_fps == 8.0


@stateless
def cook_audio(crude: dict) -> Sample:
    clips, _ = crude["wav"].get_audio_clips([(0.0, 0.25)])
    meta = json.loads(crude["json"]) if isinstance(crude["json"], (bytes, str)) else crude["json"]
    return AudioCaption(**basic_sample_keys(crude), audio=clips[0], caption=meta["caption"])


@dataclasses.dataclass
class AudioCaption(Sample):
    audio: torch.Tensor = None
    caption: str = ""


def test_crude_audio_with_a_cooker_that_cuts_clips(tmp_path: Path) -> None:
    root = tmp_path / "audio"
    write_tar(root / "shards/a.tar", [(f"{i:02d}", {"wav": make_audio(0.5 + 0.1 * i), "json": json.dumps({"caption": f"tone {i}"}).encode()}) for i in range(5)])
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml="__module__: megatron.energon\n__class__: CrudeWebdataset\n")

    class Encoder(DefaultTaskEncoder):
        cookers = [Cooker(cook_audio)]

    ds = get_train_dataset(root, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), batch_size=5, shuffle_buffer_size=None, max_samples_per_sequence=None, task_encoder=Encoder(), repeat=False)
    batch = next(iter(get_loader(ds)))
    assert batch.audio.shape == (5, 1, 4000) and sorted(batch.caption) == [f"tone {i}" for i in range(5)]


def test_prepare_cli_with_vidqa_sample_type(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from megatron_energon_lite.cli.main import cli

    root = tmp_path / "vids"
    write_tar(root / "shards/a.tar", [(f"{i:02d}", {"mp4": make_video(frames=4, size=(16, 16)), "txt": b"q?"}) for i in range(3)])
    result = CliRunner().invoke(cli, ["prepare", "--non-interactive", "--split-ratio", "1,0,0", "--sample-type", "VidQASample", "--field-map", '{"video": "mp4", "context": "txt"}', "--no-progress", str(root)])
    assert result.exit_code == 0, result.output
    ds = get_train_dataset(root, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), batch_size=None, shuffle_buffer_size=None, max_samples_per_sequence=None, repeat=False)
    samples = list(get_loader(ds))
    assert len(samples) == 3 and all(isinstance(s, VidQASample) and s.video.get_metadata().video_width == 16 for s in samples)
