"""Energon's ``flavors.webdataset``: the factories of prepared (tar) datasets."""

from ...av import AVDecoder
from ....decode import SampleDecoder
from ....decode.av import AVData
from ....errors import EmptyDatasetError
from .base_webdataset import BaseWebdatasetFactory
from .default_decoder_webdataset import DefaultDecoderWebdatasetFactory
from .default_generic_webdataset import DefaultGenericWebdatasetFactory
from .joined_webdataset import JoinedWebdatasetFactory
from .standard_webdataset import StandardWebdatasetFactory

__all__ = [
    "AVData",
    "AVDecoder",
    "BaseWebdatasetFactory",
    "DefaultDecoderWebdatasetFactory",
    "DefaultGenericWebdatasetFactory",
    "EmptyDatasetError",
    "JoinedWebdatasetFactory",
    "SampleDecoder",
    "StandardWebdatasetFactory",
]
