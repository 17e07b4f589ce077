"""Energon's ``CrudeWebdataset``: samples as dicts of decoded parts, for cookers to turn into samples."""

from __future__ import annotations

from ...samples import CrudeSample
from .webdataset.default_decoder_webdataset import DefaultDecoderWebdatasetFactory

__all__ = ["CrudeSample", "CrudeWebdataset"]


class CrudeWebdataset(DefaultDecoderWebdatasetFactory[CrudeSample]):
    """A dataset whose ``dataset.yaml`` says ``__class__: CrudeWebdataset``: each sample is a
    :class:`CrudeSample` (its parts, decoded, plus ``__key__``, ``__subflavors__`` ...), cooked by
    the task encoder's ``cookers``."""

    __sample_type__ = CrudeSample
    #: A dataset.yaml naming a subclass is read as a crude one (DatasetFactory).
    yields_crude_samples = True
