"""Energon's ``megatron.energon.metadataset``: loading datasets and metadatasets into factories."""

from .loader import load_dataset, prepare_metadataset, traverse_metadataset
from .loader_interface import (
    DatasetBlendMode,
    DatasetLoaderInterface,
    LoadedDataset,
    LoadedDatasetList,
)
from .metadataset import DatasetLoader, Metadataset, MetadatasetV2

__all__ = [
    "DatasetBlendMode",
    "DatasetLoader",
    "DatasetLoaderInterface",
    "LoadedDataset",
    "LoadedDatasetList",
    "Metadataset",
    "MetadatasetV2",
    "load_dataset",
    "prepare_metadataset",
    "traverse_metadataset",
]
