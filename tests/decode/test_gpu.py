"""Decoding after the hand-over (decode/gpu.py): device selection and fallback, on CPU.

No GPU and no nvImageCodec here: these tests check that selection sees them absent (the real
check, not a stand-in) and that the bytes hand-over decoded on the CPU gives the very samples the
workers would have decoded."""

import io
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from megatron_energon_lite import DefaultTaskEncoder, WorkerConfig, get_loader, get_train_dataset
from megatron_energon_lite.decode import SampleDecoder
from megatron_energon_lite.decode.gpu import ImageBatchDecoder, gpu_decode_unavailable, select_image_device
from megatron_energon_lite.decode.image import EncodedImage
from megatron_energon_lite.errors import ConfigError, DecompressionBombError, MissingDependencyError

pytestmark = pytest.mark.skipif(gpu_decode_unavailable() is None, reason="a GPU with nvImageCodec is present: these test the fallback")


def _jpeg(width: int = 640, height: int = 480, **save: object) -> bytes:
    yy, xx = np.mgrid[0:height, 0:width]
    pixels = np.stack([xx * 255 // width, yy * 255 // height, (xx * yy) % 256], axis=2).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=85, **save)
    return buf.getvalue()


def test_cuda_asked_for_but_absent_is_an_error_naming_what_is_missing() -> None:
    with pytest.raises(MissingDependencyError) as info:
        ImageBatchDecoder(device="cuda")
    message = str(info.value)
    assert gpu_decode_unavailable() in message and "nvidia-nvimgcodec-cu12" in message and "device='cpu'" in message


def test_auto_falls_back_to_the_cpu_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="megatron_energon_lite.decode.gpu"):
        decoder = ImageBatchDecoder(device="auto")
    assert decoder.device == "cpu"
    assert any("decoded on the CPU" in record.getMessage() and gpu_decode_unavailable() in record.getMessage() for record in caplog.records)
    assert select_image_device("cpu") == "cpu"


def test_unknown_device_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="'gpu'"):
        ImageBatchDecoder(device="gpu")
    with pytest.raises(ConfigError, match="image_handover"):
        SampleDecoder(image_handover="lazy")


@pytest.mark.parametrize(
    ("image_decode", "settings"),
    [("torchrgb8", {}), ("torchrgb8", {"image_min_side": 200}), ("torchrgb", {"image_max_size": 300}), ("rgb8", {}), ("pil", {"image_min_side": 100})],
)
def test_bytes_hand_over_decodes_to_what_the_worker_would_have(image_decode: str, settings: dict) -> None:
    data = _jpeg(progressive=True)
    encoded = SampleDecoder(image_decode=image_decode, image_handover="bytes", **settings).decode_part("jpg", data)
    assert isinstance(encoded, EncodedImage) and encoded.data == data
    expected = SampleDecoder(image_decode=image_decode, **settings).decode_part("jpg", data)
    (decoded,) = ImageBatchDecoder()([encoded])
    np.testing.assert_array_equal(np.asarray(decoded), np.asarray(expected))


def test_limits_are_checked_in_the_worker_before_the_hand_over() -> None:
    decoder = SampleDecoder(image_handover="bytes", max_image_pixels=640 * 480 - 1)
    with pytest.raises(DecompressionBombError, match="640x480"):
        decoder.decode_part("jpg", _jpeg(), key="s1")
    with pytest.raises(DecompressionBombError, match="scans"):
        SampleDecoder(image_handover="bytes", max_jpeg_scans=2).decode_part("jpg", _jpeg(progressive=True))


def test_other_values_pass_through() -> None:
    already = torch.zeros(3, 2, 2, dtype=torch.uint8)
    assert ImageBatchDecoder()([already])[0] is already


def _images_by_key(path: Path, handover: str, workers: int) -> dict[str, object]:
    class Encoder(DefaultTaskEncoder):
        decoder = SampleDecoder(image_decode="torchrgb8", image_min_side=16, image_handover=handover)

        def batch(self, samples):
            return [(s.__key__, s.image) for s in samples]

    ds = get_train_dataset(path, batch_size=4, shuffle_buffer_size=None, max_samples_per_sequence=None, task_encoder=Encoder(), worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers), repeat=False)
    decode = ImageBatchDecoder()
    out = {}
    for batch in get_loader(ds):
        keys, images = zip(*batch)
        if handover == "bytes":
            assert all(isinstance(image, EncodedImage) for image in images)  # bytes crossed the hand-over
            images = decode(images)  # in the main process
        out.update(zip(keys, images))
    return out


def test_loader_with_bytes_hand_over_gives_identical_samples(prepared_captioning: Path) -> None:
    pixels = _images_by_key(prepared_captioning, "pixels", workers=1)
    decoded = _images_by_key(prepared_captioning, "bytes", workers=1)
    assert pixels and decoded.keys() == pixels.keys()
    for key, image in pixels.items():
        assert torch.equal(decoded[key], image), key
