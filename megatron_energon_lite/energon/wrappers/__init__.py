"""Energon's dataset wrappers (``megatron.energon.wrappers``): recipes that compose pipelines."""

from .base import BaseWrapperDataset, SavableDataset
from .batch_dataset import BatchDataset
from .blend_dataset import BlendDataset
from .concat_dataset import ConcatDataset
from .epochize_dataset import EpochizeDataset
from .filter_dataset import FilterDataset
from .group_batch_dataset import GroupBatchDataset
from .iter_map_dataset import IterMapDataset
from .limit_dataset import LimitDataset
from .log_sample_dataset import GcDataset, LogSampleDataset
from .map_dataset import MapDataset
from .mix_batch_dataset import (
    MixBatchDataset,
    concat_pad,
    generic_concat,
    homogeneous_concat_mix,
)
from .packing_dataset import PackingDataset
from .repeat_dataset import RepeatDataset
from .shuffle_buffer_dataset import ShuffleBufferDataset

__all__ = [
    "BaseWrapperDataset",
    "BatchDataset",
    "BlendDataset",
    "ConcatDataset",
    "EpochizeDataset",
    "FilterDataset",
    "GcDataset",
    "GroupBatchDataset",
    "IterMapDataset",
    "LimitDataset",
    "LogSampleDataset",
    "MapDataset",
    "MixBatchDataset",
    "PackingDataset",
    "RepeatDataset",
    "SavableDataset",
    "ShuffleBufferDataset",
    "concat_pad",
    "generic_concat",
    "homogeneous_concat_mix",
]
