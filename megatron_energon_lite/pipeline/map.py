"""MapNode: applies ``fn(item, index)`` to every item; ``fn`` may also return a generator."""

from __future__ import annotations

from types import GeneratorType
from typing import Any, Callable

from ..errors import NotSupportedError, StateError, format_message
from .guard import DROPPED, SampleGuard
from .node import (
    ForwardsElastic,
    ForwardsEpochs,
    Node,
    OneSourceNode,
    Remainder,
    State,
    as_key,
    get_restore_key,
    key_problem_of,
    key_to_json,
    set_restore_key,
)
from .state_check import check_count, check_list, check_stage, invalid, nested

__all__ = ["MapNode"]

_END: Any = object()


class MapNode(OneSourceNode[Any], ForwardsEpochs, ForwardsElastic):
    """Applies ``fn(item, index)`` to each item of ``source``; ``index`` counts this stage's inputs.

    ``fn`` returns the output, raises ``SkipSample`` to drop the item, or returns a generator that
    yields 0..n outputs for the item.  Failures go through ``guard`` (see ``guard.py``).

    Restore keys: an output's key is the input's key with ``(tag, index)`` prepended, or
    ``(tag, index, sub_index)`` for the ``sub_index``-th output of a generator, e.g.
    ``("Map", 7, "Webdataset", 1234)`` and ``("Map", 7, 2, "Webdataset", 1234)``.  Input keys start
    with a tag string, so an int right after the index is always a ``sub_index``.

    Generator maps must be deterministic (``@stateless``): a state taken between two outputs of one
    input holds that input's restore key and how many outputs were emitted, and ``reset`` re-reads
    the input with ``source.restore``, calls ``fn`` again and skips the emitted outputs.

    ``start_epoch`` is forwarded to the source, so a ``RepeatNode`` may sit above a map (the index
    keeps counting across epochs, as in Energon).

    State keys:
        ``stage``: the tag (``"Map"`` unless given).
        ``index``: inputs pulled from the source so far (the next input gets this index).
        ``emitted``: outputs already emitted from the current generator input, else ``None``.
        ``input_key``: the restore key of the current generator input (JSON lists), else ``None``.
        ``failures``: the guard's consecutive-failure count.
        ``source``: the source's state.
    """

    tag = "Map"

    def __init__(
        self,
        source: Node[Any],
        fn: Callable[[Any, int], Any],
        *,
        guard: SampleGuard | None = None,
        tag: str = "Map",
    ) -> None:
        super().__init__(source)
        self.fn = fn
        self.tag = tag
        self.guard = guard if guard is not None else SampleGuard(stage=f"{tag}({getattr(fn, '__qualname__', fn)})")
        self._index = 0
        self._clear_generator()

    def _clear_generator(self) -> None:
        self._gen: GeneratorType | None = None
        self._gen_item: Any = None
        self._gen_key: tuple = ()
        self._gen_index = 0
        self._emitted = 0

    def next(self) -> Any:
        if self._gen is not None:
            out = self._pull_generator()
            if out is not _END:
                return out
        while True:
            item = self.source.next()
            index = self._index
            self._index += 1
            out = self.guard.call(item, self.fn, item, index)
            if out is DROPPED:
                continue
            if isinstance(out, GeneratorType):
                self._gen, self._gen_item, self._gen_key = out, item, get_restore_key(item)
                self._gen_index, self._emitted = index, 0
                out = self._pull_generator()
                if out is _END:
                    continue
                return out
            self.guard.passed()
            return set_restore_key(out, (self.tag, index) + get_restore_key(item))

    def _pull_generator(self) -> Any:
        """The next output of the current generator, or ``_END`` when it is done or failed."""
        out = self.guard.call(self._gen_item, next, self._gen, _END)
        if out is _END or out is DROPPED:
            self._clear_generator()
            return _END
        sub_index = self._emitted
        self._emitted += 1
        self.guard.passed()
        return set_restore_key(out, (self.tag, self._gen_index, sub_index) + self._gen_key)

    def get_state(self) -> State:
        in_generator = self._gen is not None
        return {
            "stage": self.tag,
            "index": self._index,
            "emitted": self._emitted if in_generator else None,
            "input_key": key_to_json(self._gen_key) if in_generator else None,
            "failures": self.guard.failures,
            "source": self.source.get_state(),
        }

    def reset(self, state: State | None = None) -> None:
        self._clear_generator()
        if state is None:
            self.source.reset(None)
            self._index = 0
            self.guard.reset()
            return
        check_stage(state, self.tag, "index", "emitted", "input_key", "failures", "source")
        index = check_count(state["index"], "index", stage=self.tag)
        failures = check_count(state["failures"], "failures", stage=self.tag)
        input_key, emitted = state["input_key"], state["emitted"]
        if input_key is not None:  # between two outputs of a generator input: the last input's
            check_list(input_key, "input_key", stage=self.tag, of="restore key parts")
            if index < 1:
                raise invalid(("index",), "an integer >= 1 (a generator input is being resumed)", index, stage=self.tag)
            emitted = check_count(emitted, "emitted", stage=self.tag)
        elif emitted is not None:
            raise invalid(("emitted",), "null (no generator input is being resumed: input_key is null)", emitted, stage=self.tag)
        with nested("source"):
            self.source.reset(state["source"])
        self._index = index
        self.guard.reset(failures)
        if input_key is not None:
            self._resume_generator(as_key(input_key), self._index - 1, emitted)

    def _resume_generator(self, key: tuple, index: int, emitted: int) -> None:
        """Re-creates the generator of input ``index`` and skips its ``emitted`` outputs."""
        item = self.source.restore(key)
        gen = self.fn(item, index)
        if not isinstance(gen, GeneratorType):
            raise self._not_deterministic(key, f"fn returned {type(gen).__name__}, the saved state expects a generator")
        for done in range(emitted):
            if next(gen, _END) is _END:
                raise self._not_deterministic(key, f"the generator yielded {done} outputs, the saved state says {emitted} were emitted")
        self._gen, self._gen_item, self._gen_key, self._gen_index, self._emitted = gen, item, key, index, emitted

    def _not_deterministic(self, key: tuple, found: str) -> StateError:
        return StateError(
            format_message(
                f"cannot resume the generator of {self.tag} stage {getattr(self.fn, '__qualname__', self.fn)!r}",
                where=f"input restore key {key!r}",
                expected="a deterministic (stateless) generator map that yields the same outputs again",
                found=found,
                fix="make the map deterministic, or seed its randomness from the sample index",
            )
        )

    def undelivered(self) -> Remainder:
        if self._gen is not None:
            raise NotSupportedError(
                format_message(
                    f"the {self.tag} stage was between two outputs of a generator when the state was saved; "
                    "its sample cannot be moved to another topology",
                    found=f"input {self._gen_key!r}, {self._emitted} output(s) delivered",
                    fix="restore on the topology the state was saved with",
                )
            )
        return self.source.undelivered()

    def restore_key_problem(self, key: tuple) -> str | None:
        if len(key) < 2 or key[0] != self.tag or not isinstance(key[1], int) or isinstance(key[1], bool):
            return f"[{self.tag!r}, index, [sub_index,] *input key]"
        inner = key[2:]
        return key_problem_of(self.source, inner[1:] if inner and isinstance(inner[0], int) else inner)

    def restore(self, restore_key: tuple) -> Any:
        key = as_key(restore_key)
        if len(key) < 2 or key[0] != self.tag or not isinstance(key[1], int):
            raise StateError(
                format_message(
                    f"restore key does not belong to a {self.tag} stage",
                    expected=f"({self.tag!r}, index[, sub_index], *input_key)",
                    found=repr(key)[:200],
                )
            )
        index, inner = key[1], key[2:]
        sub_index = None
        if inner and isinstance(inner[0], int):
            sub_index, inner = inner[0], inner[1:]
        out = self.fn(self.source.restore(inner), index)
        if isinstance(out, GeneratorType) != (sub_index is not None):
            raise self._not_deterministic(inner, f"restore key {key!r} does not match the kind of output fn returned")
        if sub_index is not None:
            for _ in range(sub_index):
                if next(out, _END) is _END:
                    break
            out = next(out, _END)
            if out is _END:
                raise self._not_deterministic(inner, f"the generator ended before output {sub_index}")
        return set_restore_key(out, key)
