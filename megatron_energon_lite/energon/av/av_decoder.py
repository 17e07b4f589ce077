"""Energon's ``megatron.energon.av.av_decoder``: :class:`AVDecoder` and :class:`AVWebdatasetDecoder`.

:class:`AVDecoder` is :class:`megatron_energon_lite.decode.av.AVDecoder` made with the policy of
the switch (``energon_mode``): under ``as_energon`` a clip range that starts after the end of its
stream gives no clip, as in Energon; without it, the plain import's error.  Every decoder of this
package counts as one (``isinstance``, ``issubclass``), whichever path made it: a loaded sample's
decoder is the core class, and Energon has a single class.
"""

from __future__ import annotations

from typing import Any, BinaryIO, Literal

from ...decode.av import AV_EXTENSIONS, decode_av
from ...decode.av import AVDecoder as CoreAVDecoder
from ...energon_mode import current_policy
from ...errors import ConfigError, format_message

__all__ = ["AVDecoder", "AVWebdatasetDecoder"]

_MODES = ("AVDecoder", "torch", "pyav")


class _AnyDecoder(type):
    """``isinstance`` / ``issubclass`` against Energon's name accept every decoder of ours."""

    def __instancecheck__(cls, instance: Any) -> bool:
        return isinstance(instance, CoreAVDecoder)

    def __subclasscheck__(cls, subclass: type) -> bool:
        return issubclass(subclass, CoreAVDecoder)


class AVDecoder(CoreAVDecoder, metaclass=_AnyDecoder):
    """Energon's ``AVDecoder(stream, suppress_warnings=False)``: ours, with the switch's policy
    unless ``policy`` is given."""

    def __init__(self, stream: bytes | bytearray | memoryview | BinaryIO, suppress_warnings: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("policy", current_policy())
        super().__init__(stream, suppress_warnings, **kwargs)


class AVWebdatasetDecoder:
    """Decodes a video or audio part by its extension, as Energon's decoder object does.

    ``av_decode="AVDecoder"`` returns a lazy :class:`AVDecoder`, ``"torch"`` every frame (and the
    audio too with ``video_decode_audio``) as :class:`~megatron_energon_lite.energon.av.AVData`,
    ``"pyav"`` the opened PyAV container. Parts of other types give None.  Its decoders follow the
    switch's policy as it was when it was made.
    """

    def __init__(self, video_decode_audio: bool, av_decode: Literal["torch", "AVDecoder", "pyav"] = "AVDecoder") -> None:
        if av_decode not in _MODES:
            raise ConfigError(format_message("invalid av_decode", expected=" or ".join(map(repr, _MODES)), found=repr(av_decode)))
        self.video_decode_audio = video_decode_audio
        self.av_decode = av_decode
        self.policy = current_policy()

    def read_av_data(self, data: bytes) -> CoreAVDecoder:
        """A lazy decoder over ``data``."""
        return CoreAVDecoder(data, policy=self.policy)

    def __call__(self, key: str, data: bytes) -> Any:
        name = key.lower()
        if not any(name == ext or name.endswith("." + ext) for ext in AV_EXTENSIONS):
            return None
        return decode_av(data, self, name=key)
