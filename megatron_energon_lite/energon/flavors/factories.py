"""The factory of each dataset of a plan, of the class Energon would make for it."""

from __future__ import annotations

from ..epathlib import EPath
from ...format.dataset_config import load_dataset_config
from ...pipeline.build import PipelineSpec, factory_arguments, spec_decoder
from ...samples import TokensSample
from .base_dataset import BaseCoreDatasetFactory
from .crude import CrudeWebdataset
from .jsonl import DefaultCrudeJsonlDatasetFactory
from .webdataset.base_webdataset import BaseWebdatasetFactory
from .webdataset.joined_webdataset import JoinedWebdatasetFactory
from .webdataset.standard_webdataset import StandardWebdatasetFactory

__all__ = ["plan_factory"]


def plan_factory(spec: PipelineSpec, index: int, slices: list[list[tuple[int, int]]], size: int) -> BaseCoreDatasetFactory:
    """Dataset ``index`` of ``spec``'s plan as a factory: ``JoinedWebdatasetFactory`` for a join,
    ``DefaultCrudeJsonlDatasetFactory`` for a ``.jsonl`` file, ``StandardWebdatasetFactory`` of
    ``TokensSample`` for a Megatron ``.bin/.idx`` dataset, the user's class that its
    ``dataset.yaml`` names, ``CrudeWebdataset`` for a crude dataset, else
    ``StandardWebdatasetFactory`` of the sample type its ``dataset.yaml`` names."""
    leaf = spec.plan.leaves[index]
    if leaf.join is not None:
        factory: BaseWebdatasetFactory = JoinedWebdatasetFactory.of_plan(spec, index, slices, size)
        factory.__sample_type__ = object
        return factory
    if str(leaf.path).endswith(".jsonl"):
        return DefaultCrudeJsonlDatasetFactory.of_plan(spec, index, slices, size)
    if spec.datasets[index].indexed_prefix is not None:  # a Megatron .bin/.idx dataset: TokensSamples
        factory = StandardWebdatasetFactory.of_plan(spec, index, slices, size)
        factory.__sample_type__ = TokensSample
        return factory
    dataset_config = leaf.dataset_config or spec.dataset_config
    config = load_dataset_config(leaf.path, dataset_config, trust_dataset_code=spec.trust_dataset_code, policy=spec.policy)
    if config.factory_class is not None:  # the user's own class, made as the loader's workers make it
        # dataset.yaml's own split_config (a factory key) wins over the loader's, as in Energon
        user = config.make_factory(EPath(leaf.path), subflavors=leaf.subflavors, split_part=leaf.split_part, split_config=leaf.split_config or spec.split_config, dataset_config=dataset_config, decoder=spec_decoder(spec), trust_dataset_code=spec.trust_dataset_code, **factory_arguments(spec, leaf))
        user.bind(spec, index, slices, size)
        return user
    if config.kind == "crude":
        return CrudeWebdataset.of_plan(spec, index, slices, size, yaml_subflavors=config.subflavors)
    factory = StandardWebdatasetFactory.of_plan(spec, index, slices, size, yaml_subflavors=config.subflavors)
    factory.__sample_type__ = config.sample_type
    return factory
