"""Energon's ``megatron.energon.av.av_decoder``: :class:`AVDecoder` and :class:`AVWebdatasetDecoder`.

:class:`AVDecoder` is :class:`megatron_energon_lite.decode.av.AVDecoder` itself (the object a
loaded sample holds), so ``isinstance`` checks work whichever path it was imported by.
"""

from __future__ import annotations

from typing import Any, Literal

from ...decode.av import AV_EXTENSIONS, AVDecoder, decode_av
from ...errors import ConfigError, format_message

__all__ = ["AVDecoder", "AVWebdatasetDecoder"]

_MODES = ("AVDecoder", "torch", "pyav")


class AVWebdatasetDecoder:
    """Decodes a video or audio part by its extension, as Energon's decoder object does.

    ``av_decode="AVDecoder"`` returns a lazy :class:`AVDecoder`, ``"torch"`` every frame (and the
    audio too with ``video_decode_audio``) as :class:`~megatron_energon_lite.energon.av.AVData`,
    ``"pyav"`` the opened PyAV container. Parts of other types give None.
    """

    def __init__(self, video_decode_audio: bool, av_decode: Literal["torch", "AVDecoder", "pyav"] = "AVDecoder") -> None:
        if av_decode not in _MODES:
            raise ConfigError(format_message("invalid av_decode", expected=" or ".join(map(repr, _MODES)), found=repr(av_decode)))
        self.video_decode_audio = video_decode_audio
        self.av_decode = av_decode

    def read_av_data(self, data: bytes) -> AVDecoder:
        """A lazy decoder over ``data``."""
        return AVDecoder(data)

    def __call__(self, key: str, data: bytes) -> Any:
        name = key.lower()
        if not any(name == ext or name.endswith("." + ext) for ext in AV_EXTENSIONS):
            return None
        return decode_av(data, self, name=key)
