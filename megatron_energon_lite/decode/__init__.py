"""Bytes -> values: the decoder table and :class:`SampleDecoder`.

A part is decoded by the LAST dot-component of its name (``detail.json`` -> json), matched
exactly as Energon does, except image extensions, which also match in upper case (``JPG``;
a ``TXT`` part stays bytes, as in Energon); a trailing ``.gz`` is decompressed first (up to
``max_decompressed_bytes``) and the rest of the name decides (``txt.gz`` -> text). Unknown
extensions stay bytes. The built-in table:

* images (:data:`~megatron_energon_lite.decode.image.IMAGE_EXTENSIONS`: jpg jpeg png webp gif
  tif tiff bmp jp2 ppm pgm pbm pnm ...) -> Pillow, shaped by ``image_decode``;
* ``txt text transcript`` -> str; ``cls cls2 index inx id`` -> int; ``json jsn`` -> JSON;
  ``npy`` -> array; ``npz`` -> dict of arrays; ``pth`` -> ``torch.load(weights_only=True)``;
* ``pkl pickle pyd`` -> unpickled only when trusted, else refused with
  :class:`~.basic.UntrustedDataError` naming the sample, the part and the opt-ins:
  ``SampleDecoder(allow_pickle=True)``, ``ENERGON_LITE_TRUST_PICKLE=1`` in the environment, or
  Energon mode (``import megatron_energon_lite.as_energon``: unpickled as Energon does, logged
  once per dataset);
* ``mp msg msgpack`` / ``cbor`` -> decoded when the library imports, else bytes.

Decompression bombs are refused before they take memory, as
:class:`~megatron_energon_lite.errors.DecompressionBombError` (a ``DecodeError``: the sample is
skipped or not by the loader's error policy, like any broken part): images with more pixels than
``max_image_pixels`` (default: Pillow's ``PIL.Image.MAX_IMAGE_PIXELS``), checked from the header
on every decoding path, and parts that would decode past ``max_decompressed_bytes`` (default 1 GiB):
``.gz`` streams, ``.npy`` arrays (by their header's shape), ``.npz`` archives (declared and
inflated member sizes) and torch's zip container of ``.pth`` parts (declared member sizes), each
checked before the memory is taken; and JPEGs with more than ``max_jpeg_scans`` scans (default
100), counted before decoding, since each scan is a pass over the whole image.

More decoders (video and audio) plug in with :func:`register_decoder`. Optional libraries are
imported on first use, and nothing writes temporary files.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..errors import (
    ConfigError,
    DecodeError,
    DecompressionBombError,
    MissingDependencyError,
    check_choice,
    format_message,
)
from ..format.tar_reader import split_name
from ..policy import PLAIN, Policy
from . import av, basic, image
from .basic import DEFAULT_MAX_DECOMPRESSED_BYTES, TRUST_PICKLE_ENV, UntrustedDataError
from .image import (
    DEFAULT_MAX_JPEG_SCANS,
    IMAGE_DECODE_MODES,
    IMAGE_EXTENSIONS,
    PILLOW_PIXEL_LIMIT,
    check_image_decode,
    decode_image_bytes,
)

__all__ = [
    "AV_DECODE_MODES",
    "IMAGE_DECODE_MODES",
    "IMAGE_EXTENSIONS",
    "DecoderEntry",
    "DecoderFn",
    "SampleDecoder",
    "UntrustedDataError",
    "decode_image_bytes",
    "decoder_for",
    "register_decoder",
    "registered_decoders",
]

logger = logging.getLogger(__name__)

#: ``fn(data, decoder) -> value``: decodes one part; may read the decoder's settings.
DecoderFn = Callable[[bytes, "SampleDecoder"], Any]

#: Where images are decoded: in the workers (``"pixels"`` handed over) or after the hand-over
#: (``"bytes"``: :class:`~.image.EncodedImage`, decoded in the main process).
IMAGE_HANDOVERS: tuple[str, ...] = ("pixels", "bytes")

#: Energon's ``av_decode`` values: a lazy :class:`~.av.AVDecoder` (default), everything decoded
#: to :class:`~.av.AVData` (``"torch"``), or the opened PyAV container (``"pyav"``).
AV_DECODE_MODES: tuple[str, ...] = ("torch", "AVDecoder", "pyav")

_GENERIC_FIX = (
    "check that the part's extension matches its content (re-encode or rename the file), or leave "
    "the part out of the field_map / part_filter; a bad sample is skipped by the loader's error policy"
)


@dataclasses.dataclass(frozen=True, slots=True)
class DecoderEntry:
    """One row of the decoder table."""

    fn: DecoderFn
    #: Named in error messages, e.g. ``"image (Pillow)"``.
    name: str
    #: How to fix a part this decoder fails on; None for the generic hint.
    fix: str | None = None
    #: With ``guess_content=True``, this decoder is also chosen when the content looks like one
    #: of its extensions (Energon sniffs content for its image and video decoders only).
    by_content: bool = False
    #: Energon matches image extensions case-insensitively and every other one exactly
    #: (webdataset's handlers): a ``TXT`` part stays bytes, a ``JPG`` part is an image.
    ignore_case: bool = False


_DECODERS: dict[str, DecoderEntry] = {}


def _normalize_extension(extension: str) -> str:
    ext = extension.removeprefix(".") if isinstance(extension, str) else ""
    if not ext or "." in ext or "/" in ext:
        raise ConfigError(
            format_message(
                "a decoder extension must be one non-empty name component",
                found=repr(extension),
                fix='register the last dot-component only, e.g. "json" for parts named "meta.json"',
            )
        )
    return ext


def register_decoder(
    extensions: Iterable[str],
    fn: DecoderFn,
    *,
    name: str | None = None,
    fix: str | None = None,
    by_content: bool = False,
    ignore_case: bool = False,
    replace: bool = False,
) -> None:
    """Decodes parts whose last name component is one of ``extensions`` with ``fn(data, decoder)``.

    Extensions are matched exactly, or case-insensitively with ``ignore_case=True`` (then
    register them in lower case). Taking an extension that another function
    already decodes is a :class:`ConfigError` unless ``replace=True``.
    """
    if isinstance(extensions, str):
        extensions = extensions.split()
    exts = [_normalize_extension(ext) for ext in extensions]
    if not callable(fn):
        raise ConfigError(format_message("a decoder must be callable as fn(data, decoder)", found=repr(fn)))
    entry = DecoderEntry(fn, name or getattr(fn, "__name__", repr(fn)), fix, by_content, ignore_case)
    if not replace:
        taken = [ext for ext in exts if ext in _DECODERS and _DECODERS[ext].fn is not fn]
        if taken:
            raise ConfigError(
                format_message(
                    f"extension {taken[0]!r} already has a decoder",
                    expected="extensions without a decoder",
                    found=f"{', '.join(taken)} decoded by {_DECODERS[taken[0]].name}",
                    fix="pass replace=True to register_decoder to override it",
                )
            )
    for ext in exts:
        _DECODERS[ext] = entry


def decoder_for(extension: str) -> DecoderEntry | None:
    """The table entry for ``extension``, or None if such parts stay bytes."""
    entry = _DECODERS.get(extension)
    if entry is None:
        folded = _DECODERS.get(extension.lower())
        entry = folded if folded is not None and folded.ignore_case else None
    return entry


def registered_decoders() -> dict[str, DecoderEntry]:
    """The decoder table, by extension, sorted (a copy)."""
    return dict(sorted(_DECODERS.items()))


register_decoder(
    IMAGE_EXTENSIONS,
    image.decode_image,
    name="image (Pillow)",
    fix="re-encode the image, or check that the file is complete (a truncated image cannot be decoded)",
    by_content=True,
    ignore_case=True,
)
register_decoder(("txt", "text", "transcript"), basic.decode_text, name="text (utf-8)", fix="store the text as UTF-8")
register_decoder(("cls", "cls2", "index", "inx", "id"), basic.decode_int, name="integer", fix="store a decimal integer, e.g. b'3'")
register_decoder(("json", "jsn"), basic.decode_json, name="json")
_PICKLE_FIX = f"if you trust the data, pass SampleDecoder(allow_pickle=True) or set {TRUST_PICKLE_ENV}=1"
register_decoder(("npy",), basic.decode_npy, name="numpy .npy", fix=f"write the array with numpy.save; object arrays need pickle: {_PICKLE_FIX}")
register_decoder(("npz",), basic.decode_npz, name="numpy .npz", fix=f"write the arrays with numpy.savez; object arrays need pickle: {_PICKLE_FIX}")
register_decoder(("pth",), basic.decode_pth, name="torch.load", fix=f"save tensors and plain containers only; other objects need pickle: {_PICKLE_FIX}")
register_decoder(("pkl", "pickle", "pyd"), basic.decode_pickle, name="pickle")
register_decoder(("mp", "msg", "msgpack"), basic.decode_msgpack, name="msgpack")
register_decoder(("cbor",), basic.decode_cbor, name="cbor")
register_decoder(av.AV_EXTENSIONS, av.decode_av, name="video/audio (PyAV)", fix="check the file with ffprobe or re-encode it (ffmpeg -i in.mp4 -c:v libx264 out.mp4)", by_content=True)


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _where(key: str, part_name: str, dataset: str | None, shard: str | None) -> str:
    """Where a part is: its sample and name, and its dataset and shard where known."""
    return f"sample {key!r}, part {part_name!r}" + (f" of dataset {dataset}" if dataset else "") + (f", shard {shard}" if shard else "")


def _located(exc: DecompressionBombError, key: str, part_name: str, dataset: str | None, shard: str | None = None) -> DecompressionBombError:
    """``exc`` again, its message naming the sample, the part, the dataset and shard where known."""
    details = getattr(exc, "details", None)
    if details is None:  # raised by a decoder function of the user's: leave it as it is
        return exc
    where = _where(key, part_name, dataset, shard)
    return basic.bomb_error(**{**details, "what": f"part {part_name!r} of sample {key!r}: {details['what']}"}, where=where)


class SampleDecoder:
    """Decodes the parts of a sample, like Energon's ``SampleDecoder``.

    Args:
        image_decode: how images come out (Energon's values; see :mod:`.image`).
        av_decode: how video/audio come out (``"AVDecoder"``, ``"torch"``, ``"pyav"``); stored
            for the video/audio decoders, which register themselves with :func:`register_decoder`.
        video_decode_audio: whether video decoding also decodes the audio track.
        guess_content: choose the image (and video) decoders by sniffing the content with the
            ``filetype`` package, for parts whose extension does not tell.
        allow_pickle: unpickle ``pkl pickle pyd`` parts, numpy object arrays and arbitrary
            ``pth`` files. Off by default: unpickling runs code from the dataset, so such a part
            raises :class:`UntrustedDataError` (a ``DecodeError`` that stops the run) unless
            ``ENERGON_LITE_TRUST_PICKLE=1`` is set or the loader runs as Energon (its policy,
            :meth:`under`).
        untrusted_pickle: what an untrusted ``pkl pickle pyd`` part becomes: ``"error"`` (the
            default) or ``"bytes"`` (left undecoded, e.g. for a linter).
        image_min_side: decode at training size; off (None) by default. When set, JPEGs are
            decoded at the smallest DCT scale (1/1, 1/2, 1/4 or 1/8) at which their SHORTER
            side stays at least this many pixels (libjpeg's reduced-scale decode, through
            simplejpeg or Pillow's ``draft``, the same pixels either way): for a task encoder
            that resizes the shorter side to S, pass S. Much faster for large photos, but it
            CHANGES the decoded size and, slightly, the pixels after the resize (see
            docs/guide/images.md); other formats are decoded at full size. Bomb limits apply
            to the size the file declares.
        image_handover: ``"pixels"`` (the default): images are decoded in the workers.
            ``"bytes"``: the workers check an image's header against the limits below and hand
            over an :class:`~.image.EncodedImage` (the bytes and these settings) instead of
            pixels, for the main process to decode a batch at once, e.g. on the GPU
            (:class:`~.gpu.ImageBatchDecoder`); ``EncodedImage.decode()`` gives the pixels the
            worker would have.
        image_max_size: like ``image_min_side`` for the LONGER side: JPEGs are decoded at the
            smallest scale where their longer side stays at least this many pixels (for a task
            encoder that fits images into S x S). Both may be set; each must then hold.
        max_image_pixels: images with more pixels than this (read from the header) are refused
            with :class:`~megatron_energon_lite.errors.DecompressionBombError` before decoding.
            ``"pillow"`` (the default) follows ``PIL.Image.MAX_IMAGE_PIXELS`` at decode time
            (89,478,485 unless the program changed it); an int sets the limit; None removes it.
            Unlike Pillow, which only warns up to twice its limit, anything above is refused.
            Pillow's own check still applies inside Pillow (non-JPEG images and JPEGs that
            simplejpeg does not decode): past twice ``PIL.Image.MAX_IMAGE_PIXELS``, raise that too.
        max_decompressed_bytes: a part that would decode past this many bytes is refused
            with :class:`~megatron_energon_lite.errors.DecompressionBombError` before it takes
            the memory: a ``.gz`` stream (decompressed incrementally, holding at most about
            this much output), a ``.npy`` array (its header's shape times its item size), an
            ``.npz`` archive (its members' declared sizes, array headers and inflated bytes,
            together) and a ``.pth`` zip container (its members' declared sizes). Each layer
            of a part (``x.npy.gz``) is held to it on its own. Default 1 GiB
            (:data:`~.basic.DEFAULT_MAX_DECOMPRESSED_BYTES`); None removes the limit.
        max_jpeg_scans: a JPEG with more scans (SOS markers, counted before decoding; each is a
            pass over the whole image) is refused with
            :class:`~megatron_energon_lite.errors.DecompressionBombError`. Default 100
            (:data:`~.image.DEFAULT_MAX_JPEG_SCANS`; a progressive JPEG has about 10); None
            removes the limit.
    """

    def __init__(
        self,
        *,
        image_decode: str = "torchrgb",
        av_decode: str = "AVDecoder",
        video_decode_audio: bool = False,
        guess_content: bool = False,
        allow_pickle: bool = False,
        image_max_size: int | None = None,
        image_min_side: int | None = None,
        image_handover: str = "pixels",
        av_byte_budget: int = av.DEFAULT_BYTE_BUDGET,
        untrusted_pickle: str = "error",
        max_image_pixels: int | str | None = PILLOW_PIXEL_LIMIT,
        max_decompressed_bytes: int | None = DEFAULT_MAX_DECOMPRESSED_BYTES,
        max_jpeg_scans: int | None = DEFAULT_MAX_JPEG_SCANS,
    ) -> None:
        check_image_decode(image_decode)
        check_choice("av_decode", av_decode, AV_DECODE_MODES, 'use av_decode="AVDecoder" (lazy decoding, the default)')
        for name, side, which in (("image_max_size", image_max_size, "longer"), ("image_min_side", image_min_side, "shorter")):
            if side is not None and not _positive_int(side):
                raise ConfigError(
                    format_message(
                        f"{name} must be a positive int or None",
                        found=repr(side),
                        fix=f"pass the {which} image side you need in pixels, e.g. 448, or None for full size",
                    )
                )
        for flag, value in (("video_decode_audio", video_decode_audio), ("guess_content", guess_content), ("allow_pickle", allow_pickle)):
            if not isinstance(value, bool):
                raise ConfigError(format_message(f"{flag} must be True or False", found=repr(value)))
        if max_image_pixels != PILLOW_PIXEL_LIMIT and max_image_pixels is not None and not _positive_int(max_image_pixels):
            raise ConfigError(
                format_message(
                    "max_image_pixels must be a positive int, None or 'pillow'",
                    found=repr(max_image_pixels),
                    fix="pass the most pixels (width x height) an image may have, e.g. 200_000_000; None for no "
                    "limit; 'pillow' (the default) for PIL.Image.MAX_IMAGE_PIXELS",
                )
            )
        for name, limit, fix in (
            ("max_decompressed_bytes", max_decompressed_bytes, f"the most bytes a part may decode to, e.g. {DEFAULT_MAX_DECOMPRESSED_BYTES} (the default, 1 GiB)"),
            ("max_jpeg_scans", max_jpeg_scans, f"the most scans a JPEG may have, e.g. {DEFAULT_MAX_JPEG_SCANS} (the default)"),
        ):
            if limit is not None and not _positive_int(limit):
                raise ConfigError(format_message(f"{name} must be a positive int or None", found=repr(limit), fix=f"pass {fix}; None for no limit"))
        check_choice(
            "image_handover", image_handover, IMAGE_HANDOVERS,
            'use "pixels" (decode in the workers, the default) or "bytes" (decode in the main process, '
            "e.g. on the GPU with megatron_energon_lite.decode.gpu.ImageBatchDecoder)",
        )
        if untrusted_pickle not in ("error", "bytes"):
            raise ConfigError(format_message("untrusted_pickle must be 'error' or 'bytes'", found=repr(untrusted_pickle)))
        if guess_content:
            try:
                import filetype  # noqa: F401
            except ImportError as exc:
                raise MissingDependencyError(
                    format_message(
                        "guess_content=True needs the filetype package",
                        fix="pip install filetype",
                    )
                ) from exc
        self.image_decode = image_decode
        self.av_decode = av_decode
        self.video_decode_audio = video_decode_audio
        self.guess_content = guess_content
        self.allow_pickle = allow_pickle
        self.untrusted_pickle = untrusted_pickle
        self.image_max_size = image_max_size
        self.image_min_side = image_min_side
        self.image_handover = image_handover
        self.max_image_pixels = max_image_pixels
        self.max_decompressed_bytes = max_decompressed_bytes
        self.max_jpeg_scans = max_jpeg_scans
        if isinstance(av_byte_budget, bool) or not isinstance(av_byte_budget, int) or av_byte_budget < 1:
            raise ConfigError(format_message("av_byte_budget must be a positive number of bytes", found=repr(av_byte_budget)))
        self.av_byte_budget = av_byte_budget

    #: Ours, or Energon's (``policy.py``): a loader decodes with :meth:`under` its policy.
    policy: Policy = PLAIN

    def under(self, policy: Policy) -> SampleDecoder:
        """This decoder under ``policy`` (a copy, unless it is this one's): what a loader planned
        under ``as_energon`` decodes with, which unpickles as Energon does (logged once)."""
        if policy == self.policy:
            return self
        decoder = copy.copy(self)
        decoder.policy = policy
        return decoder

    def config(self) -> dict[str, Any]:
        """The settings as plain JSON, for the config fingerprint."""
        return {
            "type": type(self).__name__,
            "image_decode": self.image_decode,
            "av_decode": self.av_decode,
            "video_decode_audio": self.video_decode_audio,
            "guess_content": self.guess_content,
            "allow_pickle": self.allow_pickle,
            "image_max_size": self.image_max_size,
            "av_byte_budget": self.av_byte_budget,
            "av_backend": av.backend(),
            # Only when set, so that saved fingerprints stay valid.
            **({"image_min_side": self.image_min_side} if self.image_min_side is not None else {}),
            **({"image_handover": self.image_handover} if self.image_handover != "pixels" else {}),
            **({"untrusted_pickle": self.untrusted_pickle} if self.untrusted_pickle != "error" else {}),
            **({"max_image_pixels": self.max_image_pixels} if self.max_image_pixels != PILLOW_PIXEL_LIMIT else {}),
            **(
                {"max_decompressed_bytes": self.max_decompressed_bytes}
                if self.max_decompressed_bytes != DEFAULT_MAX_DECOMPRESSED_BYTES
                else {}
            ),
            **({"max_jpeg_scans": self.max_jpeg_scans} if self.max_jpeg_scans != DEFAULT_MAX_JPEG_SCANS else {}),
        }

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items() if k != "type")
        return f"{type(self).__name__}({args})"

    def _entry(self, name: str, data: bytes) -> DecoderEntry | None:
        if self.guess_content:
            import filetype

            kind = filetype.guess(data)
            if kind is not None:
                guessed = _DECODERS.get(kind.extension)
                if guessed is not None and guessed.by_content:
                    return guessed
        return decoder_for(name.rsplit(".", 1)[-1])

    def decode_part(self, part_name: str, data: bytes, *, key: str = "?", dataset: str | None = None, shard: str | None = None) -> Any:
        """Decodes one part by its name (e.g. ``"jpg"``, ``"detail.json"``, ``"txt.gz"``).

        Values that are not bytes-like are returned unchanged (already decoded). Raises
        :class:`DecodeError` naming ``key`` and the part if the data cannot be decoded, and
        :class:`UntrustedDataError` for a pickle part nothing allowed to unpickle. ``dataset``
        (its path) goes into messages and keys the once-per-dataset log of Energon mode; ``shard``
        (its name) goes into messages.
        """
        if isinstance(data, (bytearray, memoryview)):
            data = bytes(data)
        elif not isinstance(data, bytes):
            return data
        name = part_name
        if name == "gz" or name.endswith(".gz"):
            try:
                data = basic.gunzip(data, self.max_decompressed_bytes)
            except DecompressionBombError as exc:
                raise _located(exc, key, part_name, dataset, shard) from None
            except Exception as exc:
                raise self._error(key, part_name, data, "gzip", exc, "check that the file is a complete gzip stream", where=_where(key, part_name, dataset, shard)) from exc
            name = name[:-3]
        entry = self._entry(name, data)
        if entry is None:
            return data
        if entry.fn is basic.decode_pickle and not self._pickle_trusted(key, part_name, data, dataset):
            return data  # untrusted_pickle="bytes"
        try:
            value = entry.fn(data, self)
            if isinstance(value, av.AVDecoder):
                value.name = f"sample {key!r}, part {part_name!r}"  # lazy: errors come later
                value.extension = name.rsplit(".", 1)[-1]
            return value
        except (MissingDependencyError, UntrustedDataError):
            raise
        except DecompressionBombError as exc:
            raise _located(exc, key, part_name, dataset, shard) from None
        except Exception as exc:
            settings = f" (image_decode={self.image_decode!r})" if entry.fn is image.decode_image else ""
            raise self._error(key, part_name, data, entry.name, exc, entry.fix, settings, where=_where(key, part_name, dataset, shard)) from exc

    def decode(self, parts: Mapping[str, Any], *, key: str, dataset: str | None = None, shard: str | None = None) -> dict[str, Any]:
        """Decodes every part of a sample into a new dict; keys starting with ``__`` pass through."""
        return {
            name: value if name.startswith("__") else self.decode_part(name, value, key=key, dataset=dataset, shard=shard)
            for name, value in parts.items()
        }

    def _pickle_trusted(self, key: str, part_name: str, data: bytes, dataset: str | None) -> bool:
        """True if the pickle part may be unpickled, False to leave it as bytes; else raises."""
        if self.allow_pickle:
            return True
        where = f"{dataset}: sample {key!r}, part {part_name!r}" if dataset else f"sample {key!r}, part {part_name!r}"
        if self.policy.opted_in(TRUST_PICKLE_ENV, f"pickle:{dataset}", f"unpickling pickle parts, first {where}"):
            return True
        if self.untrusted_pickle == "bytes":
            return False
        raise UntrustedDataError(
            format_message(
                f"part {part_name!r} of sample {key!r} is a pickle; unpickling runs code stored in the dataset, "
                "so it is not done unless you allow it",
                where=where,
                expected="parts decoded without running code (or an explicit opt-in)",
                found=f"{len(data)} bytes of pickle data",
                fix="if you trust the dataset, use SampleDecoder(allow_pickle=True) as the task encoder's decoder, "
                f"or set {TRUST_PICKLE_ENV}=1 in the environment for a program you cannot edit; otherwise leave "
                "the part out of field_map / part_filter, or store it as .npy / .json",
            )
        )

    def __call__(self, sample: Mapping[str, Any]) -> dict[str, Any]:
        """Energon's call form: decodes a raw sample dict, taking the key from ``__key__``."""
        return self.decode(sample, key=str(sample.get("__key__", "?")))

    def decode_file(self, file_name: str, data: bytes) -> Any:
        """Decodes a file such as ``"folder/0001.detail.json"``: the part name is what follows
        the first dot of the last path component (Energon's ``SampleDecoder.decode(fname, raw)``)."""
        key, part = split_name(file_name) or (file_name, "")
        return self.decode_part(part, data, key=key)

    @staticmethod
    def _error(
        key: str, part_name: str, data: bytes, decoder: str, exc: BaseException, fix: str | None, settings: str = "", *, where: str | None = None
    ) -> DecodeError:
        return DecodeError(
            format_message(
                f"cannot decode part {part_name!r} of sample {key!r} with the {decoder} decoder{settings}: "
                f"{type(exc).__name__}: {exc}",
                where=where or f"sample {key!r}, part {part_name!r}",
                expected=f"data the {decoder} decoder can read",
                found=f"{len(data)} bytes starting with {data[:16]!r}",
                fix=fix or _GENERIC_FIX,
            )
        )
