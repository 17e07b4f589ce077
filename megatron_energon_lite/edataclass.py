"""``edataclass``: Energon's shorthand for ``@dataclass(kw_only=True, slots=True)``.

Sample and batch types are keyword-only, slotted dataclasses; user subclasses of
:class:`~megatron_energon_lite.samples.Sample` or :class:`~megatron_energon_lite.samples.Batch`
declared with ``@edataclass`` are exactly what Energon's decorator makes::

    @edataclass
    class MySample(Sample):
        image: torch.Tensor
        caption: str

For other options (``eq=False``, ``frozen=True``) use :func:`dataclasses.dataclass` directly.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any, TypeVar

if sys.version_info >= (3, 11):
    from typing import dataclass_transform
else:  # the decorator only informs type checkers; without it the class is the same

    def dataclass_transform(**_: Any) -> Callable[[Any], Any]:
        return lambda decorated: decorated


__all__ = ["edataclass"]

T = TypeVar("T", bound=type)


@dataclass_transform(kw_only_default=True)
def edataclass(cls: T) -> T:
    """``cls`` as a keyword-only dataclass with ``__slots__``."""
    return dataclasses.dataclass(kw_only=True, slots=True)(cls)
