"""Helpers of the preview tests: small real datasets: solid-colour and four-colour images (so drawn pixels
can be checked against them), crude samples with one part per decodable extension, WAV/MP4 media."""

from __future__ import annotations

import io
import wave
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from click.testing import CliRunner
from energon_lite_dev.synthetic import write_tar
from PIL import Image

from megatron_energon_lite.cli.main import cli
from megatron_energon_lite.format.prepare import prepare_dataset

CAPTIONING_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: CaptioningSample\nfield_map:\n  image: png\n  caption: txt\n"
CRUDE_YAML = "__module__: megatron.energon\n__class__: CrudeWebdataset\n"
#: Distinct colours far apart, so that JPEG thumbnails still tell them apart.
COLOURS = [(220, 30, 30), (30, 180, 40), (40, 60, 220), (240, 200, 20), (200, 40, 200), (20, 200, 210)]


def run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def encoded(image: Image.Image, fmt: str) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


def solid(colour: tuple[int, int, int], size: tuple[int, int] = (40, 30)) -> Image.Image:
    return Image.new("RGB", size, colour)


def quadrants(width: int = 4, height: int = 4) -> Image.Image:
    """Top-left red, top-right green, bottom-left blue, bottom-right yellow."""
    array = np.zeros((height, width, 3), np.uint8)
    array[: height // 2, : width // 2] = (255, 0, 0)
    array[: height // 2, width // 2 :] = (0, 255, 0)
    array[height // 2 :, : width // 2] = (0, 0, 255)
    array[height // 2 :, width // 2 :] = (255, 255, 0)
    return Image.fromarray(array)


def wav_bytes(samples: np.ndarray, rate: int) -> bytes:
    """Mono 16-bit WAV of float samples in [-1, 1] (written with the standard library)."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return buffer.getvalue()


def loud_then_silent(rate: int = 8000, seconds: float = 1.0) -> np.ndarray:
    """A 0.95-amplitude square wave (period 40 samples) for the first half, silence for the second."""
    n = int(rate * seconds)
    samples = np.zeros(n, np.float32)
    samples[: n // 2] = np.where((np.arange(n // 2) // 20) % 2, 0.95, -0.95)
    return samples


def make_dataset(root: Path, samples: Sequence[tuple[str, Mapping[str, bytes]]], dataset_yaml: str, *, shards: int = 1) -> Path:
    """Writes ``samples`` into ``shards`` tars (in order) and prepares them as one train split."""
    per_shard = -(-len(samples) // shards)
    for shard in range(shards):
        write_tar(root / f"shards/part_{shard}.tar", samples[shard * per_shard : (shard + 1) * per_shard])
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=dataset_yaml)
    return root


