"""Resize and crop for a task encoder: the shorter side to S and the centre S x S, as a uint8
CHW tensor (what a VLM's image processor does), antialiased, with torch's uint8 kernels.

Measured on the 2-core development machine (``benchmarks/bench_resize.py``; results in
``benchmarks/results/resize_2026-11-28.md``; the machine was shared, so the times are noisy, but
the order held in every row): torch's ``interpolate(antialias=True)`` on uint8 took 1.0-1.2 ms
for 800x600 -> 448x448, Pillow's ``resize`` (with or without ``reducing_gap``) 3-14 ms and
OpenCV's ``INTER_AREA`` 3-12 ms; torch matches a float reference of the same antialiased filter as
closely as Pillow does (57 dB PSNR; OpenCV's area filter 46-54 dB), so torch (already a
dependency) is used and OpenCV is not needed. An HxWx3 input (``image_decode="rgb8"``) is resized
channels-last, which torch does fastest: 2-4x faster than a cropped 3xHxW tensor.

Only the centre square is resized (the pixels around it are not read), which on a 4:3 photo
skips a quarter of the work; its edges may differ from resize-then-crop by the filter's reach
(a pixel or two at the border, a fraction of a grey level on average).
"""

from __future__ import annotations

from typing import Any

__all__ = ["INTERPOLATIONS", "centre_crop_box", "resize_centre_crop", "resize_image"]

#: The antialiased filters :func:`resize_image` offers (torch's ``interpolate`` modes).
INTERPOLATIONS = ("bilinear", "bicubic")


def centre_crop_box(width: int, height: int) -> tuple[int, int, int, int]:
    """The centre square of a ``width`` x ``height`` image: (left, top, side, side)."""
    side = min(width, height)
    return (width - side) // 2, (height - side) // 2, side, side


def _chw_tensor(image: Any) -> Any:
    """A 3xHxW uint8 torch view or copy of an RGB image given as 3xHxW uint8 torch (as
    ``image_decode="torchrgb8"`` gives), HxWx3 uint8 numpy (``"rgb8"``) or a PIL image."""
    import numpy as np
    import torch

    if isinstance(image, torch.Tensor):
        tensor = image
    else:
        if not isinstance(image, np.ndarray):  # a PIL image
            image = np.asarray(image.convert("RGB") if image.mode != "RGB" else image)
        if image.ndim != 3 or image.shape[2] != 3:
            raise TypeError(f"expected an HxWx3 RGB array, got shape {image.shape}")
        if not image.flags.writeable:  # decoded arrays are read-only; torch wants writable memory
            image = image.copy()
        tensor = torch.from_numpy(image).permute(2, 0, 1)
    if tensor.dtype != torch.uint8 or tensor.ndim != 3 or tensor.shape[0] != 3:
        raise TypeError(f"expected a 3xHxW uint8 RGB image, got {tensor.dtype} {tuple(tensor.shape)}")
    return tensor


def resize_image(image: Any, height: int, width: int, *, interpolation: str = "bilinear") -> Any:
    """``image`` (3xHxW uint8 torch, HxWx3 uint8 numpy or PIL, RGB) resized to ``height`` x
    ``width``, antialiased when shrinking, as a contiguous 3 x height x width uint8 tensor."""
    import torch

    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"interpolation must be one of {INTERPOLATIONS}, got {interpolation!r}")
    tensor = _chw_tensor(image)
    if tuple(tensor.shape[1:]) == (height, width):
        return tensor.contiguous()
    out = torch.nn.functional.interpolate(tensor[None], size=(height, width), mode=interpolation, antialias=True, align_corners=False)
    return out[0].contiguous()


def resize_centre_crop(image: Any, size: int, *, interpolation: str = "bilinear") -> Any:
    """The centre square of ``image`` (3xHxW uint8 torch, HxWx3 uint8 numpy or PIL, RGB)
    resized to ``size`` x ``size`` (so the shorter side becomes ``size``), as a contiguous
    3 x size x size uint8 tensor. Pair it with ``SampleDecoder(image_decode="rgb8",
    image_min_side=size)``, which decodes JPEGs at the smallest scale that still covers it."""
    import numpy as np
    import torch

    if not isinstance(image, (np.ndarray, torch.Tensor)):  # a PIL image
        image = np.asarray(image.convert("RGB") if image.mode != "RGB" else image)
    if isinstance(image, np.ndarray):  # HxWx3: crop before the copy a read-only array needs
        left, top, side, _ = centre_crop_box(image.shape[1], image.shape[0]) if image.ndim == 3 else (0, 0, None, None)
        tensor = _chw_tensor(image[top : top + side, left : left + side] if side else image)
    else:
        tensor = _chw_tensor(image)
        left, top, side, _ = centre_crop_box(tensor.shape[2], tensor.shape[1])
        tensor = tensor[:, top : top + side, left : left + side]
    return resize_image(tensor, size, size, interpolation=interpolation)
