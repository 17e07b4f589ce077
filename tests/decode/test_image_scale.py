"""Decode at training size: ``SampleDecoder(image_min_side=..., image_max_size=...)``."""

import io

import numpy as np
import pytest
from PIL import Image

from megatron_energon_lite.decode import SampleDecoder, image
from megatron_energon_lite.decode.image import jpeg_scale
from megatron_energon_lite.errors import ConfigError, DecompressionBombError


def _photo(width: int, height: int, seed: int = 0) -> np.ndarray:
    """A smooth gradient with noise: JPEG-like content, every scale visibly different."""
    yy, xx = np.mgrid[0:height, 0:width]
    base = np.stack([xx * 255 // width, yy * 255 // height, (xx + yy) * 255 // (width + height)], axis=2).astype(np.float32)
    base += np.random.default_rng(seed).normal(0, 12, base.shape)
    return np.clip(base, 0, 255).astype(np.uint8)


def _jpeg(width: int, height: int, *, mode: str = "RGB", **save: object) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(_photo(width, height)).convert(mode).save(buf, "JPEG", quality=85, **save)
    return buf.getvalue()


#: (width, height, image_min_side, image_max_size) -> the denominator of the decode scale, by hand:
#: the largest of 8, 4, 2 whose output ceil(side / s) meets every demand, else 1.
SCALE_TABLE = [
    (1600, 1200, 448, None, 2),  # 600 >= 448; 300 is not
    (1600, 1200, 224, None, 4),  # 300 >= 224; 150 is not
    (1600, 1200, 150, None, 8),  # ceil(1200 / 8) = 150
    (1600, 1200, 151, None, 4),
    (640, 480, 224, None, 2),  # 240 >= 224
    (640, 480, 448, None, 1),  # 240 < 448: full size
    (300, 200, 448, None, 1),  # already smaller than asked: full size
    (2000, 895, 448, None, 2),  # ceil(895 / 2) = 448: the output's real size counts, not floor (447)
    (1200, 1600, 448, None, 2),  # portrait: the shorter side is the width
    (1600, 1200, None, 448, 2),  # longer side: 800 >= 448; 400 is not
    (1600, 1200, None, 200, 8),  # 200 >= 200
    (1600, 1200, 224, 448, 2),  # both demands: 1/4 would meet 224 but not 448
    (1600, 1200, None, None, 1),  # nothing asked: full size
    (2000, 6, 1, None, 4),  # 1/8 would leave floor(6 / 8) = 0 rows for Pillow's draft
]


@pytest.mark.parametrize(("width", "height", "min_side", "max_size", "scale"), SCALE_TABLE)
def test_scale_choice(width: int, height: int, min_side: int | None, max_size: int | None, scale: int) -> None:
    assert jpeg_scale(width, height, min_side=min_side, max_size=max_size) == scale


@pytest.mark.parametrize(("width", "height", "min_side", "max_size", "scale"), [row for row in SCALE_TABLE if row[0] <= 1600])
def test_both_paths_decode_at_the_chosen_scale_to_the_same_pixels(width: int, height: int, min_side: int | None, max_size: int | None, scale: int) -> None:
    pytest.importorskip("simplejpeg")
    data = _jpeg(width, height)
    decoder = SampleDecoder(image_decode="rgb8", image_min_side=min_side, image_max_size=max_size)
    fast = image._fast_jpeg_rgb(data, min_side=min_side, max_size=max_size)  # simplejpeg
    pillow = np.asarray(SampleDecoder(image_decode="pil", image_min_side=min_side, image_max_size=max_size).decode_part("jpg", data))
    expected_shape = (-(-height // scale), -(-width // scale), 3)
    assert fast is not None and fast.shape == pillow.shape == expected_shape
    # The same libjpeg-turbo scaled IDCT behind both: the bound on their difference is 0.
    np.testing.assert_array_equal(fast, pillow)
    np.testing.assert_array_equal(decoder.decode_part("jpg", data), fast)


@pytest.mark.parametrize("image_decode", ["rgb8", "torchrgb8", "torchrgb", "l8", "pil"])
def test_scale_one_is_the_full_decode(image_decode: str) -> None:
    data = _jpeg(640, 480)
    full = SampleDecoder(image_decode=image_decode).decode_part("jpg", data)
    same = SampleDecoder(image_decode=image_decode, image_min_side=448).decode_part("jpg", data)
    if image_decode == "pil":
        full, same = np.asarray(full), np.asarray(same)
    np.testing.assert_array_equal(np.asarray(same), np.asarray(full))


@pytest.mark.parametrize(
    ("mode", "save", "image_decode", "shape"),
    [
        ("RGB", {"progressive": True}, "torchrgb8", (3, 300, 400)),
        ("L", {}, "torchrgb8", (3, 300, 400)),  # grayscale JPEG, RGB output (fast path)
        ("L", {"progressive": True}, "l8", (300, 400)),  # Pillow with draft
        ("L", {}, "pill", (300, 400)),
        ("CMYK", {}, "rgb8", (300, 400, 3)),  # Pillow (simplejpeg would round CMYK differently)
    ],
)
def test_progressive_grayscale_and_cmyk_inputs(mode: str, save: dict, image_decode: str, shape: tuple) -> None:
    data = _jpeg(1600, 1200, mode=mode, **save)
    out = SampleDecoder(image_decode=image_decode, image_min_side=224).decode_part("jpg", data)
    out = np.asarray(out)
    assert out.shape == shape
    reference = Image.open(io.BytesIO(data))
    reference.draft(None, (400, 300))
    expected = np.asarray(reference.convert("L" if image_decode in ("l8", "pill") else "RGB"))
    np.testing.assert_array_equal(np.moveaxis(out, 0, -1) if image_decode.startswith("torch") else out, expected)


def test_png_is_decoded_at_full_size() -> None:
    buf = io.BytesIO()
    Image.fromarray(_photo(640, 480)).save(buf, "PNG")
    assert SampleDecoder(image_decode="torchrgb8", image_min_side=100).decode_part("png", buf.getvalue()).shape == (3, 480, 640)


@pytest.mark.parametrize("image_decode", ["torchrgb8", "l8"])  # simplejpeg, Pillow
def test_bomb_limit_counts_the_declared_size_not_the_scaled_one(image_decode: str) -> None:
    data = _jpeg(1600, 1200)
    decoder = SampleDecoder(image_decode=image_decode, image_min_side=150, max_image_pixels=1600 * 1200 - 1)
    with pytest.raises(DecompressionBombError, match="1600x1200"):  # 200x150 decoded pixels would be well under it
        decoder.decode_part("jpg", data)


def test_scan_limit_still_applies() -> None:
    data = _jpeg(640, 480, progressive=True)
    with pytest.raises(DecompressionBombError, match="scans"):
        SampleDecoder(image_min_side=100, max_jpeg_scans=2).decode_part("jpg", data)


@pytest.mark.parametrize("value", [0, -3, 12.5, True, "448"])
def test_bad_image_min_side_is_a_config_error(value: object) -> None:
    with pytest.raises(ConfigError, match="image_min_side"):
        SampleDecoder(image_min_side=value)  # type: ignore[arg-type]


def test_config_names_image_min_side_only_when_set() -> None:
    assert "image_min_side" not in SampleDecoder().config()  # saved fingerprints stay valid
    assert SampleDecoder(image_min_side=448).config()["image_min_side"] == 448


def test_energon_names_reach_the_setting() -> None:
    from megatron_energon_lite.energon.flavors import SampleDecoder as EnergonSampleDecoder  # megatron.energon.SampleDecoder

    out = EnergonSampleDecoder(image_decode="torchrgb8", image_min_side=224).decode_part("jpg", _jpeg(1600, 1200))
    assert out.shape == (3, 300, 400)
