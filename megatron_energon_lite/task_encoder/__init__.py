"""Task encoders (Energon's ``megatron.energon.task_encoder``): the user's hooks and cookers."""

from .base import AugmentTaskEncoder, DefaultTaskEncoder, TaskEncoder, hook_context
from .cooking import Cooker, basic_sample_keys, cooker
from .marks import stateless

__all__ = ["AugmentTaskEncoder", "Cooker", "DefaultTaskEncoder", "TaskEncoder", "basic_sample_keys", "cooker", "hook_context", "stateless"]
