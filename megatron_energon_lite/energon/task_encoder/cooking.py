"""Energon's ``megatron.energon.task_encoder.cooking``: the core's cookers under Energon's module name."""

from ...pipeline.cooking import Cooker, basic_sample_keys, cooker

__all__ = ["Cooker", "basic_sample_keys", "cooker"]
