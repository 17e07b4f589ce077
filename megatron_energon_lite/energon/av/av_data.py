"""Energon's ``megatron.energon.av.av_data``: :class:`AVData`, decoded clips and their timestamps."""

from ...decode.av import AVData

__all__ = ["AVData"]
