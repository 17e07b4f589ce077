"""PackNode: Energon's sequence packing, restorable by replaying one buffer.

The stage reads ``buffer_size`` items from its source, asks ``select(items)`` how to group them
(a list of lists of the buffered items), and emits one pack per group:
``pack(postencode(member) for member in group)``.  ``pack`` may return a generator (0..n packs
per group).  When the groups of a buffer are used up, the next buffer is read.

``select`` gets a copy of the buffer list: it may sort it or pop from it (Energon's documented
pattern) without touching the buffer this stage keeps.  A group must hold samples of the buffer
(the same objects), and no sample may be in two groups (both are errors naming the keys).  A
sample the selection leaves out of every group is dropped, as Energon drops it; unless
``allow_drop`` says the task encoder drops on purpose, a warning counts them (the running count
of this worker, logged when it reaches 1, 2, 4, 8, ... dropped samples).

Bad samples: ``select`` runs through ``select_guard`` (by default a sibling of ``guard``, which
runs ``pack`` and ``postencode``: same handler and tolerance, its own consecutive-failure count,
as Energon's separate ``ErrorContext`` for the pre-packer).  The unit that fails is the whole
buffer: when ``select`` raises, the handler gets the list of buffered samples and the buffer is
dropped (none of its samples reaches a pack; they are not counted as left out), then the next
buffer is read.  ``SkipSample`` drops the buffer silently.  This is Energon 7.4.1's behaviour
(packing_dataset.py, ``next_pre_pack``: the handler gets ``samples``, ``pre_packs`` stays empty;
its docstring: "May raise SkipSample to skip a buffer").

State (DESIGN.md rule 3: positions, never samples): the source's state taken just before the
current buffer was read, how many groups of it were emitted, and how many outputs of the current
group's generator were emitted.  ``reset`` re-reads the buffer from that state (one buffer of
replay), calls ``select`` again (it must be deterministic, like every restorable hook) and skips
what was emitted.

Restore keys: ``("Pack", pack_index, *member_keys)``, or ``("Pack", pack_index, sub_index,
*member_keys)`` for the ``sub_index``-th output of a generator; ``restore`` re-reads the members
and packs them again.

State keys:
    ``stage``: ``"Pack"``.
    ``source``: the source's state before the current buffer (or now, when no buffer is open).
    ``open``: whether a buffer is being emitted.
    ``groups_done``: groups of the open buffer already emitted.
    ``emitted``: outputs of the current group's generator already emitted (0 for plain packs).
    ``index``: packs attempted so far; the next pack gets this index.
    ``buffer_index``: the pack index of the open buffer's first group (``select`` sees it).
    ``failures``: the guard's consecutive-failure count.
    ``left_out``: samples dropped by the selection before the open buffer (all so far when no
    buffer is open); optional when restoring (older states count from 0).
    ``select_failures``: the select guard's consecutive-failure count (optional when restoring:
    0).  An open buffer's selection succeeded, so a replay does not go through the guard again.
"""

from __future__ import annotations

import logging
from types import GeneratorType
from typing import Any, Callable

from ..errors import ConfigError, NotSupportedError, StateError, format_message
from .guard import DROPPED, SYSTEM_EXCEPTIONS, SampleGuard, describe_item
from .load import waiting_samples
from .node import (
    ForwardsElastic,
    Node,
    OneSourceNode,
    Remainder,
    State,
    as_key,
    get_restore_key,
    key_to_json,
    set_restore_key,
)
from .state_check import check_bool, check_count, check_stage, invalid, nested

__all__ = ["PackNode", "holds_open_pack", "is_open_pack"]

logger = logging.getLogger(__name__)

_END: Any = object()


class PackNode(OneSourceNode[Any], ForwardsElastic):
    tag = "Pack"

    def __init__(
        self,
        source: Node[Any],
        buffer_size: int,
        select: Callable[[list[Any], int], list[list[Any]]],
        pack: Callable[[list[Any], int], Any],
        *,
        postencode: Callable[[Any, int], Any] | None = None,
        allow_drop: bool = False,
        guard: SampleGuard | None = None,
        select_guard: SampleGuard | None = None,
    ) -> None:
        if not isinstance(buffer_size, int) or isinstance(buffer_size, bool) or buffer_size < 1:
            raise ConfigError(format_message("invalid packing_buffer_size", expected="an integer >= 1", found=repr(buffer_size)))
        super().__init__(source)
        self.buffer_size = buffer_size
        self.select = select
        self.pack = pack
        self.postencode = postencode
        self.allow_drop = allow_drop  # the task encoder drops on purpose: no warning
        self.guard = guard if guard is not None else SampleGuard(stage="pack")
        self.select_guard = select_guard if select_guard is not None else self.guard.sibling("select_samples_to_pack")
        self.reset()

    # --- state ---------------------------------------------------------------------------------
    def reset(self, state: State | None = None) -> None:
        self._groups: list[list[Any]] = []
        self._gen: GeneratorType | None = None
        self._gen_key: tuple = ()
        if state is None:
            self.source.reset(None)
            self.guard.reset()
            self.select_guard.reset()
            self._start = self.source.get_state()
            self._open, self._groups_done, self._emitted, self._index, self._buffer_index = False, 0, 0, 0, 0
            self._left_out = self._left_out_start = 0
            return
        check_stage(state, self.tag, "source", "open", "groups_done", "emitted", "index", "buffer_index", "failures")
        index = check_count(state["index"], "index", stage=self.tag)
        buffer_index = check_count(state["buffer_index"], "buffer_index", stage=self.tag, high=index, high_reason="a buffer starts at or before the next pack index")
        is_open = check_bool(state["open"], "open", stage=self.tag)
        groups_done = check_count(state["groups_done"], "groups_done", stage=self.tag)
        emitted = check_count(state["emitted"], "emitted", stage=self.tag)
        failures = check_count(state["failures"], "failures", stage=self.tag)
        left_out = check_count(state.get("left_out", 0), "left_out", stage=self.tag)
        select_failures = check_count(state.get("select_failures", 0), "select_failures", stage=self.tag)
        if emitted and not (is_open and index >= 1):
            raise invalid(("emitted",), "0 (no pack generator is being resumed: no buffer is open)", emitted, stage=self.tag)
        with nested("source"):
            self.source.reset(state["source"])
        self.guard.reset(failures)
        self.select_guard.reset(select_failures)
        self._start = state["source"]
        self._open, self._index, self._buffer_index = False, index, buffer_index
        self._groups_done, self._emitted = 0, 0
        self._left_out = self._left_out_start = left_out
        if is_open:
            # Replay: read the same buffer again, select again, skip what was emitted.
            self._read_buffer(buffer_index, replay=True)
            # A group being emitted (a generator's) is not done yet; otherwise all may be done.
            most = len(self._groups) - 1 if emitted else len(self._groups)
            self._groups_done = check_count(groups_done, "groups_done", stage=self.tag, high=most, high_reason=f"the replayed buffer has {len(self._groups)} groups")
            if emitted:
                self._start_group(self._groups[self._groups_done], index - 1)
                for done in range(emitted):
                    if self._gen is None or next(self._gen, _END) is _END:
                        raise invalid(
                            ("emitted",),
                            f"at most {done} outputs: the pack generator of group {self._groups_done} yields no more on replay",
                            emitted,
                            stage=self.tag,
                        )
                self._emitted = emitted

    def undelivered(self) -> Remainder:
        """The source's remainder and the members of the open buffer's groups not packed yet;
        samples the selection left out stay out, as in the run that was saved."""
        if self._emitted:
            raise NotSupportedError(
                format_message(
                    "a pack generator was between two outputs when the state was saved; its group cannot be moved to another topology",
                    found=f"group {self._groups_done} of the buffer at pack index {self._buffer_index}, {self._emitted} output(s) delivered",
                    fix="restore on the topology the state was saved with",
                )
            )
        members = [key_to_json(get_restore_key(m)) for group in self._groups[self._groups_done :] for m in group] if self._open else []
        return self.source.undelivered().with_waiting(waiting_samples(members, self.tag))

    def get_state(self) -> State:
        return {
            "stage": self.tag,
            "source": self._start if self._open else self.source.get_state(),
            "open": self._open,
            "groups_done": self._groups_done,
            "emitted": self._emitted,
            "index": self._index,
            "buffer_index": self._buffer_index,
            "failures": self.guard.failures,
            "left_out": self._left_out_start if self._open else self._left_out,
            "select_failures": self.select_guard.failures,
        }

    # --- iteration -----------------------------------------------------------------------------
    def _read_buffer(self, index: int, *, replay: bool = False) -> None:
        self._start = self.source.get_state()
        self._left_out_start = self._left_out
        items = []
        while len(items) < self.buffer_size:
            try:
                items.append(self.source.next())
            except StopIteration:
                break
        if not items:
            raise StopIteration
        if replay:
            groups = self._replay_select(items, index)
        else:
            # A copy: the selection may sort or pop its argument (Energon passes a copy too).
            groups = self.select_guard.call(items, self.select, list(items), index)
        if groups is DROPPED:
            # The whole buffer failed (reported with all its samples) or was skipped: no packs
            # from it; next() reads the next buffer.  Nothing of it is saved: a state is only
            # taken after a pack, so never while this buffer is open (see _replay_select).
            self._groups = []
        else:
            self.select_guard.passed()
            self._groups = self._check_groups(items, groups, replay=replay)
        self._buffer_index = index
        self._open, self._groups_done, self._emitted = True, 0, 0

    def _replay_select(self, items: list[Any], index: int) -> Any:
        """``select`` on a buffer it accepted before the state was saved: the open buffer of a
        saved state always had groups (a failed buffer is passed over before ``next`` returns).
        Not guarded, so the failure is neither reported nor counted twice; failing now means the
        selection is not deterministic, and the state cannot be resumed exactly."""
        try:
            return self.select(list(items), index)
        except SYSTEM_EXCEPTIONS:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure here is a state that cannot resume
            raise StateError(
                format_message(
                    "cannot resume packing: select_samples_to_pack failed on the replay of a buffer it had accepted",
                    where=f"packing buffer at pack index {index}: {describe_item(items)}",
                    expected="a deterministic selection (it must return the same groups for the same buffer)",
                    found=f"{type(exc).__name__}: {exc}",
                    fix="make select_samples_to_pack deterministic: no global random state, no state kept between calls",
                )
            ) from exc

    def _check_groups(self, items: list[Any], groups: Any, *, replay: bool = False) -> list[list[Any]]:
        if not isinstance(groups, (list, tuple)) or not all(isinstance(g, (list, tuple)) for g in groups):
            raise ConfigError(format_message("select_samples_to_pack must return a list of lists of samples", found=type(groups).__name__))
        position = {id(item): i for i, item in enumerate(items)}
        seen: dict[int, int] = {}
        for group in groups:
            for member in group:
                i = position.get(id(member))
                if i is None:
                    raise ConfigError(format_message("select_samples_to_pack returned a sample that was not in the buffer", found=describe_item(member), fix="return the buffer's own sample objects, grouped"))
                seen[i] = seen.get(i, 0) + 1
        repeated = [describe_item(items[i]) for i, n in seen.items() if n > 1]
        if repeated:
            raise ConfigError(format_message("select_samples_to_pack put a sample into more than one pack", found=", ".join(repeated[:5]), fix="put every sample of the buffer into exactly one group"))
        dropped = len(items) - len(seen)
        if dropped:
            self._report_left_out([item for i, item in enumerate(items) if i not in seen], len(items), replay=replay)
        return [list(group) for group in groups if group]

    def _report_left_out(self, left_out: list[Any], buffered: int, *, replay: bool) -> None:
        """Counts samples the selection put into no group; they are dropped (Energon's behaviour)."""
        before = self._left_out
        self._left_out += len(left_out)
        if replay:  # counted and reported when the buffer was first read
            return
        names = ", ".join(describe_item(item) for item in left_out[:3]) + (", ..." if len(left_out) > 3 else "")
        if self.allow_drop:
            logger.debug("select_samples_to_pack dropped %d of %d samples of a buffer: %s", len(left_out), buffered, names)
            return
        # Warn when the running count reaches the next power of two: 1, 2, 4, 8, ...
        if before == 0 or (self._left_out.bit_length() > before.bit_length()):
            logger.warning(
                "select_samples_to_pack left %d of %d samples of a packing buffer out of every pack; they are "
                "dropped (%d dropped so far by this worker; this warning repeats at 1, 2, 4, 8, ... dropped). "
                "Left out: %s. Put every sample into a group, or set packing_may_drop_samples = True on the "
                "task encoder to drop on purpose without this warning.",
                len(left_out),
                buffered,
                self._left_out,
                names,
            )

    def _start_group(self, group: list[Any], index: int) -> Any:
        members = group
        if self.postencode is not None:
            members = [self.postencode(member, index) for member in group]
        result = self.pack(members, index)
        key = (self.tag, index, *(get_restore_key(member) for member in group))
        if isinstance(result, GeneratorType):
            self._gen, self._gen_key, self._emitted = result, key, 0
            return None
        return set_restore_key(result, key)

    def next(self) -> Any:
        while True:
            if self._gen is not None:
                try:
                    output = next(self._gen)
                except StopIteration:
                    self._gen, self._emitted = None, 0
                    self._groups_done += 1
                    continue
                self._emitted += 1
                self.guard.passed()
                head, rest = self._gen_key[:2], self._gen_key[2:]
                return set_restore_key(output, (*head, self._emitted - 1, *rest))
            if not self._open or self._groups_done >= len(self._groups):
                self._open = False
                self._read_buffer(self._index)
                if not self._groups:  # the selection left the whole buffer out: read the next one
                    continue
            group = self._groups[self._groups_done]
            index = self._index
            self._index += 1
            result = self.guard.call(group, self._start_group, group, index)
            if result is DROPPED:
                self._groups_done += 1
                continue
            if result is None:  # a generator: its outputs come on the next turns
                continue
            self._groups_done += 1
            self.guard.passed()
            return result

    def restore(self, restore_key: tuple) -> Any:
        key = as_key(restore_key)
        if len(key) < 3 or key[0] != self.tag or not isinstance(key[1], int):
            raise StateError(format_message("restore key does not belong to a Pack stage", expected="('Pack', pack_index, [sub_index,] *member_keys)", found=repr(key)[:200]))
        sub = key[2] if isinstance(key[2], int) else None
        members = [self.source.restore(member) for member in key[3 if sub is not None else 2 :]]
        if self.postencode is not None:
            members = [self.postencode(member, key[1]) for member in members]
        result = self.pack(members, key[1])
        if isinstance(result, GeneratorType):
            for _ in range(sub or 0):
                next(result)
            result = next(result)
        return set_restore_key(result, key)


def is_open_pack(state: Any) -> bool:
    """Whether ``state`` is a Pack stage's state caught with its buffer open: its restore
    replays the buffer from an earlier state of its sources, so those sources must read what
    they read then."""
    return isinstance(state, dict) and state.get("stage") == PackNode.tag and bool(state.get("open"))


def holds_open_pack(state: Any) -> bool:
    """Whether an open Pack stage's state is anywhere in ``state`` (a pipeline's, a rank's)."""
    if is_open_pack(state):
        return True
    values = state.values() if isinstance(state, dict) else state if isinstance(state, list) else ()
    return any(holds_open_pack(v) for v in values)
