"""Energon's task encoders (``TaskEncoder`` = the core's hooks + Energon's ``build_*`` methods)."""

from ...pipeline.marks import stateless
from .base import AugmentTaskEncoder, DefaultTaskEncoder, TaskEncoder, hook_context
from .cooking import Cooker, basic_sample_keys, cooker

__all__ = ["AugmentTaskEncoder", "Cooker", "DefaultTaskEncoder", "TaskEncoder", "basic_sample_keys", "cooker", "hook_context", "stateless"]
