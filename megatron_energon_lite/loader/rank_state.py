"""One rank's loader state: what ``save_state_rank`` writes and ``restore_state_rank`` reads.

Plain JSON on disk, a checked :class:`RankState` in memory: the loader builds one from its own
counters to save, and parses (and checks) one to restore, so no other class's fields are written
from outside.  Version 2 (this one) puts a ``Pass`` stage (``pipeline/passes.py``) on top of every
worker pipeline that had none; version 1 states are upgraded on load.  Version 3 (this one) adds
``data``: per dataset, the shards, sample counts and a digest the state was saved against
(``format/resolved.data_record``), which a restore compares with the data it finds
(:func:`check_saved_data`); older states restore unchecked, with a logged note.  Two optional
fields, written only when they apply so that other states keep their shape: ``manifest_step``
(``manifest.py``) and ``sample_skips`` (a replay's skip list with its own version,
``sample_skips.py``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from .._version import __version__
from ..errors import StateError, format_message
from ..policy import PLAIN, Policy, log_once
from ..pipeline.passes import upgrade_v1_worker_state
from ..pipeline.state_check import check_bool, check_index, invalid
from ..worker import WorkerConfig
from .env_settings import DATA_CHANGE_ENV
from .sample_skips import SkipList

__all__ = ["DataCheck", "MOVED_FROM", "saved_manifest_step", "saved_sample_skips", "PrefixRecord", "REDISTRIBUTED_FROM", "STATE_VERSION", "TOPOLOGY_KEYS", "RankState", "check_same_config", "check_saved_data"]

STATE_VERSION = 3
#: Versions this one reads (older ones are upgraded).
READABLE_VERSIONS = (1, 2, 3)
#: The first version that records the data it was saved against.
DATA_RECORD_VERSION = 3

logger = logging.getLogger("megatron_energon_lite.loader")
#: The key of a redistributed rank state (``energon-lite checkpoint redist``, ``elastic.redistribute``):
#: the saved global state it was made from; the rest of the epoch is divided when it is restored.
REDISTRIBUTED_FROM = "redistributed_from"
#: Key of a rank state made by moving saved worker states to the same global workers on another
#: topology (``elastic.moved_states``): ``{"world_size", "num_workers"}`` it was saved with.
MOVED_FROM = "moved_from"
#: The parts of a loader's configuration that an elastic restore (``elastic.py``) may change.
TOPOLOGY_KEYS = ("worker_config.rank", "worker_config.world_size", "worker_config.num_workers")


@dataclass(frozen=True)
class RankState:
    """A rank's position: each worker's pipeline state (None: the worker has not yielded yet),
    whose turn is next, and whether the loop over the loader had ended when it was saved."""

    #: ``Node.get_state()`` of each logical worker's pipeline after the last item it yielded.
    worker_states: tuple[dict | None, ...]
    #: The logical worker that yields next (restored loaders rotate workers so it goes first).
    next_worker: int
    #: Saved after the loop over the loader ended: a restored loader starts the next pass; saved
    #: right after the last item, the restored pass has nothing left (Energon's behaviour).
    pass_ended: bool
    #: The loader's configuration fingerprint (``SavableDataset.config()``).
    config: dict
    #: The data it was saved against (``Recipe.data_record()``), None when not known.
    data: list | None = None
    #: Batches the rank delivered (the step of its manifest, ``manifest.py``); only a loader
    #: with a manifest records it, so other states keep their shape.
    manifest_step: int | None = None
    #: The samples a replay skips (``sample_skips.py``); only a state with some records them.
    sample_skips: SkipList | None = None

    def to_json(self) -> dict:
        return {
            "version": STATE_VERSION,
            "writer": f"megatron-energon-lite {__version__}",
            "config": self.config,
            # No copy needed: a worker's state object is replaced, never changed, when its next
            # item arrives (and stages build a new state dict on every get_state()).
            "worker_states": list(self.worker_states),
            "next_worker": self.next_worker,
            "pass_ended": self.pass_ended,
            **({"data": self.data} if self.data is not None else {}),
            **({"manifest_step": self.manifest_step} if self.manifest_step is not None else {}),
            **({"sample_skips": self.sample_skips.to_json()} if self.sample_skips else {}),
        }

    @classmethod
    def from_json(cls, state: Any, *, config: dict, worker_config: WorkerConfig, policy: Policy = PLAIN) -> RankState:
        """Checks ``state`` against the loader that restores it (configuration and workers, under
        the loader's ``policy``); every error names the field and what was expected."""
        if not isinstance(state, dict) or state.get("version") not in READABLE_VERSIONS or "worker_states" not in state:
            found = state.get("version") if isinstance(state, dict) else type(state).__name__
            raise StateError(
                format_message(
                    "not a loader state of a version this one reads",
                    expected=f"a dict from save_state_rank() with version {' or '.join(map(str, READABLE_VERSIONS))}",
                    found=f"version {found!r}",
                    fix="restore a state saved by megatron-energon-lite",
                )
            )
        check_same_config(state.get("config", {}), config, policy=policy)
        workers = worker_config.workers_per_rank
        if not isinstance(state["worker_states"], list):
            raise invalid(("worker_states",), "a list of worker states, one per worker", state["worker_states"])
        if len(state["worker_states"]) != workers:
            raise StateError(format_message("the saved state has a different number of workers", expected=str(workers), found=str(len(state["worker_states"]))))
        states = list(state["worker_states"])
        for i, worker_state in enumerate(states):
            if worker_state is not None and not isinstance(worker_state, dict):
                raise invalid(("worker_states", i), "a pipeline state (a dict), or null for a worker that has not yielded yet", worker_state)
        if state["version"] == 1:
            states = [None if s is None else upgrade_v1_worker_state(s) for s in states]
        return cls(
            worker_states=tuple(states),
            next_worker=check_index(state.get("next_worker"), workers, "next_worker", of="workers on this rank"),
            pass_ended=check_bool(state.get("pass_ended", True), "pass_ended"),
            config=config,
            data=state.get("data"),
            manifest_step=saved_manifest_step(state),
            sample_skips=saved_sample_skips(state),
        )


def saved_manifest_step(state: Any) -> int | None:
    """The manifest step a rank state records (None: none; a redistributed state: its first
    saved rank's, as ranks deliver their batches in step)."""
    if isinstance(state, dict) and isinstance(state.get(REDISTRIBUTED_FROM), list) and state[REDISTRIBUTED_FROM]:
        state = state[REDISTRIBUTED_FROM][0]
    if not isinstance(state, dict) or state.get("manifest_step") is None:
        return None
    step = state["manifest_step"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise invalid(("manifest_step",), "the number of batches delivered (an integer >= 0)", step)
    return step


def saved_sample_skips(states: Any) -> SkipList | None:
    """The skip list of a rank state, or of every state of a list (a global state, a
    redistributed one) together; None: none."""
    if isinstance(states, dict) and isinstance(states.get(REDISTRIBUTED_FROM), list):
        states = states[REDISTRIBUTED_FROM]
    found = SkipList()
    for state in states if isinstance(states, list) else [states]:
        if isinstance(state, dict) and state.get("sample_skips") is not None:
            found = found.merged(SkipList.from_json(state["sample_skips"]))
    return found or None


#: Parts of the configuration Energon does not compare on restore: under Energon's policy a state
#: restores into a loader with another task encoder, decoder or a smaller micro batch size (logged
#: once; Energon's own redist tests change the batch size; a larger one is refused, see
#: :func:`_check_energon_batch_size`); the plain import refuses, since the restored samples or
#: batches would not be the ones the state describes.
_ENERGON_DOES_NOT_CHECK = ("task_encoder", "decoder", "batch_size")


def _check_energon_batch_size(saved: Any, now: Any, where: str | None) -> None:
    """Energon's rule for resuming with another micro batch size: only a smaller one that divides
    the saved one (the samples of a saved batch then fill whole new batches)."""
    if saved == now or (isinstance(saved, int) and isinstance(now, int) and 0 < now < saved and saved % now == 0):
        return
    if not isinstance(saved, int) or not isinstance(now, int):
        what = "cannot resume with a different batching mode (batching to non-batching or vice versa)"
    elif now > saved:
        what = f"Resuming with larger micro batch size is not allowed: {now} > {saved}"
    else:
        what = f"Resuming with smaller micro batch size only allowed if the old micro batch size is a multiple of the new one: {now} < {saved}"
    raise StateError(
        format_message(
            what,
            where=where,
            expected=f"batch_size {saved!r} or a divisor of it (as Energon)",
            found=f"batch_size {now!r}",
            fix=f"build the loader with batch_size={saved!r} or a divisor of it",
        )
    )


def check_same_config(saved: Any, current: dict, *, ignore: tuple[str, ...] = (), where: str | None = None, policy: Policy = PLAIN) -> None:
    """Refuses a state saved by a loader of another configuration, listing every difference
    ("saved X, now Y"); keys in ``ignore`` may differ, and under Energon's ``policy`` those
    Energon does not compare."""
    saved = saved if isinstance(saved, dict) else {}
    keys = sorted((set(saved) | set(current)) - set(ignore))
    differences = [(k, saved.get(k, "<missing>"), current.get(k, "<missing>")) for k in keys if saved.get(k, "<missing>") != current.get(k, "<missing>")]
    allowed = [k for k, _, _ in differences if k in _ENERGON_DOES_NOT_CHECK]
    if allowed and policy.as_energon:
        if "batch_size" in allowed:
            _check_energon_batch_size(saved.get("batch_size"), current.get("batch_size"), where)
        log_once(f"restore-other-{'-'.join(allowed)}", "restoring a state saved with another %s, as Energon does (import megatron_energon_lite.as_energon)", " and ".join(allowed))
        differences = [d for d in differences if d[0] not in _ENERGON_DOES_NOT_CHECK]
    if differences:
        lines = "\n".join(f"    {k}: saved {a!r}, now {b!r}" for k, a, b in differences)
        only_topology = {k for k, _, _ in differences} <= set(TOPOLOGY_KEYS)
        raise StateError(
            format_message(
                "the saved state belongs to a different loader configuration",
                where=where,
                found="\n" + lines,
                fix="this state was saved on another topology: pass every rank's state to restore_state_global() "
                "(the list save_state_global() returns) to resume on this one"
                if only_topology
                else "build the loader with the saved values",
            )
        )


#: ``prefix_record(k, n)``: the data record of dataset ``k`` as its first ``n`` shards.
PrefixRecord = Callable[[int, int], dict]


@dataclass(frozen=True)
class DataCheck:
    """How the data a state was saved against differs from the loader's."""

    #: Datasets that only grew by appended shards: ``{dataset index: saved shard count}``.
    grown: dict[int, int] = field(default_factory=dict)
    #: Datasets that changed otherwise (only with ``allow_change``; else that is refused).
    changed: frozenset[int] = frozenset()

    def merged(self, other: DataCheck) -> DataCheck:
        return DataCheck({**self.grown, **other.grown}, self.changed | other.changed)


def check_saved_data(
    state: Any, current: list | None, config: dict, *, where: str = "the state", prefix_record: PrefixRecord | None = None, allow_change: bool = False
) -> DataCheck:
    """Refuses a state saved against other data than the loader reads now: shards removed,
    resized or reordered, or other sample excludes (a re-prepared dataset), which would repeat
    and lose samples silently, unless ``allow_change`` (``allow_data_change``: such datasets
    are returned as ``changed``, for ``loader/changed_data.py``).  Returns the datasets that
    only grew by appended shards (every saved shard unchanged, in its place, with its excludes:
    ``prefix_record`` tells) as ``grown``, ``{dataset index: saved shard count}``; their
    running epoch can finish on the saved shards (``loader/grown.py``).  A redistributed state
    is checked through the states it holds.  A state of a version before
    :data:`DATA_RECORD_VERSION` is restored unchecked (a note says so).  A state of another
    configuration (``config``: the loader's) is left to :func:`check_same_config`, which names
    what differs (another window length changes the sample counts too)."""
    if current is None or not isinstance(state, dict):
        return DataCheck()
    if isinstance(state.get(REDISTRIBUTED_FROM), list):
        found = DataCheck()
        for rank, saved in enumerate(state[REDISTRIBUTED_FROM]):
            found = found.merged(check_saved_data(saved, current, config, where=f"rank {rank}'s state", prefix_record=prefix_record, allow_change=allow_change))
        return found
    free = (*TOPOLOGY_KEYS, *_ENERGON_DOES_NOT_CHECK)
    saved_config = state.get("config")
    if not isinstance(saved_config, dict) or any(saved_config.get(k, "<missing>") != config.get(k, "<missing>") for k in set(saved_config) | set(config) if k not in free):
        return DataCheck()
    saved, version = state.get("data"), state.get("version")
    if version not in READABLE_VERSIONS:
        return DataCheck()  # RankState.from_json refuses it, saying which versions it reads
    if saved is None:
        if version < DATA_RECORD_VERSION:
            logger.warning("%s was saved by a loader version that did not record its data (state version %s): "
                           "it restores, but whether the dataset changed since (shards added or re-prepared) cannot be checked", where, version)
            return DataCheck()
        raise invalid(("data",), "the data record of a version 3 state (a list, one entry per dataset)", saved)
    if not isinstance(saved, list) or len(saved) != len(current) or not all(isinstance(entry, dict) for entry in saved):
        raise invalid(("data",), f"a list of {len(current)} dataset record(s)", saved)
    grown, changed, changes = {}, set(), []
    for i, (old, new) in enumerate(zip(saved, current)):
        lines = _dataset_changes(i, old, new)
        appended = _appended_shards(i, old, new, prefix_record) if lines else None
        if appended is not None:
            grown[i] = appended
        elif lines:
            changed.add(i)
            changes += lines
    if changes and not allow_change:
        raise StateError(
            format_message(
                "the data changed since the state was saved: restoring it would repeat and lose samples",
                where=where,
                found="\n" + "\n".join(f"    {line}" for line in changes[:20]) + (f"\n    ... and {len(changes) - 20} more" if len(changes) > 20 else ""),
                fix="restore the state into the data it was saved against (the same shards, the same prepare); "
                "shards appended after the saved ones are fine (the running epoch finishes on the saved shards); "
                "for data that changed otherwise on purpose, restore with allow_data_change=True (restore_state_rank / restore_state_global) "
                f"or set {DATA_CHANGE_ENV}=1 to continue by shard (the saved epoch's undelivered samples of shards unchanged by name and "
                "sample count are delivered, those of changed or removed shards are counted and logged), or start its epoch anew without this state",
            )
        )
    return DataCheck(grown, frozenset(changed))


def _appended_shards(i: int, old: dict, new: dict, prefix_record: PrefixRecord | None) -> int | None:
    """The saved shard count of dataset ``i`` when it only grew by shards appended after the
    saved ones (the saved shards unchanged: names, counts, excludes), else None."""
    before, after = old.get("shard_counts"), new.get("shard_counts")
    if prefix_record is None or not isinstance(before, list) or after is None or not 0 < len(before) < len(after):
        return None
    if [[str(n), c] for n, c in (e if isinstance(e, list) and len(e) == 2 else (None, None) for e in before)] != [[str(n), c] for n, c in after[: len(before)]]:
        return None
    prefix = prefix_record(i, len(before))
    return len(before) if prefix["digest"] == old.get("digest") and prefix["samples"] == old.get("samples") else None


def _dataset_changes(i: int, old: dict, new: dict) -> list[str]:
    """Lines describing how dataset ``i``'s data differs from its record (none: unchanged)."""
    if old.get("digest") == new["digest"] and old.get("samples") == new["samples"]:
        return []
    name = f"dataset {i} ({new['path']}, split {new['split_part']})"
    lines = []
    before, after = old.get("shard_counts"), new.get("shard_counts")
    if isinstance(before, list) and after is not None and all(isinstance(e, list) and len(e) == 2 for e in before):
        was, now = {str(n): c for n, c in before}, dict(after)
        lines += [f"{name}: shard {n}: {was[n]} samples then, {now[n]} now" for n in now if n in was and was[n] != now[n]]
        lines += [f"{name}: shard {n} new ({now[n]} samples)" for n in now if n not in was]
        lines += [f"{name}: shard {n} gone ({was[n]} samples)" for n in was if n not in now]
        if not lines and list(was) != [n for n in now if n in was]:
            lines.append(f"{name}: the shards are in another order")
    lines.append(f"{name}: {old.get('shards')!r} shards, {old.get('samples')!r} samples (digest {old.get('digest')!r}) when saved; now {new['shards']} shards, {new['samples']} samples (digest {new['digest']})")
    return lines
