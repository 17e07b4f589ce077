"""Energon's ``megatron.energon.metadataset.metadataset_v2``: ``MetadatasetV2`` and the objects its
``splits`` hold (see :mod:`.splits`)."""

from .metadataset import MetadatasetV2
from .splits import AuxDatasetReference, AuxFilesystemReference, MetadatasetEntry

__all__ = ["AuxDatasetReference", "AuxFilesystemReference", "MetadatasetEntry", "MetadatasetV2"]
