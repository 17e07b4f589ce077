"""The resize-and-crop helpers a task encoder calls (decode/resize.py)."""

import numpy as np
import pytest
import torch
from PIL import Image

from megatron_energon_lite.decode.resize import centre_crop_box, resize_centre_crop, resize_image


def _photo(width: int, height: int) -> np.ndarray:
    yy, xx = np.mgrid[0:height, 0:width]
    base = np.stack([xx * 255 / width, yy * 255 / height, 128 + 100 * np.sin(xx / 7.0) * np.cos(yy / 11.0)], axis=2)
    base += np.random.default_rng(0).normal(0, 8, base.shape)
    return np.clip(base, 0, 255).astype(np.uint8)


def _float_reference(hwc: np.ndarray, box: tuple[int, int, int, int], size: int) -> np.ndarray:
    """Pillow's antialiased bilinear filter in float (mode F) on the same crop: no uint8 rounding."""
    left, top, side, _ = box
    crop = hwc[top : top + side, left : left + side].astype(np.float32)
    return np.stack([np.asarray(Image.fromarray(crop[..., c], "F").resize((size, size), Image.Resampling.BILINEAR)) for c in range(3)])


@pytest.mark.parametrize(("width", "height", "size"), [(800, 600, 448), (600, 800, 224), (640, 480, 224), (1001, 333, 300)])
def test_centre_crop_matches_a_float_reference(width: int, height: int, size: int) -> None:
    hwc = _photo(width, height)
    out = resize_centre_crop(hwc, size)
    assert out.dtype == torch.uint8 and out.shape == (3, size, size) and out.is_contiguous()
    reference = _float_reference(hwc, centre_crop_box(width, height), size)
    difference = np.abs(out.numpy().astype(np.float64) - reference)
    assert difference.max() <= 2.0 and difference.mean() < 0.5  # the same filter, rounded to uint8


def test_numpy_torch_and_pil_inputs_agree() -> None:
    hwc = _photo(640, 480)
    from_numpy = resize_centre_crop(hwc, 224)
    from_torch = resize_centre_crop(torch.from_numpy(hwc.transpose(2, 0, 1).copy()), 224)
    from_pil = resize_centre_crop(Image.fromarray(hwc), 224)
    read_only = hwc.copy()
    read_only.setflags(write=False)  # what image_decode="rgb8" hands out
    np.testing.assert_array_equal(from_pil.numpy(), from_numpy.numpy())
    np.testing.assert_array_equal(resize_centre_crop(read_only, 224).numpy(), from_numpy.numpy())
    assert np.abs(from_torch.numpy().astype(int) - from_numpy.numpy()).max() <= 1  # another memory layout, another kernel
    assert read_only[0, 0, 0] == hwc[0, 0, 0]


def test_flat_image_stays_flat_and_small_images_are_enlarged() -> None:
    flat = np.full((100, 150, 3), (10, 200, 77), np.uint8)
    out = resize_centre_crop(flat, 224)
    assert out.shape == (3, 224, 224)
    assert out[:, 0, 0].tolist() == [10, 200, 77] and bool((out == out[:, :1, :1]).all())


def test_resize_image_to_a_grid_and_same_size_is_a_copy_free_pass() -> None:
    hwc = _photo(640, 480)
    tiles = resize_image(hwc, 896, 1344)
    assert tiles.shape == (3, 896, 1344)
    chw = torch.from_numpy(hwc.transpose(2, 0, 1).copy())
    assert resize_image(chw, 480, 640).data_ptr() == chw.data_ptr()


@pytest.mark.parametrize("bad", [np.zeros((8, 8), np.uint8), np.zeros((8, 8, 4), np.uint8), torch.zeros(3, 8, 8), np.zeros((8, 8, 3), np.float32)])
def test_other_than_uint8_rgb_is_refused(bad: object) -> None:
    with pytest.raises(TypeError, match="RGB"):
        resize_centre_crop(bad, 4)


def test_unknown_interpolation_is_refused() -> None:
    with pytest.raises(ValueError, match="bicubic"):
        resize_image(_photo(8, 8), 4, 4, interpolation="nearest")
