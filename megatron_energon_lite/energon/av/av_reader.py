"""Energon's ``megatron.energon.av.av_reader``: the keyframe probe index, and the reader names.

:class:`AVProbeIndex` and :class:`AVProbeIndexEntry` are :mod:`megatron_energon_lite.decode.av`'s
(the index the decoder seeks and counts frames with).  Energon's frame readers are internals of
its decoder; this package seeks and decodes in ``AVDecoder`` instead, so those names exist only so
that modules which import them still load, and using one raises
:class:`~megatron_energon_lite.errors.NotSupportedError`.
"""

from __future__ import annotations

from typing import Any

from ...decode.av import AVProbeIndex, AVProbeIndexEntry
from ...errors import NotSupportedError, format_message

__all__ = ["AVProbeIndex", "AVProbeIndexEntry", "AVReader", "AVReaderByFrames", "AVReaderByPts"]


def _not_supported(name: str) -> type:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        raise NotSupportedError(
            format_message(
                f"megatron.energon.av.av_reader.{name} is not implemented by megatron_energon_lite",
                fix="decode through AVDecoder (get_clips, get_frames, get_metadata), which seeks by itself",
            )
        )

    return type(name, (), {"__init__": __init__, "__module__": __name__, "__doc__": f"Energon's {name} (not implemented here)."})


AVReader = _not_supported("AVReader")
AVReaderByFrames = _not_supported("AVReaderByFrames")
AVReaderByPts = _not_supported("AVReaderByPts")
