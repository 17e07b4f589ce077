"""Data that changed between save and restore, continued on the user's opt-in.

Two opt-ins of ``restore_state_rank`` / ``restore_state_global`` (each also an environment
variable, for code that cannot pass it):

* ``join_new_shards`` (``ENERGON_LITE_JOIN_NEW_SHARDS=1``): shards appended since the save join
  the running epoch instead of the next one.
* ``allow_data_change`` (``ENERGON_LITE_ALLOW_DATA_CHANGE=1``): shards changed, removed or moved
  since the save are continued by shard instead of refused.

Both take the rest of the running epoch the way an elastic restore does (``elastic.py``): each
saved worker's pipeline is built over the data as the state recorded it (shard names and sample
counts, ``format/resolved.as_recorded``), restored, and asked what it had not delivered (the
unread part of its slices and the samples waiting in its buffers); that is pooled, mapped onto
the shards as they are now, and divided over the workers, which read their part first.

What "still exists" means is what the state can tell: its data record lists each shard's name
and sample count (for up to ``RECORDED_SHARDS`` shards), not its sample keys.  A shard of the
same name and sample count is taken to hold the same samples at the same offsets: its
undelivered samples are delivered (at its new place, if the shards moved).  A shard whose count
changed, or that is gone, cannot be matched sample by sample: its undelivered samples are
counted, not delivered, and named in one log line; its new samples join from the next epoch.
Samples excluded by the current ``split.yaml`` are skipped when read, as always.

With ``join_new_shards`` the samples of shards that are new by name are divided evenly over the
global workers and each worker reads its part within the running epoch, mixed with its part of
the rest at places drawn from (seed offset, worker, dataset, epoch).  A save after such a
restore records the carried ranges, so it restores exactly.

One rank's state (``restore_state_rank`` of a run of several ranks) keeps that rank's rest on
that rank; the new shards' samples are still divided over all ranks.  An exact blend's (or a
weight schedule's) global position needs every rank's state: restore with
``restore_state_global`` there.  Refused, saying why: ``blend_epochized``, a pipeline the task
encoder composes itself, a dataset that is not a prepared folder (a JSONL file, a join, a
``.bin/.idx`` prefix: no shard names) or whose record lists no shards (more than
``RECORDED_SHARDS``), and a packing buffer caught open when a saved shard changed or vanished
(its replay from an earlier position would read them; with shards only appended or moved it
is carried over like any buffer).
"""

from __future__ import annotations

import bisect
import functools
import logging
import math
from collections import Counter
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Sequence

from ..errors import NotSupportedError, StateError, format_message
from ..format.resolved import RECORDED_SHARDS, as_recorded
from ..pipeline.node import Remainder
from ..pipeline.pack import holds_open_pack
from ..pipeline.state_check import invalid
from ..policy import PLAIN, Policy
from ..rng import rng_for
from ..worker import WorkerConfig
from .dataset import PipelineDataset
from .elastic import Topology, carried_rank_state, merge_ranges, saved_remainder, schedule_rates, share_pooled, share_remainder, topology_of
from .grown import cannot_carry, pipeline_of, with_datasets
from .rank_state import REDISTRIBUTED_FROM, TOPOLOGY_KEYS, RankState, check_same_config

__all__ = ["ShardMap", "continued_rank_state"]

logger = logging.getLogger("megatron_energon_lite.loader")

#: A worker's part of the rest and of the new shards is mixed in at most about this many pieces
#: each (the pieces are in the state: it stays small).
_PIECES = 256


@dataclass(frozen=True)
class ShardMap:
    """One dataset's shards as a state recorded them and as they are now."""

    saved_names: list[str]
    saved_counts: list[int]
    names: list[str]
    counts: list[int]

    @functools.cached_property
    def saved_starts(self) -> list[int]:
        return list(accumulate(self.saved_counts, initial=0))

    @functools.cached_property
    def now(self) -> dict[str, tuple[int, int]]:
        """Each shard there now: its first split index and its sample count."""
        return {name: (start, count) for name, start, count in zip(self.names, accumulate(self.counts, initial=0), self.counts)}

    def moved(self, ranges: Sequence[tuple[int, int]]) -> tuple[list[tuple[int, int]], Counter]:
        """``ranges`` of saved split indices at their place now; the samples of saved shards
        not kept, counted per saved shard."""
        starts, now = self.saved_starts, self.now
        out: list[tuple[int, int]] = []
        lost: Counter = Counter()
        for start, end in ranges:
            i = bisect.bisect_right(starts, start) - 1
            while start < end and i < len(self.saved_names):
                stop = min(end, starts[i + 1])
                if stop > start:
                    where = now.get(self.saved_names[i])
                    if where is not None and where[1] == self.saved_counts[i]:
                        out.append((where[0] + start - starts[i], where[0] + stop - starts[i]))
                    else:
                        lost[i] += stop - start
                start = stop
                i += 1
        return merge_ranges(out), lost

    @property
    def all_kept(self) -> bool:
        """Every saved shard is still there with its sample count (the data only moved or grew)."""
        return all(self.now.get(name, (0, -1))[1] == count for name, count in zip(self.saved_names, self.saved_counts))

    def new_ranges(self) -> list[tuple[int, int]]:
        """The split index ranges of the shards new by name."""
        saved = set(self.saved_names)
        return [(start, start + count) for name, (start, count) in self.now.items() if name not in saved and count]

    def why_lost(self, i: int) -> str:
        name = self.saved_names[i]
        if name not in self.now:
            return f"shard {name} gone"
        return f"shard {name}: {self.saved_counts[i]} samples then, {self.now[name][1]} now"


def _shard_list(record: Any, k: int, what: str) -> tuple[list[str], list[int]]:
    entries = record.get("shard_counts") if isinstance(record, dict) else None
    if entries is None:
        raise NotSupportedError(
            format_message(
                f"dataset {k}'s {what} data record lists no shards (a dataset of more than {RECORDED_SHARDS} shards): which samples still exist cannot be told",
                fix="restore into the data the state was saved with, or start the epoch anew without this state",
            )
        )
    if not isinstance(entries, list) or not all(isinstance(e, list) and len(e) == 2 and isinstance(e[0], str) and isinstance(e[1], int) and not isinstance(e[1], bool) and e[1] >= 0 for e in entries):
        raise invalid(("data", k, "shard_counts"), "a list of [shard name, sample count]", entries)
    if sum(e[1] for e in entries) != record.get("samples"):
        raise invalid(("data", k, "shard_counts"), f"shard counts summing to the record's samples ({record.get('samples')!r})", entries)
    return [e[0] for e in entries], [e[1] for e in entries]


def _shard_maps(saved: list, current: list, dataset: PipelineDataset) -> dict[int, ShardMap]:
    """Per dataset whose data differs from its record, how its shards moved."""
    maps = {}
    for k, (old, new) in enumerate(zip(saved, current)):
        if old.get("digest") == new["digest"] and old.get("samples") == new["samples"]:
            continue
        if dataset.spec.datasets[k].split is None:
            raise NotSupportedError(
                format_message(
                    f"dataset {k} ({new['path']}) changed since the state was saved and is not a prepared folder (a JSONL file, a join or a .bin/.idx prefix): it has no named shards to continue by",
                    fix="restore into the data the state was saved with, or start the epoch anew without this state",
                )
            )
        maps[k] = ShardMap(*_shard_list(old, k, "saved"), *_shard_list(new, k, "current"))
    return maps


def continued_rank_state(states: Sequence[Any], dataset: Any, worker_config: WorkerConfig, policy: Policy = PLAIN, *, join: bool) -> RankState:
    """This rank's state continuing ``states`` (every rank's, or this rank's alone; a
    redistributed state: the states it holds) over the data as it is now: the rest of the
    running epoch on the shards still there, and with ``join`` the new shards' samples too."""
    states = list(states)
    if len(states) == 1 and isinstance(states[0], dict) and isinstance(states[0].get(REDISTRIBUTED_FROM), list):
        states = list(states[0][REDISTRIBUTED_FROM])
    pipeline = pipeline_of(dataset)
    if pipeline is None:
        raise NotSupportedError(format_message("data that changed since the save can be continued only by a loader of get_train_dataset / get_val_dataset", fix="restore into the data the state was saved with"))
    why = cannot_carry(pipeline)
    if why is not None:
        raise NotSupportedError(format_message(f"the data changed since the state was saved, and this loader cannot carry its running epoch over: {why}", fix="restore into the data the state was saved with, or start the epoch anew without this state"))
    wc, current = worker_config, pipeline.config()
    saved_config = states[0].get("config", {}) if isinstance(states[0], dict) else {}
    whole = len(states) > 1 or saved_config.get("worker_config.world_size") == 1
    if whole:
        topology, first_rank = topology_of(states), 0
        for rank, state in enumerate(states):
            check_same_config(state.get("config", {}), current, ignore=TOPOLOGY_KEYS, where=f"rank {rank}'s state", policy=policy)
    else:
        check_same_config(saved_config, current, policy=policy)  # the same rank of the same topology
        topology, first_rank = Topology(wc.world_size, wc.num_workers), wc.rank
        if current.get("blend_mode") == "exact" or any(isinstance(d, dict) and "weight_schedule" in d for d in current.get("datasets") or ()):
            raise NotSupportedError(
                format_message(
                    "the data changed since the state was saved, and an exact blend (or a weight schedule) needs every rank's state to find its global position",
                    fix="restore with restore_state_global(states) (every rank's state, as save_state_global returns them)",
                )
            )
    saved_record = states[0].get("data")
    for rank, state in enumerate(states):
        if state.get("data") != saved_record:
            raise StateError(format_message("the rank states record different data", where=f"rank {rank}'s state", expected="the data record of rank 0's state (one save_state_global() call)", fix="pass the states of one save"))
    maps = _shard_maps(saved_record, pipeline.data_record(), pipeline)
    if not all(m.all_kept for m in maps.values()) and any(holds_open_pack(s) for s in states):
        raise StateError(
            format_message(
                "shards changed or vanished since the state was saved, and it was saved with a packing buffer open: the buffer "
                "replays from an earlier state of the sources, which would read samples of the shards that are no longer as saved",
                fix="restore into the data the state was saved with, or start the epoch anew without this state",
            )
        )
    spec = pipeline.spec
    saved = PipelineDataset(with_datasets(spec, [as_recorded(d, m.saved_names, m.saved_counts) if (m := maps.get(k)) else d for k, d in enumerate(spec.datasets)]))
    pooled, ended = saved_remainder(states, saved, topology, seed_offset=wc.seed_offset, first_rank=first_rank)
    ranges, lines = list(pooled.ranges), []
    added: list[list[tuple[int, int]]] = [[] for _ in ranges]
    for k, shard_map in maps.items():
        ranges[k], lost = shard_map.moved(ranges[k])
        said = [f"{shard_map.why_lost(i)}: {count} undelivered sample(s) not delivered" for i, count in sorted(lost.items())]
        if lost:
            said.append(f"{sum(lost.values())} sample(s) of the saved running epoch not delivered in all")
        new = shard_map.new_ranges()
        if new:
            said.append(f"{len(new)} new shard(s) ({sum(e - s for s, e in new)} samples) join {'the running epoch' if join and not ended else 'from the next epoch'}")
            if join and not ended:
                added[k] = new
        lines.append(f"dataset {k} ({spec.plan.leaves[k].path}, split {spec.split_part}): {', '.join(said) or 'every shard kept'}")
    mapped = Remainder(pooled.epochs, tuple(ranges), tuple([] for _ in ranges), pooled.blend)
    rates = schedule_rates(pipeline, wc, mapped) if whole else None
    per_rank = wc.workers_per_rank

    def share(remainder: Remainder, worker: int, workers: int) -> Remainder:
        own = share_pooled(remainder, worker, workers, rates=rates) if whole else share_pooled(remainder, worker - wc.rank * per_rank, per_rank)
        new = [share_remainder(more, worker, workers, weights=None if rates is None else [r[k] for r in rates]) for k, more in enumerate(added)]
        mixed = tuple(_mixed(rest, new[k], wc.seed_offset, worker, k, remainder.epochs[k], spec.max_samples_per_sequence) for k, rest in enumerate(own.ranges))
        return Remainder(own.epochs, mixed, own.waiting, own.blend)

    restored = carried_rank_state(mapped, pipeline, wc, pass_ended=ended, share=share)
    logger.info("restoring into data that changed since the save, the running epoch continued by shard: %s", "; ".join(lines))
    return restored


def _pieces(ranges: Sequence[tuple[int, int]], size: int) -> list[tuple[int, int]]:
    return [(s, min(s + size, end)) for start, end in ranges for s in range(start, end, size)]


def _mixed(rest: list[tuple[int, int]], new: list[tuple[int, int]], seed: int, worker: int, k: int, epoch: int, sequence: int | None) -> list[tuple[int, int]]:
    """``rest`` with the ``new`` ranges mixed in: both cut in pieces (of ``sequence`` samples,
    or more so that there are at most about ``_PIECES`` of each), each keeping its order, the
    places of the new ones drawn from (seed, worker, dataset, epoch)."""
    if not new:
        return rest
    size = max(sequence or 1, math.ceil(sum(e - s for s, e in rest) / _PIECES), math.ceil(sum(e - s for s, e in new) / _PIECES), 1)
    old_pieces, new_pieces = _pieces(rest, size), _pieces(new, size)
    is_new = [False] * len(old_pieces) + [True] * len(new_pieces)
    rng_for(seed, "loader.changed_data.join", worker, k, epoch).shuffle(is_new)
    old_iter, new_iter = iter(old_pieces), iter(new_pieces)
    return [next(new_iter) if flag else next(old_iter) for flag in is_new]
