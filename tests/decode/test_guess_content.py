"""``SampleDecoder(guess_content=True)``: parts whose name does not tell are decoded by their content
(Energon sniffs them with the ``filetype`` package, which is therefore a dependency of ours too)."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from megatron_energon_lite import SampleDecoder
from megatron_energon_lite.decode.av import AVDecoder

REPO = Path(__file__).resolve().parents[2]


def test_filetype_is_a_declared_dependency() -> None:
    # A fresh install must not raise MissingDependencyError for guess_content=True.
    tomllib = pytest.importorskip("tomllib") if sys.version_info >= (3, 11) else pytest.importorskip("tomli")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = [dep.split(">")[0].split("=")[0].split("[")[0].strip() for dep in project["dependencies"]]
    assert "filetype" in names


def _image(fmt: str) -> bytes:
    pixels = np.arange(8 * 6 * 3, dtype=np.uint8).reshape(8, 6, 3)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt)
    return out.getvalue()


@pytest.mark.parametrize(("ext", "fmt"), [("jpg", "JPEG"), ("png", "PNG")])
def test_images_named_bin_decode_as_their_content(ext: str, fmt: str) -> None:
    data = _image(fmt)
    guessed = SampleDecoder(guess_content=True).decode_part("bin", data)
    by_name = SampleDecoder().decode_part(ext, data)
    assert isinstance(guessed, torch.Tensor) and torch.equal(guessed, by_name)
    assert SampleDecoder().decode_part("bin", data) == data  # without guessing: raw bytes


def test_a_video_named_bin_becomes_a_lazy_video_decoder() -> None:
    from energon_lite_dev.synthetic import make_video

    decoded = SampleDecoder(guess_content=True).decode_part("bin", make_video(), key="k1")
    assert isinstance(decoded, AVDecoder)
    assert decoded.get_metadata(get_video_frame_count=True).video_num_frames == 16


def test_unknown_content_keeps_the_name_rule() -> None:
    assert SampleDecoder(guess_content=True).decode_part("txt", b"plain text") == "plain text"
    assert SampleDecoder(guess_content=True).decode_part("bin", b"\x00\x01plain") == b"\x00\x01plain"
