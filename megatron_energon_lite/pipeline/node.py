"""The contract every pipeline stage follows.

A stage is an iterator with exactly these methods:

* ``next()`` -> the next item, or ``StopIteration`` at the end of its stream (``__next__`` calls it);
* ``get_state()`` -> a small dict of plain JSON values: the stage's own counters plus its source's
  state under a fixed key (``"source"``, or ``"sources"`` for several).  Never samples, tensors,
  pickles or RNG objects;
* ``reset(state=None)`` -> start over (``None``) or continue exactly where ``state`` was taken;
* ``restore(restore_key)`` -> rebuild one item from its ``__restore_key__`` by random access, so a
  buffer can save keys instead of samples;
* ``inputs()`` -> the stages it reads from, and ``epochs``, how it takes part in epochs: it starts
  its next epoch itself (``OWNS_EPOCHS``: the dataset source, a repeat), passes ``start_epoch`` on
  to its inputs (``FORWARDS_EPOCHS``: map, filter, blend), or cannot (``None``: a repeat above it
  resets it instead).  Where a pass ends is :mod:`.passes`' job alone.

A restore key is a tuple built outward: each stage that changes an item prepends its tag and its
own indices to the key of its input (``("Map", 7, "Webdataset", 1234)``).  Stages that pass items
through unchanged (shuffle, repeat, limit) do not touch the key.

Randomness comes from :func:`megatron_energon_lite.rng.rng_for` with the stage's counters, so a
state never needs an RNG blob.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Iterator, Sequence, TypeVar

from ..errors import ConfigError, NotSupportedError, StateError, format_message
from .state_check import state_path

T = TypeVar("T")

State = dict[str, Any]

#: ``Node.epochs``: the stage starts its next epoch itself (a new slice order, a new repeat pass).
OWNS_EPOCHS = "owns"
#: ``Node.epochs``: the stage passes ``start_epoch`` on to its inputs (it keeps no epoch of its own).
FORWARDS_EPOCHS = "forwards"


@dataclass(frozen=True)
class BlendCursor:
    """Where a worker's blend stood, for elastic resume: the items it yielded (its place in the
    exact schedule) and, per dataset, how many items and how much cost came from it; ``schedule``:
    an endless exact blend's schedule cursor (``{"position", "counts"}``), so a schedule too long
    to tabulate need not be walked from its beginning."""

    emitted: int
    counts: tuple[int, ...]
    costs: tuple[int, ...]
    schedule: dict | None = None


@dataclass(frozen=True)
class Remainder:
    """What a worker had not delivered of the running epoch of each dataset it reads (one entry
    without a blend; entry ``k`` is the blend's dataset ``k``), for elastic resume.

    ``epochs[k]``: the epoch of dataset ``k`` its source was in; ``ranges[k]``: the split index
    ranges ``[start, end)`` its source had not read of that epoch; ``waiting[k]``: the split
    indices of its samples waiting in buffers (read, not delivered: of that epoch, or of the one
    before when the source had just begun a new one); ``blend``: the blend's cursor, if any.

    In a pass of a ``blend_epochized`` blend (each dataset a fixed number of times), ``epochs[k]``
    is the pass and ``layers[k]`` the ranges still to read in each repetition of it (index: the
    repetition; the same sample may be in several); ``ranges[k]`` is their concatenation.
    ``layers`` is None elsewhere.
    """

    epochs: tuple[int, ...]
    ranges: tuple[list[tuple[int, int]], ...]
    waiting: tuple[list[int], ...] = field(default_factory=lambda: ([],))  # a fresh list each
    blend: BlendCursor | None = None
    layers: tuple[list[list[tuple[int, int]]], ...] | None = None

    @classmethod
    def of_one(cls, epoch: int, ranges: list[tuple[int, int]]) -> Remainder:
        """One dataset's remainder (a source's, or what a new worker carries in)."""
        return cls((epoch,), (list(ranges),), ([],))

    def dataset(self, k: int) -> Remainder:
        """Dataset ``k``'s part, as a one-dataset remainder, its waiting samples read first."""
        return Remainder.of_one(self.epochs[k], [*((i, i + 1) for i in self.waiting[k]), *self.ranges[k]])

    def with_waiting(self, samples: list[tuple[int, int]]) -> Remainder:
        """This remainder and the samples a buffer holds, ``(dataset, split index)`` each."""
        waiting = [list(w) for w in self.waiting]
        for dataset, index in samples:
            if not 0 <= dataset < len(waiting):
                raise NotSupportedError(format_message("a buffered sample names a dataset the pipeline does not read", found=f"dataset {dataset} of {len(waiting)}"))
            waiting[dataset].append(index)
        return Remainder(self.epochs, self.ranges, tuple(waiting), self.blend, self.layers)


def samples_between(ranges: Sequence[tuple[int, int]], first: int, last: int) -> list[tuple[int, int]]:
    """The samples at positions ``[first, last)`` of ``ranges`` counted in order, as ranges."""
    taken: list[tuple[int, int]] = []
    position = 0
    for start, end in ranges:
        length = end - start
        lo, hi = max(first, position), min(last, position + length)
        if lo < hi:
            taken.append((start + lo - position, start + hi - position))
        position += length
        if position >= last:
            break
    return taken


class Node(Generic[T]):
    """Base class: subclasses implement ``next``, ``get_state``, ``reset`` and ``restore``."""

    #: Tag written into states and restore keys; subclasses set their own.
    tag = "Node"
    #: How the stage takes part in epochs: ``OWNS_EPOCHS``, ``FORWARDS_EPOCHS`` or None (it cannot
    #: start one in place: batches, buffers, user wrappers; a repeat above it resets it instead).
    epochs: ClassVar[str | None] = None

    def inputs(self) -> Sequence[Node[Any]]:
        """The stages this one reads from (none for a source)."""
        return ()

    def starts_epochs(self) -> bool:
        """Whether :meth:`start_epoch` works here: the stage owns its epochs, or forwards them to
        inputs that all do."""
        if self.epochs == OWNS_EPOCHS:
            return True
        inputs = self.inputs()
        return self.epochs == FORWARDS_EPOCHS and bool(inputs) and all(source.starts_epochs() for source in inputs)

    def ends_passes(self) -> bool:
        """Whether the stage decides where a pass ends (``passes.PassNode``; a stage that is
        transparent to states answers for its source)."""
        return False

    def pass_was_over(self) -> None:
        """For stages that end passes: the state just restored was saved after the loop over the
        loader ended (see ``passes.PassNode.pass_was_over``)."""
        raise NotImplementedError(f"{type(self).__name__} does not end passes")

    def undelivered(self) -> Remainder:
        """What this stage and those below hold or have still to read of the running epoch (for
        restoring on another topology).  Stages that hold nothing between calls ask their input;
        the others say what they hold or refuse."""
        raise NotSupportedError(
            format_message(
                f"a loader with a {self.tag} stage cannot be restored on another topology yet",
                expected="the saved number of ranks and workers",
                fix="restore on the topology the state was saved with",
            )
        )

    def carry_in(self, remainder: Remainder) -> None:
        """After ``reset(None)``: read ``remainder`` first, as the rest of epoch ``remainder.epoch``,
        then go on with the next epoch (the counterpart of :meth:`undelivered`)."""
        self.undelivered()  # the same refusal

    def start_epoch(self, epoch: int) -> None:
        """Begins epoch ``epoch`` in place (after ``StopIteration`` ended epoch ``epoch - 1``); the
        next ``next()`` yields it.  This default serves stages that forward epochs: it starts the
        epoch on every input."""
        if not self.starts_epochs():
            raise ConfigError(
                format_message(
                    f"{self.tag} stage cannot start a new epoch in place",
                    expected="stages between a repeat and the dataset source that pass epochs on (map, filter, blend)",
                    found=" <- ".join(_chain(self)),
                    fix="put the repeat directly above the source, or let it reset the stages below instead",
                )
            )
        for source in self.inputs():
            source.start_epoch(epoch)

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

    def draws_with_replacement(self) -> bool:
        """Whether one epoch may yield a sample more than once (slices drawn with replacement)."""
        return any(source.draws_with_replacement() for source in self.inputs())

    def restore_key_problem(self, key: tuple) -> str | None:
        """What a restore key of this stage's items must look like, when ``key`` (from a saved
        state) cannot be one; None when it can, or when this stage cannot tell without
        rebuilding the item. Checked before a restore trusts the key (a shuffle buffer's)."""
        return None

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


def _chain(node: Node[Any]) -> list[str]:
    """The tags from ``node`` down to its first input that cannot start epochs."""
    tags = [node.tag]
    while node.epochs == FORWARDS_EPOCHS and node.inputs():
        node = next((source for source in node.inputs() if not source.starts_epochs()), node.inputs()[0])
        tags.append(node.tag)
    return tags


class OneSourceNode(Node[T]):
    """A stage that reads one ``source``.  An elastic restore's remainder goes to the source (a
    stage that cannot have its position moved refuses in ``undelivered``, which comes first)."""

    def __init__(self, source: Node[Any]) -> None:
        self.source = source

    def inputs(self) -> Sequence[Node[Any]]:
        return (self.source,)

    def carry_in(self, remainder: Remainder) -> None:
        self.source.carry_in(remainder)


class PassThroughNode(OneSourceNode[T]):
    """A stage whose items come out as they went in (shuffle, filter, repeat, passes): their
    restore keys are the source's, and so is rebuilding them.  It holds nothing between calls
    unless it says otherwise (the shuffle buffer does)."""

    def restore(self, restore_key: tuple) -> T:
        return self.source.restore(restore_key)

    def restore_key_problem(self, key: tuple) -> str | None:
        return self.source.restore_key_problem(key)

    def undelivered(self) -> Remainder:
        return self.source.undelivered()


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


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def tagged_key_problem(key: tuple, tag: str, sources: Sequence[Node[Any]]) -> str | None:
    """:meth:`Node.restore_key_problem` of a stage whose keys are ``(tag, source index, *key of
    that source's item)`` (a blend, a concatenation)."""
    if len(key) < 2 or key[0] != tag or not _is_int(key[1]) or not 0 <= key[1] < len(sources):
        return f"[{tag!r}, source index < {len(sources)}, *item key]"
    return sources[key[1]].restore_key_problem(key[2:])


def as_key(value: Any) -> tuple:
    """A restore key from its JSON form (lists back to tuples, at every depth)."""
    return tuple(as_key(v) if isinstance(v, (list, tuple)) else v for v in value)


def key_to_json(key: tuple) -> list:
    """The JSON form of a restore key (tuples to lists, at every depth)."""
    return [key_to_json(v) if isinstance(v, (list, tuple)) else v for v in key]


N = TypeVar("N", bound=Node)


def find_stage(node: Node[Any], kind: type[N]) -> N | None:
    """The first stage of type ``kind`` at or below ``node`` (depth first through ``inputs()``)."""
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, kind):
            return current
        stack.extend(reversed(current.inputs()))
    return None
