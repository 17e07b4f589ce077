import io
import math

import numpy as np
import pytest
import torch
from PIL import Image

from megatron_energon_lite.decode import (
    IMAGE_DECODE_MODES,
    SampleDecoder,
    decode_image_bytes,
)
from megatron_energon_lite.errors import ConfigError, DecodeError

ENERGON_MODES = "l8 rgb8 rgba8 l rgb rgba torchl8 torchrgb8 torchrgba8 torchl torchrgb torch torchrgba pil pilrgb pilrgba pill".split()


def _encode(array: np.ndarray, fmt: str, mode: str | None = None, **save: object) -> bytes:
    image = Image.fromarray(array)
    if mode is not None:
        image = image.convert(mode)
    buf = io.BytesIO()
    image.save(buf, format=fmt, **save)
    return buf.getvalue()


def _random(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    array = np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)
    array.flat[0], array.flat[1] = 0, 255  # the full range, so float outputs must reach 0.0 and 1.0
    return array


RGB = _random((9, 13, 3))
RGBA = _random((9, 13, 4), seed=1)
GRAY = _random((9, 13), seed=2)


def _expected_uint8(source: np.ndarray, mode: str) -> np.ndarray:
    """What a lossless image of ``source`` must decode to in ``mode``, computed from the array."""
    channels = 1 if source.ndim == 2 else source.shape[2]
    if mode == "L":
        return source if channels == 1 else np.asarray(Image.fromarray(source).convert("L"))
    if channels == 1:
        rgb = np.repeat(source[:, :, None], 3, axis=2)
    else:
        rgb = source[:, :, :3]
    if mode == "RGB":
        return rgb
    alpha = source[:, :, 3] if channels == 4 else np.full(source.shape[:2], 255, np.uint8)
    return np.concatenate([rgb, alpha[:, :, None]], axis=2)


def _check(out: object, expected_u8: np.ndarray, image_decode: str) -> None:
    """Checks type, dtype, shape, layout and exact values of one decode result."""
    spec = IMAGE_DECODE_MODES[image_decode]
    if spec.output == "pil":
        assert isinstance(out, Image.Image) and out.mode == spec.mode
        assert out.size == (expected_u8.shape[1], expected_u8.shape[0])
        np.testing.assert_array_equal(np.asarray(out), expected_u8)
        return
    if spec.output == "torch":
        assert isinstance(out, torch.Tensor) and out.is_contiguous()
        values = out.numpy()
        expected = expected_u8.transpose(2, 0, 1) if expected_u8.ndim == 3 else expected_u8
    else:
        assert isinstance(out, np.ndarray)
        values = out
        expected = expected_u8
    assert values.shape == expected.shape
    if spec.uint8:
        assert values.dtype == np.uint8
        np.testing.assert_array_equal(values, expected)
    else:
        assert values.dtype == np.float32
        assert values.min() >= 0.0 and values.max() <= 1.0
        np.testing.assert_array_equal(values, expected.astype(np.float32) / np.float32(255.0))


def test_modes_are_energons() -> None:
    assert sorted(IMAGE_DECODE_MODES) == sorted(ENERGON_MODES)


@pytest.mark.parametrize("image_decode", ENERGON_MODES)
@pytest.mark.parametrize(("source", "mode"), [(RGB, None), (RGBA, None), (GRAY, None)], ids=["rgb", "rgba", "gray"])
def test_png_is_exact(image_decode: str, source: np.ndarray, mode: str | None) -> None:
    data = _encode(source, "PNG")
    out = SampleDecoder(image_decode=image_decode).decode_part("png", data)
    _check(out, _expected_uint8(source, IMAGE_DECODE_MODES[image_decode].mode), image_decode)


@pytest.mark.parametrize("image_decode", ENERGON_MODES)
def test_jpeg_matches_pillow(image_decode: str) -> None:
    data = _encode(RGB, "JPEG", quality=90)
    mode = IMAGE_DECODE_MODES[image_decode].mode
    expected = np.asarray(Image.open(io.BytesIO(data)).convert(mode))
    out = SampleDecoder(image_decode=image_decode).decode_part("jpg", data)
    _check(out, expected, image_decode)


def test_default_is_float_chw_rgb() -> None:
    out = SampleDecoder().decode_part("png", _encode(RGB, "PNG"))
    assert out.shape == (3, 9, 13) and out.dtype == torch.float32
    assert out.min().item() == 0.0 and out.max().item() == 1.0
    torch.testing.assert_close(out, SampleDecoder(image_decode="torch").decode_part("png", _encode(RGB, "PNG")), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("ext", "fmt"),
    [("jpeg", "JPEG"), ("JPG", "JPEG"), ("webp", "WEBP"), ("bmp", "BMP"), ("tiff", "TIFF"), ("tif", "TIFF"), ("ppm", "PPM"), ("gif", "GIF"), ("x.PNG", "PNG")],
)
def test_image_extensions(ext: str, fmt: str) -> None:
    data = _encode(RGB, fmt)
    out = SampleDecoder(image_decode="rgb8").decode_part(ext, data)
    assert out.shape == (9, 13, 3) and out.dtype == np.uint8
    np.testing.assert_array_equal(out, np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))


def test_grayscale_pgm_and_palette() -> None:
    out = SampleDecoder(image_decode="torchl8").decode_part("pgm", _encode(GRAY, "PPM"))
    assert out.shape == (9, 13) and out.dtype == torch.uint8
    np.testing.assert_array_equal(out.numpy(), GRAY)
    palette = Image.fromarray(RGB).quantize(16)
    buf = io.BytesIO()
    palette.save(buf, format="PNG")
    rgba = SampleDecoder(image_decode="rgba8").decode_part("png", buf.getvalue())
    np.testing.assert_array_equal(rgba, np.asarray(palette.convert("RGBA")))


def test_tensor_owns_writable_memory() -> None:
    out = SampleDecoder(image_decode="torchl8").decode_part("png", _encode(GRAY, "PNG"))
    out[0, 0] = 17  # would warn or fail on a read-only buffer
    assert out[0, 0].item() == 17


def test_decode_image_bytes_directly() -> None:
    data = _encode(RGBA, "PNG")
    np.testing.assert_array_equal(decode_image_bytes(data, "rgba8"), RGBA)
    assert decode_image_bytes(data).shape == (3, 9, 13)


def _scale_for(size: tuple[int, int], max_size: int) -> int:
    """The documented choice: the largest of 8, 4, 2 that keeps the longest side >= max_size."""
    return next((s for s in (8, 4, 2) if max(size) // s >= max_size), 1)


@pytest.mark.parametrize(("size", "max_size"), [((1600, 800), 300), ((801, 1203), 150), ((640, 480), 320), ((640, 480), 319), ((640, 480), 1000)])
def test_image_max_size_drafts_jpeg(size: tuple[int, int], max_size: int) -> None:
    width, height = size
    yy, xx = np.mgrid[0:height, 0:width]
    smooth = np.stack([xx * 255 // width, yy * 255 // height, (xx + yy) * 255 // (width + height)], axis=2).astype(np.uint8)
    data = _encode(smooth, "JPEG", quality=95)
    out = SampleDecoder(image_decode="rgb8", image_max_size=max_size).decode_part("jpg", data)
    scale = _scale_for(size, max_size)
    assert out.shape == (math.ceil(height / scale), math.ceil(width / scale), 3)
    assert max(out.shape[:2]) >= min(max_size, max(size))
    reference = np.asarray(Image.fromarray(smooth).resize((out.shape[1], out.shape[0]), Image.Resampling.BOX), dtype=np.float32)
    assert np.abs(out.astype(np.float32) - reference).mean() < 4.0  # the same picture, just smaller
    full = SampleDecoder(image_decode="rgb8").decode_part("jpg", data)
    assert full.shape == (height, width, 3)


def test_image_max_size_leaves_png_alone() -> None:
    big = np.zeros((400, 600, 3), np.uint8)
    out = SampleDecoder(image_decode="rgb8", image_max_size=50).decode_part("png", _encode(big, "PNG"))
    assert out.shape == (400, 600, 3)


def test_truncated_jpeg_raises_decode_error() -> None:
    data = _encode(_random((64, 64, 3)), "JPEG")
    with pytest.raises(DecodeError) as info:
        SampleDecoder().decode({"__key__": "cat_0042", "jpg": data[: len(data) // 2]}, key="cat_0042")
    message = str(info.value)
    assert "'cat_0042'" in message and "part 'jpg'" in message
    assert "image (Pillow) decoder" in message and "image_decode='torchrgb'" in message
    assert "fix:" in message
    assert isinstance(info.value.__cause__, OSError)


def test_garbage_png_raises_decode_error() -> None:
    with pytest.raises(DecodeError) as info:
        SampleDecoder(image_decode="pil").decode_part("png", b"this is not an image", key="k7")
    assert "'k7'" in str(info.value) and "'png'" in str(info.value)
    assert "UnidentifiedImageError" in str(info.value)


@pytest.mark.parametrize("bad", ["RGB", "torch_rgb", "", "numpy", None])
def test_bad_image_decode_raises_config_error(bad: object) -> None:
    with pytest.raises(ConfigError) as info:
        SampleDecoder(image_decode=bad)  # type: ignore[arg-type]
    message = str(info.value)
    assert repr(bad) in message
    for valid in ENERGON_MODES:
        assert valid in message
    with pytest.raises(ConfigError):
        decode_image_bytes(_encode(RGB, "PNG"), bad)  # type: ignore[arg-type]


def test_guess_content_decodes_extensionless_images() -> None:
    pytest.importorskip("filetype")
    data = _encode(RGB, "PNG")
    assert SampleDecoder(image_decode="rgb8").decode_part("bin", data) == data
    out = SampleDecoder(image_decode="rgb8", guess_content=True).decode_part("bin", data)
    np.testing.assert_array_equal(out, RGB)
    assert SampleDecoder(guess_content=True).decode_part("txt", b"plain text") == "plain text"


SOURCES = {
    "jpg_rgb": ("jpg", lambda: _encode(RGB, "JPEG")),
    "jpg_gray": ("jpeg", lambda: _encode(GRAY, "JPEG")),
    "png_rgba": ("png", lambda: _encode(RGBA, "PNG")),
    "png_gray": ("png", lambda: _encode(GRAY, "PNG")),
    "png_la": ("png", lambda: _encode(RGBA, "PNG", mode="LA")),
    "png_1bit": ("png", lambda: _encode(GRAY, "PNG", mode="1")),
    "png_16bit": ("png", lambda: _encode((GRAY.astype(np.uint16) * 257), "PNG")),
    "gif_palette": ("gif", lambda: _encode(RGB, "GIF")),
    "webp": ("webp", lambda: _encode(RGB, "WEBP")),
}


@pytest.mark.energon
@pytest.mark.parametrize("image_decode", ENERGON_MODES)
@pytest.mark.parametrize("source", list(SOURCES))
def test_matches_webdataset_imagehandler(image_decode: str, source: str) -> None:
    autodecode = pytest.importorskip("webdataset.autodecode")
    ext, make = SOURCES[source]
    data = make()
    theirs = autodecode.imagehandler(image_decode)(f"sample.{ext}", data)
    ours = SampleDecoder(image_decode=image_decode).decode_part(ext, data)
    assert type(ours).__module__.split(".")[0] == type(theirs).__module__.split(".")[0]
    if isinstance(theirs, Image.Image):
        assert (ours.mode, ours.size) == (theirs.mode, theirs.size)
        assert ours.tobytes() == theirs.tobytes()
    elif isinstance(theirs, torch.Tensor):
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        assert torch.equal(ours, theirs)
    else:
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.energon
def test_matches_energon_sample_decoder() -> None:
    pytest.importorskip("megatron.energon")
    from megatron.energon.flavors.webdataset.sample_decoder import (
        SampleDecoder as EnergonSampleDecoder,
    )

    data = _encode(RGB, "JPEG")
    for image_decode in ("torchrgb", "torchrgb8", "rgb8", "pil"):
        theirs = EnergonSampleDecoder(image_decode=image_decode).decode("folder/k.jpg", data)
        ours = SampleDecoder(image_decode=image_decode).decode_file("folder/k.jpg", data)
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
        assert type(np.asarray(ours)) is type(np.asarray(theirs))


def _jpeg_variants():
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(5)
    img = Image.fromarray((rng.random((29, 41, 3)) * 255).astype(np.uint8)).resize((97, 61))
    for subsampling in (0, 1, 2):
        for progressive in (False, True):
            buffer = io.BytesIO()
            img.save(buffer, "JPEG", quality=80, subsampling=subsampling, progressive=progressive)
            yield f"sub{subsampling}-prog{progressive}", buffer.getvalue()
    for mode in ("L", "CMYK"):
        buffer = io.BytesIO()
        img.convert(mode).save(buffer, "JPEG")
        yield mode, buffer.getvalue()


@pytest.mark.parametrize("image_decode", ["rgb8", "rgb", "torchrgb8", "torchrgb"])
def test_jpeg_fast_path_gives_pillows_pixels(image_decode: str, monkeypatch) -> None:
    pytest.importorskip("simplejpeg")
    from megatron_energon_lite.decode import image as image_module

    for name, data in _jpeg_variants():
        fast = decode_image_bytes(data, image_decode)
        monkeypatch.setattr(image_module, "_SIMPLEJPEG", False)  # force Pillow
        slow = decode_image_bytes(data, image_decode)
        monkeypatch.setattr(image_module, "_SIMPLEJPEG", None)
        assert type(fast) is type(slow) and fast.dtype == slow.dtype and fast.shape == slow.shape, name
        assert (fast == slow).all(), name
        if image_decode == "rgb8":
            assert not fast.flags.writeable


def test_rgbx_planes_split_four_byte_pixels_into_channel_planes() -> None:
    from megatron_energon_lite.decode.image import rgbx_planes

    rgbx = _random((7, 5, 4))
    planes = rgbx_planes(rgbx)
    assert planes.shape == (3, 7, 5) and planes.dtype == np.uint8 and planes.flags.c_contiguous
    assert np.array_equal(planes, rgbx[:, :, :3].transpose(2, 0, 1))  # the fourth byte is dropped


@pytest.mark.parametrize("image_decode", ["torchrgb8", "torchrgb"])
def test_torch_jpeg_outputs_are_contiguous_chw(image_decode: str) -> None:
    pytest.importorskip("simplejpeg")
    pixels = _random((12, 20, 3))
    image = decode_image_bytes(_encode(pixels, "JPEG"), image_decode)
    assert image.shape == (3, 12, 20) and image.is_contiguous() and image.dtype == (torch.uint8 if image_decode == "torchrgb8" else torch.float32)



@pytest.mark.parametrize("shape", [(1, 1, 3), (3, 7, 3), (17, 1, 3), (1, 33, 3)])
def test_torch_jpeg_outputs_of_odd_sizes_are_pillows_pixels(shape: tuple[int, int, int]) -> None:
    """RGBX planes for any width and height, colour or grey, as Pillow decodes them."""
    pytest.importorskip("simplejpeg")
    for mode in ("RGB", "L"):
        buffer = io.BytesIO()
        Image.fromarray(_random(shape)).convert(mode).save(buffer, "JPEG", quality=85)
        expected = np.asarray(Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")).transpose(2, 0, 1)
        image = decode_image_bytes(buffer.getvalue(), "torchrgb8")
        assert image.is_contiguous() and np.array_equal(image.numpy(), expected), mode
