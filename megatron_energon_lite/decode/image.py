"""Image decoding with Pillow, with Energon's (webdataset's) ``image_decode`` semantics.

The image is always converted to the mode named by ``image_decode`` (``L``, ``RGB`` or ``RGBA``;
alpha is dropped, not composited, when going to RGB) and then returned as:

======================  ==========================================================
``l8 rgb8 rgba8``       numpy uint8, HxW / HxWx3 / HxWx4 (read-only, like Energon)
``l rgb rgba``          numpy float32 in [0, 1], same shapes
``torchl8 torchrgb8     torch uint8, HxW / 3xHxW / 4xHxW (contiguous)
torchrgba8``
``torchl torchrgb       torch float32 in [0, 1], same shapes (``torch`` == ``torchrgb``)
torch torchrgba``
``pill pil pilrgb       a loaded PIL image in mode L / RGB / RGB / RGBA
pilrgba``
======================  ==========================================================

Note that ``pil`` converts to RGB exactly as Energon does; there is no "as stored" mode.

RGB outputs of baseline/progressive YCbCr or grayscale JPEGs are decoded by simplejpeg (the same
libjpeg-turbo, without Pillow's Python-level parsing) when it is installed; the pixels are the
same as Pillow's (tested).  Everything else goes through Pillow.  For torch (CHW) outputs such a
JPEG is decoded to RGBX, four bytes a pixel, and split into planes by shifting 32-bit words
(:func:`rgbx_planes`, 17-20 us for 256x256): the byte-wise HWC -> CHW transpose it replaces took
47 us, a fifth of the decode's own time on top of it.

Decode at training size (``SampleDecoder(image_min_side=S)`` or ``image_max_size=S``, off by
default): libjpeg decodes a JPEG at 1/2, 1/4 or 1/8 scale in the DCT domain, so a 1600x1200 photo
needed with a shorter side of 448 comes out at 800x600 and the resize after it touches a quarter
of the pixels. :func:`jpeg_scale` picks the smallest scale whose output (libjpeg's ceil(side / s))
still meets the demand; simplejpeg and Pillow's ``draft`` then decode at that scale to the same
pixels (tested). Other formats are decoded at full size.

Decompression bombs: an image's width and height are read from its header first, and an image
with more pixels than the limit is refused with
:class:`~megatron_energon_lite.errors.DecompressionBombError` before any pixel is decoded, on
every path (simplejpeg, Pillow, Pillow with ``draft``). A 378-byte JPEG can claim 20000x20000
pixels, which would otherwise allocate 1.2 GB. The limit is ``SampleDecoder(max_image_pixels=...)``:

* ``"pillow"`` (the default): Pillow's ``PIL.Image.MAX_IMAGE_PIXELS`` (89,478,485 unless the
  program changed it), read at every decode, so a program that sets it (or sets it to None for
  no limit) works as it does with Energon;
* an int: that many pixels; None: no limit from this package.

The behaviour differs from Pillow's in one way, on purpose: Pillow only warns
(``DecompressionBombWarning``) between its limit and twice its limit and raises above twice;
here, an image above the limit is refused, on every path alike. Pillow's own check still runs
inside Pillow for the images Pillow decodes, so to decode such images beyond twice
``PIL.Image.MAX_IMAGE_PIXELS``, raise that setting as well (or set it to None).

Decode work: a progressive JPEG is decoded in one pass over the whole image per scan, and nothing
limits how many scans a file holds: 40 KB of empty scans over a 2048x2048 frame cost 22 s (the fast
path rejected it for libjpeg's "Inconsistent progression sequence" warning and Pillow, which
ignores warnings, decoded it again). So a JPEG's scans (SOS markers) are counted before it is
decoded, and one with more than ``SampleDecoder(max_jpeg_scans=...)`` (default
:data:`DEFAULT_MAX_JPEG_SCANS` = 100, ten times the 10 scans of libjpeg's standard progressive
script; None: no limit) is refused with :class:`~megatron_energon_lite.errors.DecompressionBombError`.
A JPEG the fast path finds truncated is not decoded again by Pillow, which refuses it too (unless
``PIL.ImageFile.LOAD_TRUNCATED_IMAGES`` is set).
"""

from __future__ import annotations

import dataclasses
import functools
import io
import sys
from typing import TYPE_CHECKING, Any, NamedTuple

from ..errors import check_choice
from .basic import bomb_error

if TYPE_CHECKING:
    from PIL import Image

    from . import SampleDecoder

__all__ = [
    "IMAGE_DECODE_MODES",
    "IMAGE_EXTENSIONS",
    "DEFAULT_MAX_JPEG_SCANS",
    "PILLOW_PIXEL_LIMIT",
    "EncodedImage",
    "ImageSpec",
    "check_image_header",
    "check_image_pixels",
    "check_jpeg_scans",
    "JPEG_SCALES",
    "count_jpeg_scans",
    "decode_image",
    "decode_image_bytes",
    "jpeg_scale",
]


class ImageSpec(NamedTuple):
    """What one ``image_decode`` value produces."""

    output: str  # "numpy", "torch" or "pil"
    uint8: bool  # uint8 values, else float32 in [0, 1]; unused for "pil"
    mode: str  # the Pillow mode the image is converted to


#: Energon's ``image_decode`` values, in Energon's order.
IMAGE_DECODE_MODES: dict[str, ImageSpec] = {
    "l8": ImageSpec("numpy", True, "L"),
    "rgb8": ImageSpec("numpy", True, "RGB"),
    "rgba8": ImageSpec("numpy", True, "RGBA"),
    "l": ImageSpec("numpy", False, "L"),
    "rgb": ImageSpec("numpy", False, "RGB"),
    "rgba": ImageSpec("numpy", False, "RGBA"),
    "torchl8": ImageSpec("torch", True, "L"),
    "torchrgb8": ImageSpec("torch", True, "RGB"),
    "torchrgba8": ImageSpec("torch", True, "RGBA"),
    "torchl": ImageSpec("torch", False, "L"),
    "torchrgb": ImageSpec("torch", False, "RGB"),
    "torch": ImageSpec("torch", False, "RGB"),
    "torchrgba": ImageSpec("torch", False, "RGBA"),
    "pill": ImageSpec("pil", False, "L"),
    "pil": ImageSpec("pil", False, "RGB"),
    "pilrgb": ImageSpec("pil", False, "RGB"),
    "pilrgba": ImageSpec("pil", False, "RGBA"),
}

#: Part extensions decoded as images: the formats Pillow can open (webdataset's list, as
#: Energon uses it; it includes a few oddities such as ``mpg`` and ``rgb``).
IMAGE_EXTENSIONS: tuple[str, ...] = (
    "blp", "bmp", "dib", "bufr", "cur", "pcx", "dcx", "dds", "ps", "eps", "fit", "fits", "fli",
    "flc", "ftc", "ftu", "gbr", "gif", "grib", "h5", "hdf", "png", "apng", "jp2", "j2k", "jpc",
    "jpf", "jpx", "j2c", "icns", "ico", "im", "iim", "tif", "tiff", "jfif", "jpe", "jpg", "jpeg",
    "mpg", "mpeg", "msp", "pcd", "pxr", "pbm", "pgm", "ppm", "pnm", "psd", "bw", "rgb", "rgba",
    "sgi", "ras", "tga", "icb", "vda", "vst", "webp", "wmf", "emf", "xbm", "xpm",
)  # fmt: skip


def check_image_decode(image_decode: str) -> ImageSpec:
    """The spec of ``image_decode``; :class:`ConfigError` naming the valid values if unknown."""
    check_choice("image_decode", image_decode, IMAGE_DECODE_MODES, 'use e.g. image_decode="torchrgb" (float CHW tensor) or "pil"')
    return IMAGE_DECODE_MODES[image_decode]


#: ``max_image_pixels`` value meaning "Pillow's ``PIL.Image.MAX_IMAGE_PIXELS``, read at decode time".
PILLOW_PIXEL_LIMIT = "pillow"

_PIXEL_FIX = (
    "if the image is genuine, raise the limit: SampleDecoder(max_image_pixels=<pixels>) as the task "
    "encoder's decoder (None for no limit; the default follows PIL.Image.MAX_IMAGE_PIXELS, so setting "
    "that works too); otherwise the sample is skipped by the loader's error policy"
)


def pixel_limit(max_pixels: int | str | None) -> int | None:
    """The pixel limit ``max_pixels`` stands for (None: no limit)."""
    if max_pixels == PILLOW_PIXEL_LIMIT:
        return _pil_image().MAX_IMAGE_PIXELS
    return max_pixels  # type: ignore[return-value]


@functools.cache
def _pil_image() -> Any:
    """``PIL.Image``, imported on first use (an import statement per decoded image cost ~1 us)."""
    from PIL import Image

    return Image


@functools.cache
def _pil_image_file() -> Any:
    """``PIL.ImageFile`` (its ``LOAD_TRUNCATED_IMAGES``), imported on first use."""
    from PIL import ImageFile

    return ImageFile


def check_image_pixels(width: int, height: int, max_pixels: int | str | None = PILLOW_PIXEL_LIMIT, *, source: str = "image") -> None:
    """Raises :class:`DecompressionBombError` if a ``width`` x ``height`` image is over the limit
    (see the module docstring); call it with the header's size, before decoding."""
    limit = pixel_limit(max_pixels)
    pixels = width * height
    if limit is None or pixels <= limit:
        return
    setting = "PIL.Image.MAX_IMAGE_PIXELS, the default max_image_pixels" if max_pixels == PILLOW_PIXEL_LIMIT else "max_image_pixels"
    raise bomb_error(
        f"{source} of {width}x{height} = {pixels:,} pixels is over the limit of {limit:,} pixels; refused "
        "before decoding (a decompression bomb guard)",
        expected=f"at most {limit:,} pixels ({setting})",
        found=f"{width}x{height} = {pixels:,} pixels in the {source} header",
        fix=_PIXEL_FIX,
    )


#: Default of ``SampleDecoder(max_jpeg_scans=...)``: ten times the scans of libjpeg's standard
#: progressive script (10 for colour, 6 for grey); a baseline JPEG has 1 to 4.
DEFAULT_MAX_JPEG_SCANS = 100

#: Start-of-frame markers (SOF0-SOF15 but DHT, JPG and DAC) and the progressive ones among them.
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_PROGRESSIVE_SOF = frozenset({0xC2, 0xC6, 0xCA, 0xCE})


def count_jpeg_scans(data: bytes) -> int:
    """An upper bound on the scans (SOS segments) the JPEG ``data`` makes libjpeg decode,
    without decoding; 0 when its structure is broken before the first scan (the decoder then
    reports it).

    The segments up to the first scan are walked by their lengths (a thumbnail inside an APP
    segment is not counted). A sequential JPEG whose first scan holds every component has one
    scan: libjpeg refuses a second. Otherwise (progressive, or one component per scan) every SOS
    marker after the first scan is counted; entropy-coded data never holds one (a 0xFF byte in it
    is followed by 0x00 or a restart marker), so only a marker-like byte pair inside a later
    COM/APP segment or after EOI could count in excess.
    """
    pos, size = 2, len(data)
    components, progressive = 0, False
    while pos + 4 <= size and data[pos] == 0xFF:
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte before a marker
            pos += 1
        elif 0xD0 <= marker <= 0xD7 or marker == 0x01:  # no length field
            pos += 2
        elif marker == 0xDA:
            if not progressive and pos + 4 < size and data[pos + 4] >= components:
                return 1
            import numpy as np

            after = np.frombuffer(data, np.uint8, offset=pos + 2)
            marks = np.flatnonzero(after[:-1] == 0xFF)
            return 1 + int(np.count_nonzero(after[marks + 1] == 0xDA))
        elif marker == 0xD9:  # EOI before any scan
            break
        else:
            if marker in _SOF_MARKERS and pos + 9 < size:
                components, progressive = data[pos + 9], marker in _PROGRESSIVE_SOF
            pos += 2 + int.from_bytes(data[pos + 2 : pos + 4], "big")
    return 0


def check_jpeg_scans(data: bytes, max_scans: int | None = DEFAULT_MAX_JPEG_SCANS) -> None:
    """Raises :class:`DecompressionBombError` if the JPEG ``data`` has more than ``max_scans``
    scans (None: no limit); call it before decoding (see the module docstring)."""
    if max_scans is None:
        return
    scans = count_jpeg_scans(data)
    if scans > max_scans:
        raise bomb_error(
            f"JPEG image with {scans:,} scans, more than {max_scans:,}; refused before decoding (each scan is a pass "
            "over the whole image: a decode-work bomb guard)",
            expected=f"at most {max_scans:,} scans (SOS markers; SampleDecoder max_jpeg_scans)",
            found=f"{scans:,} scans (SOS markers) in {len(data):,} bytes",
            fix="if the image is genuine, raise the limit: SampleDecoder(max_jpeg_scans=<scans>) as the task "
            "encoder's decoder (None for no limit), or re-encode it (a progressive JPEG needs about 10 scans); "
            "otherwise the sample is skipped by the loader's error policy",
        )


#: The reduced scales libjpeg decodes at in the DCT domain (1/8, 1/4, 1/2), largest first: the
#: ones Pillow's ``draft`` offers, so that simplejpeg and Pillow decode to the same size.
JPEG_SCALES: tuple[int, ...] = (8, 4, 2)


def jpeg_scale(width: int, height: int, *, min_side: int | None = None, max_size: int | None = None) -> int:
    """The denominator s (8, 4, 2, else 1) of the smallest scale 1/s at which a ``width`` x
    ``height`` JPEG, decoded to libjpeg's ceil(width / s) x ceil(height / s), keeps its shorter
    side at least ``min_side`` and its longer side at least ``max_size`` (None: no demand;
    1 when neither is set). An image already smaller than a demand is decoded at full size."""
    if min_side is None and max_size is None:
        return 1
    for scale in JPEG_SCALES:
        if min(width, height) < scale:  # Pillow's draft needs a side of at least 1 at floor(side / s)
            continue
        shorter, longer = sorted((-(-width // scale), -(-height // scale)))
        if (min_side is None or shorter >= min_side) and (max_size is None or longer >= max_size):
            return scale
    return 1


def _draft(img: Image.Image, scale: int) -> None:
    """Makes Pillow's libjpeg decode the JPEG ``img`` (opened, not loaded) at 1/``scale``."""
    if scale > 1 and img.format in ("JPEG", "MPO"):
        width, height = img.size
        # Asking for size // scale makes Pillow pick exactly this scale (floor(size / (size // s)) is in [s, 2s)).
        img.draft(None, (width // scale, height // scale))


def decode_image_bytes(
    data: bytes,
    image_decode: str = "torchrgb",
    *,
    max_size: int | None = None,
    min_side: int | None = None,
    max_pixels: int | str | None = PILLOW_PIXEL_LIMIT,
    max_scans: int | None = DEFAULT_MAX_JPEG_SCANS,
) -> Any:
    """Decodes image bytes as ``image_decode`` says (see the module docstring).

    ``min_side`` / ``max_size``: for JPEGs only, decode at the smallest DCT scale (1/1, 1/2,
    1/4 or 1/8, :func:`jpeg_scale`) that keeps the shorter side at least ``min_side`` and the
    longer side at least ``max_size``; this changes the output size. None (both): full size.
    ``max_pixels``: images with more pixels (by their header) are refused with
    :class:`DecompressionBombError` before decoding; ``"pillow"`` follows
    ``PIL.Image.MAX_IMAGE_PIXELS``, None is no limit. ``max_scans``: JPEGs with more scans are
    refused the same way (None: no limit).
    """
    spec = check_image_decode(image_decode)
    if data[:2] == b"\xff\xd8":
        check_jpeg_scans(data, max_scans)
    padded = spec.output == "torch"  # RGBX pixels, for CHW planes by whole-word shifts
    array = _fast_jpeg_rgb(data, max_pixels, padded=padded, min_side=min_side, max_size=max_size) if spec.mode == "RGB" and spec.output != "pil" else None
    if array is not None:
        return _from_rgbx_array(array, spec) if padded else _from_rgb_array(array, spec)
    from PIL import Image

    try:
        img = Image.open(io.BytesIO(data))  # reads the header only
        check_image_pixels(*img.size, max_pixels, source=f"{img.format} image")
        if min_side is not None or max_size is not None:
            _draft(img, jpeg_scale(*img.size, min_side=min_side, max_size=max_size))
        img.load()
    except Image.DecompressionBombError as exc:  # Pillow's own check (above twice its limit, frames, tiles)
        pillow_limit = Image.MAX_IMAGE_PIXELS
        raise bomb_error(
            "Pillow refused the image as a possible decompression bomb (over twice PIL.Image.MAX_IMAGE_PIXELS)",
            expected=f"at most {2 * pillow_limit:,} pixels (twice PIL.Image.MAX_IMAGE_PIXELS = {pillow_limit:,}: Pillow's own limit)"
            if pillow_limit is not None
            else "an image within Pillow's limits",
            found=str(exc),
            fix="if the image is genuine, raise PIL.Image.MAX_IMAGE_PIXELS (or set it to None) in the program, "
            "and SampleDecoder(max_image_pixels=<pixels>) if you set that; otherwise the sample is skipped by "
            "the loader's error policy",
        ) from None
    if img.mode != spec.mode:
        img = img.convert(spec.mode)
    if spec.output == "pil":
        return img

    import numpy as np

    return _from_rgb_array(np.asarray(img), spec)


def _from_rgb_array(array: Any, spec: ImageSpec) -> Any:
    """A decoded HxW(xC) uint8 array -> the output ``spec`` asks for (numpy or CHW torch)."""
    import numpy as np

    if spec.output == "numpy":
        if spec.uint8:
            if array.flags.writeable:  # read-only like Pillow's buffer (and Energon's output)
                array.setflags(write=False)
            return array
        return _unit_floats(array)

    import torch

    if array.ndim == 3:
        array = array.transpose(2, 0, 1)
    # One copy: HWC -> contiguous CHW, cast to float on the way; asarray's buffer is read-only.
    result = np.array(array, dtype=np.uint8 if spec.uint8 else np.float32, order="C")
    if not spec.uint8:
        result /= 255.0
    return torch.from_numpy(result)


def _from_rgbx_array(array: Any, spec: ImageSpec) -> Any:
    """A decoded HxWx4 RGBX uint8 array -> the contiguous CHW torch tensor ``spec`` asks for."""
    import torch

    planes = rgbx_planes(array)
    return torch.from_numpy(planes if spec.uint8 else _unit_floats(planes))


def _unit_floats(array: Any) -> Any:
    """uint8 values as float32 in [0, 1] (a new array, same layout)."""
    import numpy as np

    result = array.astype(np.float32)
    result /= 255.0
    return result


#: Bit offset of R, G and B in a pixel's 32-bit word, by the machine's byte order.
_CHANNEL_SHIFTS = (0, 8, 16) if sys.byteorder == "little" else (24, 16, 8)


def rgbx_planes(rgbx: Any) -> Any:
    """The R, G and B planes (3xHxW uint8, contiguous) of HxWx4 uint8 pixels."""
    import numpy as np

    words = rgbx.view(np.uint32)[..., 0]
    out = np.empty((3, *words.shape), np.uint8)
    for plane, shift in zip(out, _CHANNEL_SHIFTS):
        # The cast keeps the low byte: the channel after the shift.
        np.copyto(plane, words >> shift if shift else words, casting="unsafe")
    return out


_SIMPLEJPEG: Any = None  # process-wide, not per run: the module once imported, False when it is not installed
# libjpeg-turbo's own colour conversion gives Pillow's pixels exactly for these (tested);
# CMYK/YCCK JPEGs differ by rounding, so they go through Pillow.
_SAME_AS_PILLOW = ("YCbCr", "Gray")


def _fast_jpeg_rgb(
    data: bytes,
    max_pixels: int | str | None = PILLOW_PIXEL_LIMIT,
    *,
    padded: bool = False,
    min_side: int | None = None,
    max_size: int | None = None,
) -> Any:
    """RGB pixels of a JPEG through simplejpeg (about 40% faster than Pillow's Python-level
    open + decode), at the scale :func:`jpeg_scale` picks for ``min_side`` / ``max_size``,
    HxWx3 or with ``padded`` HxWx4 (RGBX), or None to use Pillow: not a JPEG,
    simplejpeg missing, or a colour space where the two would not agree bit for bit. Raises
    :class:`DecompressionBombError` for a JPEG whose header is over the pixel limit, before
    decoding."""
    global _SIMPLEJPEG
    if data[:2] != b"\xff\xd8":
        return None
    if _SIMPLEJPEG is None:
        try:
            import simplejpeg
        except ImportError:
            simplejpeg = False
        _SIMPLEJPEG = simplejpeg
    if _SIMPLEJPEG is False:
        return None
    try:
        height, width, colorspace, _ = _SIMPLEJPEG.decode_jpeg_header(data)
    except (ValueError, RuntimeError):
        return None  # let Pillow decode it, or raise its own error for a broken file
    if colorspace not in _SAME_AS_PILLOW:
        return None
    check_image_pixels(width, height, max_pixels, source="JPEG image")
    scale = jpeg_scale(width, height, min_side=min_side, max_size=max_size)
    colorspace = "RGBX" if padded else "RGB"
    try:
        if scale == 1:
            return _SIMPLEJPEG.decode_jpeg(data, colorspace=colorspace)
        # At least libjpeg's size at 1/scale: simplejpeg then picks exactly that scale, as Pillow's draft does.
        return _SIMPLEJPEG.decode_jpeg(data, colorspace=colorspace, min_height=-(-height // scale), min_width=-(-width // scale))
    except (ValueError, RuntimeError) as exc:
        # simplejpeg refuses on libjpeg's warnings too, which Pillow ignores: Pillow decodes those
        # (bounded by the scan limit), except a truncated file, which it refuses as well.
        if "Premature end of JPEG file" in str(exc) and not _pil_image_file().LOAD_TRUNCATED_IMAGES:
            raise OSError(f"the JPEG data is truncated ({exc})") from exc
        return None  # let Pillow decode it, or raise its own error for a broken file


@dataclasses.dataclass(frozen=True, slots=True)
class EncodedImage:
    """An image part left encoded by the worker, for decoding in the main process
    (``SampleDecoder(image_handover="bytes")``, e.g. on the GPU with
    :class:`~megatron_energon_lite.decode.gpu.ImageBatchDecoder`): its bytes, already checked
    against the pixel and scan limits, and the decoder's settings, so that :meth:`decode` gives
    exactly what the worker would have."""

    data: bytes
    image_decode: str
    min_side: int | None = None
    max_size: int | None = None
    max_pixels: int | str | None = PILLOW_PIXEL_LIMIT
    max_scans: int | None = DEFAULT_MAX_JPEG_SCANS

    def decode(self) -> Any:
        """The pixels, on the CPU, as the worker's decoder would have made them."""
        return decode_image_bytes(
            self.data, self.image_decode, min_side=self.min_side, max_size=self.max_size, max_pixels=self.max_pixels, max_scans=self.max_scans
        )

    def __repr__(self) -> str:
        return f"EncodedImage({len(self.data):,} bytes, image_decode={self.image_decode!r})"


def check_image_header(data: bytes, max_pixels: int | str | None = PILLOW_PIXEL_LIMIT, max_scans: int | None = DEFAULT_MAX_JPEG_SCANS) -> tuple[int, int]:
    """The (width, height) an image's header declares, after the scan and pixel limits (see the
    module docstring); raises :class:`DecompressionBombError` over them, without decoding."""
    if data[:2] == b"\xff\xd8":
        check_jpeg_scans(data, max_scans)
    img = _pil_image().open(io.BytesIO(data))  # reads the header only
    check_image_pixels(*img.size, max_pixels, source=f"{img.format} image")
    return img.size


def decode_image(data: bytes, decoder: SampleDecoder) -> Any:
    """The registered image decoder: uses the decoder's ``image_decode``, ``image_min_side``,
    ``image_max_size``, ``max_image_pixels`` and ``max_jpeg_scans``; with ``image_handover="bytes"``,
    checks the header against the limits and returns an :class:`EncodedImage` instead."""
    settings = {
        "min_side": getattr(decoder, "image_min_side", None),
        "max_size": decoder.image_max_size,
        "max_pixels": getattr(decoder, "max_image_pixels", PILLOW_PIXEL_LIMIT),
        "max_scans": getattr(decoder, "max_jpeg_scans", DEFAULT_MAX_JPEG_SCANS),
    }
    if getattr(decoder, "image_handover", "pixels") == "bytes":
        check_image_header(data, settings["max_pixels"], settings["max_scans"])
        return EncodedImage(data, decoder.image_decode, **settings)
    return decode_image_bytes(data, decoder.image_decode, **settings)
