"""Energon's ``megatron.energon.av``: lazy video and audio decoding.

The implementation is :mod:`megatron_energon_lite.decode.av`; this package gives it Energon's
import paths (``megatron.energon.av``, ``.av_decoder``, ``.av_data``, ``.utils``, ``.av_reader``).
PyAV itself is still ``import av`` inside the package code: absolute imports never reach here.
"""

from .av_data import AVData
from .av_decoder import AVDecoder, AVWebdatasetDecoder
from .utils import get_clips_uniform, get_single_frames_uniform

__all__ = [
    "AVData",
    "AVDecoder",
    "AVWebdatasetDecoder",
    "get_clips_uniform",
    "get_single_frames_uniform",
]
