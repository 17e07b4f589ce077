"""The contract every pipeline stage follows: read this file to write a new stage.

**What every stage implements** (:class:`Node`; nothing else is required):

* ``next()`` -> the next item, or ``StopIteration`` at the end of its stream (``__next__`` calls it);
* ``get_state()`` -> a small dict of plain JSON values: ``"stage"`` (its :attr:`Node.tag`), the
  stage's own counters, and its source's state under a fixed key (``"source"``, or ``"sources"``
  for several).  Never samples, tensors, pickles or RNG objects;
* ``reset(state=None)`` -> start over (``None``) or continue exactly where ``state`` was taken.
  Check the state's values first (:mod:`.state_check`: ``check_stage`` for its kind and keys,
  ``check_count`` and friends for each value) and reset the source inside ``nested("source")``;
* ``restore(restore_key)`` -> rebuild one item from its ``__restore_key__`` by random access, so a
  buffer can save keys instead of samples;
* ``inputs()`` -> the stages it reads from (none for a source).

:class:`OneSourceNode` (one ``source``) and :class:`PassThroughNode` (items come out as they went
in, so ``restore`` is the source's) save writing ``inputs`` and ``restore`` for the common cases.

**Optional protocols**, each a mixin a stage opts into after its base (``class
FilterNode(PassThroughNode, ForwardsEpochs, ForwardsElastic)``); nothing else assumes them:

* :class:`Elastic` (``undelivered`` / ``carry_in``): the stage can be restored on another
  topology (``loader/elastic.py``).  Elastic resume refuses a pipeline with a stage that does not
  implement it, naming the stage.  :class:`ForwardsElastic` serves stages that hold nothing of
  the epoch between calls (their remainder is their source's); a stage that buffers items
  overrides ``undelivered`` and adds them with :meth:`Remainder.with_waiting`.
* :class:`OwnsEpochs` / :class:`ForwardsEpochs` (``start_epoch``): the stage begins its next epoch
  in place (the dataset source, a repeat), or passes ``start_epoch`` on to its inputs (map, filter,
  blend).  A repeat above a chain that cannot (:func:`starts_epochs` is false) resets it instead.

Where a pass ends (one loop over the loader) is not a stage's business: :mod:`.passes` puts a
``PassNode`` on top, and whether the next pass continues the stream is decided once from the
recipes (``recipe.passes_continue``).

A restore key is a tuple built outward: each stage that changes an item prepends its tag and its
own indices to the key of its input (``("Map", 7, "Webdataset", 1234)``).  Stages that pass items
through unchanged (shuffle, repeat, limit) do not touch the key.

Randomness comes from :func:`megatron_energon_lite.rng.rng_for` with the stage's counters, so a
state never needs an RNG blob.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, Iterator, Sequence, TypeVar

from ..errors import ConfigError, NotSupportedError, format_message

T = TypeVar("T")

State = dict[str, Any]


@dataclass(frozen=True)
class BlendCursor:
    """Where a worker's blend stood, for elastic resume: the items it yielded (its place in the
    exact schedule) and, per dataset, how many items and how much cost came from it; ``schedule``:
    an endless exact blend's schedule cursor (``{"position", "counts"}``), so a schedule too long
    to tabulate need not be walked from its beginning.  ``offset``: the global position where the
    worker's stream began (after an elastic restore; counted once when workers are pooled, not once
    per worker); ``mix_from``: where the exact schedule of the current weights began (after a
    weight edit at resume; the schedule cursor's positions count from it)."""

    emitted: int
    counts: tuple[int, ...]
    costs: tuple[int, ...]
    schedule: dict | None = None
    offset: int = 0
    mix_from: int = 0


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
    """The contract of a stage (module docstring): ``next``, ``get_state``, ``reset``,
    ``restore`` and ``inputs``; iterating a stage calls ``next``."""

    #: Tag written into states and restore keys; subclasses set their own.
    tag = "Node"

    def inputs(self) -> Sequence[Node[Any]]:
        """The stages this one reads from (none for a source)."""
        return ()

    def next(self) -> T:
        raise NotImplementedError

    def get_state(self) -> State:
        raise NotImplementedError

    def reset(self, state: State | None = None) -> None:
        raise NotImplementedError

    def restore(self, restore_key: tuple) -> T:
        raise NotImplementedError(f"{type(self).__name__} cannot rebuild items from restore keys")

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        return self.next()


class OneSourceNode(Node[T]):
    """A stage that reads one ``source``."""

    def __init__(self, source: Node[Any]) -> None:
        self.source = source

    def inputs(self) -> Sequence[Node[Any]]:
        return (self.source,)


class PassThroughNode(OneSourceNode[T]):
    """A stage whose items come out as they went in (shuffle, filter, repeat, passes): their
    restore keys are the source's, and so is rebuilding them."""

    def restore(self, restore_key: tuple) -> T:
        return self.source.restore(restore_key)


# --- optional protocols ------------------------------------------------------------------------


class Elastic:
    """Opt-in: the stage can be restored on another topology (elastic resume, ``loader/elastic.py``).

    Elastic resume restores each saved worker's pipeline, asks it for ``undelivered()``, pools
    and divides those remainders over the new workers, and hands each new worker's fresh
    pipeline its share with ``carry_in``.  A stage implements both or neither; one that cannot
    in some configuration (a generator caught between two outputs) raises
    :class:`~megatron_energon_lite.errors.NotSupportedError` saying why.
    """

    def undelivered(self) -> Remainder:
        """What this stage and those below hold or have still to read of the running epoch."""
        raise NotImplementedError

    def carry_in(self, remainder: Remainder) -> None:
        """After ``reset(None)``: read ``remainder`` first, as the rest of its epoch, then go on
        with the next epoch (the counterpart of :meth:`undelivered`)."""
        raise NotImplementedError


class ForwardsElastic(Elastic):
    """:class:`Elastic` for a one-source stage that holds nothing of the epoch between calls: its
    remainder is its source's, and what it carries in goes to its source (a stage that buffers
    items overrides :meth:`undelivered` to add them).  Mixed into a :class:`OneSourceNode`."""

    source: Any

    def undelivered(self) -> Remainder:
        return self.source.undelivered()

    def carry_in(self, remainder: Remainder) -> None:
        self.source.carry_in(remainder)


class OwnsEpochs:
    """Opt-in: the stage begins its next epoch in place (a new slice order, a new pass of
    repeats) when :meth:`start_epoch` is called after ``StopIteration`` ended the last one."""

    def start_epoch(self, epoch: int) -> None:
        """Begins epoch ``epoch``; the next ``next()`` yields it."""
        raise NotImplementedError


class ForwardsEpochs:
    """Opt-in: the stage keeps no epoch of its own and passes ``start_epoch`` on to its inputs
    (map and filter keep counting across epochs; a blend also restarts its draws).  Mixed into a
    :class:`Node`, after it in the bases (as every protocol here)."""

    tag: str

    def start_epoch(self, epoch: int) -> None:
        """Begins epoch ``epoch`` on every input (all must start epochs, else a ConfigError
        naming the stage that stops it)."""
        if not starts_epochs(self):
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


def starts_epochs(node: Node[Any]) -> bool:
    """Whether ``start_epoch`` works on ``node``: it owns its epochs, or forwards them to inputs
    that all do."""
    if isinstance(node, OwnsEpochs):
        return True
    inputs = node.inputs()
    return isinstance(node, ForwardsEpochs) and bool(inputs) and all(starts_epochs(source) for source in inputs)


def _chain(node: Node[Any]) -> list[str]:
    """The tags from ``node`` down to its first input that cannot start epochs."""
    tags = [node.tag]
    while isinstance(node, ForwardsEpochs) and node.inputs():
        node = next((source for source in node.inputs() if not starts_epochs(source)), node.inputs()[0])
        tags.append(node.tag)
    return tags


class KeyedDict(dict):
    """A dict item that carries its restore key as an attribute, not as a key, inside the loader.

    A hook may return a plain dict without a ``__restore_key__`` key (a batch for
    ``model(**batch)``).  Energon leaves such a dict without a restore key; adding the key would
    change what the user gets, and losing it would break the stages that save the keys of what
    they hold (packing, grouping) and ``restore_sample``.  :func:`set_restore_key` therefore
    returns a shallow copy of such a dict as a ``KeyedDict`` whose key is
    ``batch.__restore_key__``, like a sample's.  It does not leave the loader: the loader hands
    out the plain ``dict`` again (:func:`unkeyed`; a subclass would be another type for
    ``type(batch) is dict`` and a leaf for ``torch.utils._pytree``) and keeps the key itself.
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


def unkeyed(item: Any) -> Any:
    """``item`` as the hook made it: a :class:`KeyedDict` as a plain ``dict`` (without its key),
    anything else unchanged."""
    return dict(item) if type(item) is KeyedDict else item


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
    return key_problem_of(sources[key[1]], key[2:])


def as_key(value: Any) -> tuple:
    """A restore key from its JSON form (lists back to tuples, at every depth)."""
    return tuple(as_key(v) if isinstance(v, (list, tuple)) else v for v in value)


def key_to_json(key: tuple) -> list:
    """The JSON form of a restore key (tuples to lists, at every depth)."""
    return [key_to_json(v) if isinstance(v, (list, tuple)) else v for v in key]


N = TypeVar("N", bound=Node)


def stages(node: Node[Any]) -> Iterator[Node[Any]]:
    """``node`` and every stage below it, depth first through ``inputs()``."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(current.inputs()))


def key_problem_of(node: Node[Any], key: tuple) -> str | None:
    """What a restore key of ``node``'s items must look like, when ``key`` (from a saved state)
    cannot be one; None when it can, or when no stage can tell without rebuilding the item.
    Opt-in: a stage that can tell has ``restore_key_problem(key)``; a pass-through stage's keys
    are its source's. Checked before a restore trusts a key (a shuffle buffer's)."""
    check = getattr(node, "restore_key_problem", None)
    if check is not None:
        return check(key)
    return key_problem_of(node.source, key) if isinstance(node, PassThroughNode) else None


def draws_with_replacement(node: Node[Any]) -> bool:
    """Whether one epoch of ``node`` may yield a sample more than once (a source drawing its
    slices with replacement: opt-in ``draws_with_replacement()`` of a stage)."""
    return any(getattr(stage, "draws_with_replacement", bool)() for stage in stages(node))


def find_stage(node: Node[Any], kind: type[N]) -> N | None:
    """The first stage of type ``kind`` at or below ``node`` (depth first through ``inputs()``)."""
    return next((stage for stage in stages(node) if isinstance(stage, kind)), None)
