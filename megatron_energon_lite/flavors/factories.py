"""The factory of each dataset of a plan, of the class Energon would make for it."""

from __future__ import annotations

from ..format.dataset_config import load_dataset_config
from ..pipeline.build import PipelineSpec
from .base_dataset import BaseCoreDatasetFactory
from .crude import CrudeWebdataset
from .jsonl import DefaultCrudeJsonlDatasetFactory
from .webdataset.base_webdataset import BaseWebdatasetFactory
from .webdataset.joined_webdataset import JoinedWebdatasetFactory
from .webdataset.standard_webdataset import StandardWebdatasetFactory

__all__ = ["plan_factory"]


def plan_factory(spec: PipelineSpec, index: int, slices: list[list[tuple[int, int]]], size: int) -> BaseCoreDatasetFactory:
    """Dataset ``index`` of ``spec``'s plan as a factory: ``JoinedWebdatasetFactory`` for a join,
    ``DefaultCrudeJsonlDatasetFactory`` for a ``.jsonl`` file, ``CrudeWebdataset`` for a crude
    dataset, else ``StandardWebdatasetFactory`` of the sample type its ``dataset.yaml`` names."""
    leaf = spec.plan.leaves[index]
    if leaf.join is not None:
        factory: BaseWebdatasetFactory = JoinedWebdatasetFactory.of_plan(spec, index, slices, size)
        factory.__sample_type__ = object
        return factory
    if str(leaf.path).endswith(".jsonl"):
        return DefaultCrudeJsonlDatasetFactory.of_plan(spec, index, slices, size)
    config = load_dataset_config(leaf.path, leaf.dataset_config or spec.dataset_config, trust_dataset_code=spec.trust_dataset_code)
    if config.kind == "crude":
        return CrudeWebdataset.of_plan(spec, index, slices, size, yaml_subflavors=config.subflavors)
    factory = StandardWebdatasetFactory.of_plan(spec, index, slices, size, yaml_subflavors=config.subflavors)
    factory.__sample_type__ = config.sample_type
    return factory
