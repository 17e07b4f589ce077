"""Energon's ``megatron.energon.av.utils``: clips and frames spread evenly over a media file."""

from ...decode.av import get_clips_uniform, get_single_frames_uniform

__all__ = ["get_clips_uniform", "get_single_frames_uniform"]
