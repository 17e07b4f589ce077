"""Energon's path of :class:`SampleDecoder` (it lives in ``megatron_energon_lite.decode``)."""

from ....decode import SampleDecoder

__all__ = ["SampleDecoder"]
