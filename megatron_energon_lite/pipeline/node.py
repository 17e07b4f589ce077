"""The contract every pipeline stage follows.

A stage is an iterator with exactly these methods:

* ``next()`` -> the next item, or ``StopIteration`` at the end of its stream (``__next__`` calls it);
* ``get_state()`` -> a small dict of plain JSON values: the stage's own counters plus its source's
  state under a fixed key (``"source"``, or ``"sources"`` for several).  Never samples, tensors,
  pickles or RNG objects;
* ``reset(state=None)`` -> start over (``None``) or continue exactly where ``state`` was taken;
* ``restore(restore_key)`` -> rebuild one item from its ``__restore_key__`` by random access, so a
  buffer can save keys instead of samples.

A restore key is a tuple built outward: each stage that changes an item prepends its tag and its
own indices to the key of its input (``("Map", 7, "Webdataset", 1234)``).  Stages that pass items
through unchanged (shuffle, repeat, limit) do not touch the key.

Randomness comes from :func:`megatron_energon_lite.rng.rng_for` with the stage's counters, so a
state never needs an RNG blob.
"""

from __future__ import annotations

from typing import Any, Generic, Iterator, TypeVar

from ..errors import StateError, format_message
from .state_check import state_path

T = TypeVar("T")

State = dict[str, Any]


class Node(Generic[T]):
    """Base class: subclasses implement ``next``, ``get_state``, ``reset`` and ``restore``."""

    #: Tag written into states and restore keys; subclasses set their own.
    tag = "Node"

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        return self.next()

    def next(self) -> T:
        raise NotImplementedError

    def get_state(self) -> State:
        raise NotImplementedError

    def reset(self, state: State | None = None) -> None:
        raise NotImplementedError

    def restore(self, restore_key: tuple) -> T:
        raise NotImplementedError(f"{type(self).__name__} cannot rebuild items from restore keys")

    def check_state(self, state: State, *keys: str) -> State:
        """Checks that ``state`` was written by this kind of stage and has ``keys``.

        The values are checked by each stage's ``reset`` with :mod:`.state_check`."""
        if not isinstance(state, dict) or state.get("stage") != self.tag or any(k not in state for k in keys):
            missing = [k for k in keys if k not in state] if isinstance(state, dict) else []
            raise StateError(
                format_message(
                    f"state does not belong to a {self.tag} stage",
                    where=state_path(),
                    expected=f"a dict with stage={self.tag!r} and keys {', '.join(keys)}",
                    found=repr(state)[:200] + (f" (missing: {', '.join(missing)})" if missing else ""),
                    fix="restore a state saved by a loader built with the same pipeline settings",
                )
            )
        return state


class KeyedDict(dict):
    """A dict item that carries its restore key as an attribute, not as a key.

    A hook may return a plain dict without a ``__restore_key__`` key (a batch for
    ``model(**batch)``).  Energon leaves such a dict without a restore key; adding the key would
    change what the user gets, and losing it would break the stages that save the keys of what
    they hold (packing, grouping) and ``restore_sample``.  :func:`set_restore_key` therefore
    returns a shallow copy of such a dict as a ``KeyedDict``: it is a ``dict`` with the same items
    (``model(**batch)`` and ``batch[...]`` work as before) whose key is ``batch.__restore_key__``,
    like a sample's.
    """

    __slots__ = ("__restore_key__",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.__restore_key__: tuple = ()

    def __reduce__(self):  # pickled to the main process with its key (and a plain dict's items)
        return (_keyed_dict, (dict(self), self.__restore_key__))


def _keyed_dict(items: dict, key: tuple) -> KeyedDict:
    out = KeyedDict(items)
    out.__restore_key__ = key
    return out


def get_restore_key(item: Any) -> tuple:
    """The ``__restore_key__`` of a sample, a crude dict, a :class:`KeyedDict` or a batch."""
    if isinstance(item, KeyedDict):
        return tuple(item.__restore_key__)
    if isinstance(item, dict):
        return tuple(item.get("__restore_key__", ()))
    return tuple(getattr(item, "__restore_key__", ()))


def set_restore_key(item: Any, key: tuple) -> Any:
    """Sets the restore key of ``item`` and returns the item to use from now on.

    Samples, batches and dicts that have a ``__restore_key__`` key are updated in place (as
    Energon does).  A dict without that key is not given one: the result is a
    :class:`KeyedDict` copy that carries the key as an attribute.  Always use the return value.
    """
    if isinstance(item, KeyedDict):
        item.__restore_key__ = key
    elif isinstance(item, dict):
        if "__restore_key__" in item:
            item["__restore_key__"] = key
        else:
            item = _keyed_dict(item, key)
    elif hasattr(item, "__restore_key__"):
        object.__setattr__(item, "__restore_key__", key)
    return item


def as_key(value: Any) -> tuple:
    """A restore key from its JSON form (lists back to tuples, at every depth)."""
    return tuple(as_key(v) if isinstance(v, (list, tuple)) else v for v in value)


def key_to_json(key: tuple) -> list:
    """The JSON form of a restore key (tuples to lists, at every depth)."""
    return [key_to_json(v) if isinstance(v, (list, tuple)) else v for v in key]
