"""Printing samples for people: one line for error messages, a YAML view for debugging.

Energon's ``megatron.energon.sample_utils``, with the same output:

* :func:`format_sample_compact` renders any sample on one line (dicts, lists, tuples, strings,
  tensors and arrays by shape, dataclasses by field), cut at a nesting depth and a length.
* :func:`format_sample_detailed` renders it as block YAML: dataclasses as ``{ClassName: fields}``,
  tensors and arrays with shape, dtype, range and their first and last values, long strings and
  containers shortened.
* :func:`default_get_batch_keys` finds the sample keys of a batch.

torch and numpy are not imported here: a value can only be a tensor or an array if the caller
has imported them already.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import yaml

__all__ = ["default_get_batch_keys", "format_sample_compact", "format_sample_detailed"]

# Detailed view limits (Energon's): items per dict and list, characters per string and repr.
_DETAIL_DICT_ITEMS = 25
_DETAIL_LIST_ITEMS = 10
_DETAIL_STR = 1000
_DETAIL_REPR = 200
# Values shown at each end of a tensor or array.
_EDGE_VALUES = 3


def _is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _is_array(value: Any) -> bool:
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.ndarray)


def _is_dataclass_instance(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def _str_keys(value: Any) -> list[str] | None:
    if isinstance(value, list) and all(isinstance(k, str) for k in value):
        return value
    return None


def default_get_batch_keys(batch: Any) -> list[str] | None:
    """The sample keys of ``batch`` (or of its first element, if it is a list), or None.

    Looks, in order, at the ``__key__`` and ``__keys__`` attributes (lists of strings), then at
    the ``"__key__"``, ``"__keys__"`` and ``"keys"`` entries of a dict.
    """
    if isinstance(batch, list):
        batch = batch[0]
    for name in ("__key__", "__keys__"):
        keys = _str_keys(getattr(batch, name, None))
        if keys is not None:
            return keys
    if isinstance(batch, dict):
        for name in ("__key__", "__keys__", "keys"):
            if name in batch and all(isinstance(k, str) for k in batch[name]):
                return batch[name]
    return None


def format_sample_compact(sample: Any, depth: int = 3, max_items: int = 10, max_str_len: int = 50) -> str:
    """``sample`` on one line, for error messages and logs.

    Containers deeper than ``depth`` show as ``{...}``, ``[...]`` or ``(...)``; at most
    ``max_items`` entries of each are shown, and strings (also the repr of other objects) are
    cut to ``max_str_len`` characters. Values of dict keys starting with ``__`` (``__key__``,
    ``__restore_key__``, ...) are shown in full.
    """

    def compact(value: Any, depth: int) -> str:
        return format_sample_compact(value, depth, max_items, max_str_len)

    if isinstance(sample, dict):
        if depth <= 0:
            return "{...}"
        entries = []
        for key, value in list(sample.items())[:max_items]:
            shown = repr(value) if isinstance(key, str) and key.startswith("__") else compact(value, depth - 1)
            entries.append(f"{key}: {shown}")
        return "{" + ", ".join(entries) + "}"
    if isinstance(sample, (list, tuple)):
        opening, closing = ("[", "]") if isinstance(sample, list) else ("(", ")")
        if depth <= 0:
            return f"{opening}...{closing}"
        return opening + ", ".join(compact(value, depth - 1) for value in sample[:max_items]) + closing
    if isinstance(sample, str):
        return repr(sample[:max_str_len] + "...") if len(sample) > max_str_len else repr(sample)
    if _is_tensor(sample):
        return f"Tensor(shape={sample.shape}, dtype={sample.dtype}, device={sample.device})"
    if _is_array(sample):
        return f"np.ndarray(shape={sample.shape}, dtype={sample.dtype})"
    if _is_dataclass_instance(sample):
        fields = ", ".join(f"{f.name}={compact(getattr(sample, f.name), depth)}" for f in dataclasses.fields(sample))
        return f"{type(sample).__name__}({fields})"
    return compact(repr(sample), depth)


def _values_text(values: Any, count: int, item: Any) -> str:
    """``values=[a, b, c, ..., x, y, z]``: every value if there are few, else the first and last few."""
    if count <= 2 * _EDGE_VALUES:
        shown = [repr(item(v)) for v in values]
    else:
        ends = [*values[:_EDGE_VALUES], *values[-_EDGE_VALUES:]]
        shown = [repr(item(v)) for v in ends]
        shown.insert(_EDGE_VALUES, "...")
    return "values=[" + ", ".join(shown) + "]"


def _tensor_text(tensor: Any) -> str:
    head = f"Tensor(shape={tensor.shape}, dtype={tensor.dtype}, device={tensor.device}"
    try:
        low, high = tensor.min().item(), tensor.max().item()
        values = _values_text(tensor.flatten(), tensor.numel(), lambda v: v.item())
    except (RuntimeError, ValueError):  # empty tensors, dtypes without an order
        return head + ")"
    return f"{head}, min={low}, max={high}, {values})"


def _array_text(array: Any) -> str:
    head = f"np.ndarray(shape={array.shape}, dtype={array.dtype}"
    try:
        low, high = array.min(), array.max()
        values = _values_text(array.ravel(), array.size, lambda v: v)
    except (ValueError, TypeError):  # empty arrays, dtypes without an order
        return head + ")"
    return f"{head}, min={low}, max={high}, {values})"


def _yaml_key(key: Any) -> Any:
    return key if key is None or isinstance(key, (str, int, float, bool)) else repr(key)


def _printable(value: Any) -> Any:
    """``value`` as plain YAML-dumpable data (dicts, lists, strings and numbers)."""
    if _is_tensor(value):
        return _tensor_text(value)
    if _is_array(value):
        return _array_text(value)
    if _is_dataclass_instance(value):
        return {type(value).__name__: {f.name: _printable(getattr(value, f.name)) for f in dataclasses.fields(value)}}
    if isinstance(value, dict):
        items = list(value.items())
        out = {_yaml_key(k): _printable(v) for k, v in items[:_DETAIL_DICT_ITEMS]}
        if len(items) > _DETAIL_DICT_ITEMS:
            out["..."] = f"and {len(items) - _DETAIL_DICT_ITEMS} more items"
        return out
    if isinstance(value, (list, tuple)):
        out = [_printable(v) for v in value[:_DETAIL_LIST_ITEMS]]
        if len(value) > _DETAIL_LIST_ITEMS:
            out.append(f"... and {len(value) - _DETAIL_LIST_ITEMS} more items")
        return out
    if isinstance(value, str):
        if len(value) > _DETAIL_STR:
            return f"{value[:_DETAIL_STR]}... (and {len(value) - _DETAIL_STR} more characters)"
        return value
    if value is None or isinstance(value, (int, float, bool)):
        return value
    text = repr(value)
    return text[:_DETAIL_REPR] + "..." if len(text) > _DETAIL_REPR else text


def format_sample_detailed(sample: Any, indent: str = "") -> str:
    """``sample`` as multi-line block YAML, for debugging; every non-empty line gets ``indent``."""
    text = yaml.safe_dump(_printable(sample), sort_keys=False, default_flow_style=False, width=120).rstrip()
    text = text.removesuffix("\n...")  # the document end marker YAML adds after a lone scalar
    if not indent:
        return text
    return "\n".join(indent + line if line else line for line in text.splitlines())
