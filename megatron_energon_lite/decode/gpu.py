"""Decoding a batch of images in the main process, on the CPU or on the GPU with nvImageCodec.

With ``SampleDecoder(image_handover="bytes")`` the workers hand over
:class:`~.image.EncodedImage` values (bytes checked against the pixel and scan limits, and the
decoder's settings) instead of pixels; :class:`ImageBatchDecoder` then decodes a batch of them
in the main process:

* ``device="cpu"`` (the default): each with the worker's own decoder
  (:meth:`EncodedImage.decode`): the same pixels the workers would have handed over;
* ``device="cuda"``: JPEGs with a torch output (``torchrgb8``, ``torchrgb``) in one call to
  NVIDIA's nvImageCodec (``pip install nvidia-nvimgcodec-cu12``, or ``-cu13``, and a CUDA build
  of torch), returned as CUDA tensors; with a declared size (``image_min_side`` /
  ``image_max_size``) the full-size decode is area-averaged down to the size the CPU decoder
  gives (:func:`~.image.jpeg_scale`), so shapes agree, pixels differ slightly. Other images go
  through the CPU decoder and are moved to the GPU. Asking for ``"cuda"`` where nvImageCodec or
  CUDA is missing is a :class:`~megatron_energon_lite.errors.MissingDependencyError` naming what
  is missing, not a silent fallback;
* ``device="auto"``: ``"cuda"`` where both are present, else ``"cpu"``, said in one log line.

The GPU path has not been run on a GPU in this project's tests (none was available); its
selection and fallback are tested on CPU.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

from ..errors import MissingDependencyError, check_choice, format_message
from .image import IMAGE_DECODE_MODES, EncodedImage, jpeg_scale

__all__ = ["IMAGE_DEVICES", "ImageBatchDecoder", "gpu_decode_unavailable", "select_image_device"]

logger = logging.getLogger(__name__)

#: ``ImageBatchDecoder(device=...)`` values.
IMAGE_DEVICES = ("cpu", "cuda", "auto")

_INSTALL = "pip install nvidia-nvimgcodec-cu12 (or nvidia-nvimgcodec-cu13 for CUDA 13) with a CUDA build of torch"


@functools.cache
def _nvimgcodec() -> Any:
    """nvImageCodec's module, or None where it is not installed."""
    try:
        from nvidia import nvimgcodec
    except ImportError:
        return None
    return nvimgcodec


def gpu_decode_unavailable() -> str | None:
    """Why images cannot be decoded on the GPU here (None: they can)."""
    import torch

    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False)"
    if _nvimgcodec() is None:
        return "nvImageCodec is not installed (no module nvidia.nvimgcodec)"
    return None


def select_image_device(device: str) -> str:
    """``"cpu"`` or ``"cuda"`` for a requested ``device`` (see the module docstring)."""
    check_choice("image decode device", device, IMAGE_DEVICES, 'use "cpu" (the default), "cuda" (nvImageCodec) or "auto"')
    if device == "cpu":
        return "cpu"
    missing = gpu_decode_unavailable()
    if missing is None:
        return "cuda"
    if device == "auto":
        logger.info("images are decoded on the CPU: %s (ImageBatchDecoder(device='auto'))", missing)
        return "cpu"
    raise MissingDependencyError(
        format_message(
            "ImageBatchDecoder(device='cuda') cannot decode on the GPU here",
            expected="a CUDA device visible to torch and NVIDIA's nvImageCodec",
            found=missing,
            fix=f"{_INSTALL}; or use device='cpu' (or 'auto' to fall back to the CPU)",
        )
    )


class ImageBatchDecoder:
    """Decodes the :class:`~.image.EncodedImage` values of a batch in the main process (see the
    module docstring). Values that are not ``EncodedImage`` pass through unchanged."""

    def __init__(self, device: str = "cpu") -> None:
        self.device = select_image_device(device)
        self._decoder: Any = None

    def __call__(self, images: Sequence[Any]) -> list[Any]:
        """The decoded images, in order."""
        if self.device == "cpu":
            return [image.decode() if isinstance(image, EncodedImage) else image for image in images]
        return self._decode_cuda(images)

    def _decode_cuda(self, images: Sequence[Any]) -> list[Any]:
        import torch

        out: list[Any] = list(images)
        batch = [
            index
            for index, image in enumerate(images)
            if isinstance(image, EncodedImage) and image.data[:2] == b"\xff\xd8" and IMAGE_DECODE_MODES[image.image_decode].output == "torch"
            and IMAGE_DECODE_MODES[image.image_decode].mode == "RGB"
        ]
        if batch:
            nvimgcodec = _nvimgcodec()
            if self._decoder is None:
                self._decoder = nvimgcodec.Decoder()
            params = nvimgcodec.DecodeParams(color_spec=nvimgcodec.ColorSpec.RGB, allow_any_depth=False)
            decoded = self._decoder.decode([images[index].data for index in batch], params=params)
            for index, pixels in zip(batch, decoded):
                if pixels is None:  # nvImageCodec could not decode it: the CPU decoder decides
                    continue
                out[index] = _to_output(torch.as_tensor(pixels, device="cuda").permute(2, 0, 1), images[index])
        for index, image in enumerate(out):
            if isinstance(image, EncodedImage):
                value = image.decode()
                out[index] = value.to("cuda", non_blocking=True) if isinstance(value, torch.Tensor) else value
        return out


def _to_output(chw: Any, image: EncodedImage) -> Any:
    """A full-size 3xHxW uint8 CUDA tensor -> the declared size and type ``image`` asks for."""
    import torch

    _, height, width = chw.shape
    scale = jpeg_scale(width, height, min_side=image.min_side, max_size=image.max_size)
    if scale > 1:
        size = (-(-height // scale), -(-width // scale))
        chw = torch.nn.functional.interpolate(chw[None].float(), size=size, mode="area")[0].round_().clamp_(0, 255).to(torch.uint8)
    if IMAGE_DECODE_MODES[image.image_decode].uint8:
        return chw.contiguous()
    return chw.float().div_(255.0)
