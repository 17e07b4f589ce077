"""Elastic resume: the states of every rank of one topology, restored on another.

The saved run's workers each hold a position in their share of the running epoch.  What they had
not delivered yet (the unread part of their slices, and what waits in their shuffle buffers) is
collected from all of them, in global sample order, and divided over the new topology's workers
in contiguous, near-equal shares; each new worker reads its share first, then goes on with the
next epoch in the new topology's own order.  So for the running epoch every sample the saved run
had not delivered is delivered once, none it had delivered comes again.

Per dataset of a blend: each dataset's remainder is pooled and shared out on its own; samples
waiting in buffers above the blend go back to their dataset; the blend's counts and costs are
spread over the new workers and its exact schedule goes on from the global position where the
saved stream stopped, each new worker taking a share of a dataset's remainder in proportion to
how often its positions take that dataset (see :func:`pool_remainders` for the limits at epoch
boundaries).

Supported: the stages source, endless repeat, map/filter, blend by weight (any mode), shuffle
buffer, length-grouping buckets, packing buffers (the members of groups not packed yet), batch,
virtual epochs / limits, ``blend_epochized`` passes (the rest of every repetition of the running
pass).  Each stage says so by implementing the elastic protocol (``pipeline/node.py``'s
``Elastic``: ``undelivered`` / ``carry_in``); a pipeline with a stage that does not (a concatenation,
a stage of the user's own) is refused by :func:`check_elastic`, naming the stage.  Repeats of a
fixed count elsewhere (``RepeatDataset``) and a generator caught between two outputs are refused
by their stage, saying why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from .._version import __version__
from ..errors import ConfigError, NotSupportedError, StateError, format_message
from ..policy import PLAIN, Policy
from ..pipeline.blend import BlendNode
from ..pipeline.node import BlendCursor, Elastic, Node, Remainder, find_stage, samples_between, stages
from ..pipeline.passes import on_top
from ..pipeline.recipe import Recipe, passes_continue
from ..pipeline.state_check import check_count, invalid, nested
from ..worker import WorkerConfig
from .rank_state import (
    MOVED_FROM,
    REDISTRIBUTED_FROM,
    STATE_VERSION,
    TOPOLOGY_KEYS,
    RankState,
    check_same_config,
)

__all__ = [
    "Topology",
    "carried_rank_state",
    "check_elastic",
    "elastic_rank_state",
    "even_share",
    "merge_ranges",
    "moved_states",
    "pool_remainders",
    "redistribute",
    "redistributed_rank_state",
    "share_pooled",
    "saved_remainder",
    "schedule_rates",
    "share_remainder",
    "topology_of",
]


@dataclass(frozen=True)
class Topology:
    world_size: int
    num_workers: int

    def __str__(self) -> str:
        return f"{self.world_size} rank(s) x {self.num_workers} worker(s)"


def topology_of(states: Sequence[Any]) -> Topology:
    """The topology a list of saved rank states (``save_state_global``) was written by; checks
    that it holds every rank once, in order."""
    if not isinstance(states, (list, tuple)) or not states or not all(isinstance(s, dict) for s in states):
        raise StateError(format_message("not a global loader state", expected="the list save_state_global() returns, one state per rank", found=type(states).__name__))
    for rank, state in enumerate(states):
        with nested(rank):
            config = state.get("config", {})
            if not isinstance(config, dict):
                raise invalid(("config",), "the loader's configuration (an object)", config)
            check_count(config.get("worker_config.num_workers"), "config", "worker_config.num_workers")
            check_count(config.get("worker_config.world_size"), "config", "worker_config.world_size")
    worlds = {s.get("config", {}).get("worker_config.world_size") for s in states}
    workers = {s.get("config", {}).get("worker_config.num_workers") for s in states}
    ranks = [s.get("config", {}).get("worker_config.rank") for s in states]
    if len(worlds) != 1 or len(workers) != 1:
        raise StateError(format_message("the rank states come from different topologies", found=f"world sizes {sorted(map(str, worlds))}, workers per rank {sorted(map(str, workers))}", fix="pass the states of one save_state_global() call"))
    world, num_workers = worlds.pop(), workers.pop()
    if ranks != list(range(len(states))) or world != len(states):
        missing = sorted(set(range(world if isinstance(world, int) else 0)) - set(ranks))
        duplicated = sorted({r for r in ranks if ranks.count(r) > 1}, key=str)
        raise StateError(
            format_message(
                "the global state does not hold every rank once, in order",
                expected=f"{world} rank states, ranks 0..{world - 1 if isinstance(world, int) else '?'}",
                found=f"{len(states)} states with ranks {ranks}" + (f"; missing {missing}" if missing else "") + (f"; repeated {duplicated}" if duplicated else ""),
                fix="pass the whole list save_state_global() returned (or every rank's save_state_rank(), in rank order)",
            )
        )
    return Topology(world, num_workers)


def redistribute(states: Sequence[Any], world_size: int, num_workers: int) -> list[dict]:
    """Every rank's state of ``world_size`` ranks x ``num_workers`` workers, from a global state
    saved on another topology (offline: ``energon-lite checkpoint redist``).

    What each new worker takes of the rest of the running epoch depends on the dataset (shard
    sizes, buffers' samples, an exact blend's schedule), which only the training process has:
    each new rank's state is its place in the new topology and the saved global state, checked
    here (every rank once, one configuration); :meth:`restore_state_rank` of that rank divides
    the rest as :meth:`restore_state_global` would.  Saved on the same topology, the states are
    returned as they are.
    """
    saved = topology_of(states)
    for name, value, low in (("world size", world_size, 1), ("number of workers per rank", num_workers, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ConfigError(format_message(f"invalid new {name}", expected=f"an integer >= {low}", found=repr(value)))
    first = states[0].get("config", {})
    for rank, state in enumerate(states[1:], 1):
        check_same_config(state.get("config", {}), first, ignore=TOPOLOGY_KEYS, where=f"rank {rank}'s state")
    if (saved.world_size, saved.num_workers) == (world_size, num_workers):
        return [dict(state) for state in states]
    moved = moved_states(states, world_size, num_workers)
    if moved is not None:
        return moved
    return [
        {
            "version": STATE_VERSION,
            "writer": f"megatron-energon-lite {__version__}",
            "config": _config_on(first, rank, world_size, num_workers),
            REDISTRIBUTED_FROM: list(states),
        }
        for rank in range(world_size)
    ]


def _config_on(config: dict, rank: int, world_size: int, num_workers: int) -> dict:
    """A saved configuration with the place of ``rank`` in another topology."""
    return {**config, **dict(zip(TOPOLOGY_KEYS, (rank, world_size, num_workers)))}


def redistributed_rank_state(state: dict, dataset: Recipe, worker_config: WorkerConfig, policy: Policy = PLAIN) -> RankState:
    """This rank's state from a redistributed one (:func:`redistribute`), which must be for this
    rank of this topology."""
    config = state.get("config", {}) if isinstance(state.get("config"), dict) else {}
    wc = worker_config
    meant = tuple(config.get(k) for k in TOPOLOGY_KEYS)
    if meant != (wc.rank, wc.world_size, wc.num_workers):
        raise StateError(
            format_message(
                "this redistributed state is for another rank or topology",
                expected=f"rank {wc.rank} of {wc.world_size} rank(s) x {wc.num_workers} worker(s) (this loader)",
                found=f"rank {meant[0]} of {meant[1]} rank(s) x {meant[2]} worker(s)",
                fix="give each rank its own entry of `energon-lite checkpoint redist`'s output, made for this topology",
            )
        )
    return elastic_rank_state(state[REDISTRIBUTED_FROM], dataset, worker_config, policy)


def moved_states(states: Sequence[dict], world_size: int, num_workers: int) -> list[dict] | None:
    """Every rank's state of ``world_size`` ranks x ``num_workers`` workers made by moving the
    saved worker states, when the number of global workers is the same (Energon's redist); None
    where that does not apply.

    A worker's slices, seed and random draws are functions of its global id and the global
    worker count, so global worker ``g``'s state, moved as it is, goes on exactly as it would
    have: every worker's stream (this epoch and the later ones) is the uninterrupted one; only
    the order in which a rank takes its workers' batches is the new topology's.  Not moved (the
    rest of the epoch is divided instead): an endless exact blend (its positions in the global
    stream depend on ranks and workers; so does a weight schedule's clock), virtual epochs and val limits (per-rank lengths shared
    over the rank's workers), and a new rank whose workers come from saved ranks whose loops
    were in different places (one had ended, another not).
    """
    saved = topology_of(states)
    old_workers, new_workers = max(1, saved.num_workers), max(1, num_workers)
    config = states[0].get("config", {})
    if saved.world_size * old_workers != world_size * new_workers:
        return None
    if config.get("blend_kind") == "blend" and config.get("blend_mode") == "exact":
        return None
    if any(isinstance(d, dict) and "weight_schedule" in d for d in config.get("datasets") or ()):
        return None  # a schedule's clock is the global position, which depends on ranks and workers
    if config.get("virtual_epoch_length") or config.get("limit") is not None:
        return None
    parsed = []
    for rank, state in enumerate(states):
        old = WorkerConfig(rank=rank, world_size=saved.world_size, num_workers=saved.num_workers)
        parsed.append(RankState.from_json(state, config=state.get("config", {}), worker_config=old))
    moved = []
    for rank in range(world_size):
        homes = [divmod(rank * new_workers + local, old_workers) for local in range(new_workers)]
        ended = {parsed[old_rank].pass_ended for old_rank, _ in homes}
        if len(ended) > 1:
            return None
        # A saved rank's workers before its next_worker had given one batch more: start with
        # the first that had not.
        ahead = [local < parsed[old_rank].next_worker for old_rank, local in homes]
        moved.append(
            {
                **RankState(
                    worker_states=tuple(parsed[old_rank].worker_states[local] for old_rank, local in homes),
                    next_worker=ahead.index(False) if False in ahead else 0,
                    pass_ended=ended.pop(),
                    config=_config_on(config, rank, world_size, num_workers),
                    data=parsed[0].data,
                ).to_json(),
                MOVED_FROM: {"world_size": saved.world_size, "num_workers": saved.num_workers},
            }
        )
    return moved


def elastic_rank_state(states: Sequence[dict], dataset: Recipe, worker_config: WorkerConfig, policy: Policy = PLAIN) -> RankState:
    """This rank's state on ``worker_config``'s topology, from every rank's state of another one:
    the saved worker states moved (:func:`moved_states`) where the global worker count is the
    same, else the rest of the running epoch divided anew (``policy``: the loader's)."""
    saved = topology_of(states)
    current = dataset.config()
    for rank, state in enumerate(states):
        check_same_config(state.get("config", {}), current, ignore=TOPOLOGY_KEYS, where=f"rank {rank}'s state", policy=policy)
    wc = worker_config
    moved = moved_states(states, wc.world_size, wc.num_workers)
    if moved is not None:
        return RankState.from_json(moved[wc.rank], config=current, worker_config=wc, policy=policy)
    pooled, loop_ended = saved_remainder(states, dataset, saved, seed_offset=worker_config.seed_offset)
    return carried_rank_state(pooled, dataset, worker_config, pass_ended=loop_ended, rates=schedule_rates(dataset, wc, pooled))


def saved_remainder(states: Sequence[dict], saved: Recipe, topology: Topology, *, seed_offset: int, first_rank: int = 0) -> tuple[Remainder, bool]:
    """What the saved workers of ``states`` (ranks ``first_rank``, ``first_rank + 1``, ... of
    ``topology``) had not delivered of the running epoch, pooled (:func:`pool_remainders`),
    their pipelines built by ``saved`` (the dataset they were saved with); and whether every
    one's loop had ended."""
    restart = not passes_continue(saved)
    remainders: list[Remainder] = []
    loop_ended = True
    for rank, state in enumerate(states, first_rank):
        old = WorkerConfig(rank=rank, world_size=topology.world_size, num_workers=topology.num_workers, seed_offset=seed_offset)
        parsed = RankState.from_json(state, config=state.get("config", {}), worker_config=old)
        loop_ended = loop_ended and parsed.pass_ended
        old_dataset = saved.with_topology(old)
        for local, worker_state in enumerate(parsed.worker_states):
            pipeline = check_elastic(on_top(old_dataset.build_worker(local), restart=restart))
            pipeline.reset(worker_state)  # None: the worker had not yielded; all its epoch is left
            remainders.append(pipeline.undelivered())
    return pool_remainders(remainders, ended=loop_ended), loop_ended


def carried_rank_state(
    pooled: Remainder, dataset: Recipe, worker_config: WorkerConfig, *, pass_ended: bool, rates: list[list[int]] | None = None, share: Any = None
) -> RankState:
    """This rank's state whose workers read their part of ``pooled`` first (``share(pooled,
    global worker, global workers)``, by default :func:`share_pooled` with ``rates``), then
    go on in ``dataset``'s own order."""
    wc = worker_config
    restart = not passes_continue(dataset)
    new_workers = wc.world_size * wc.workers_per_rank
    worker_states = []
    for local in range(wc.workers_per_rank):
        pipeline = check_elastic(on_top(dataset.build_worker(local), restart=restart))
        pipeline.reset(None)
        worker = wc.rank * wc.workers_per_rank + local
        pipeline.carry_in(share_pooled(pooled, worker, new_workers, rates=rates) if share is None else share(pooled, worker, new_workers))
        worker_states.append(pipeline.get_state())
    return RankState(worker_states=tuple(worker_states), next_worker=0, pass_ended=pass_ended, config=dataset.config())


def check_elastic(pipeline: Node) -> Node:
    """``pipeline`` if every stage of it implements the elastic protocol (``node.Elastic``), else
    :class:`NotSupportedError` naming the first stage that does not."""
    for stage in stages(pipeline):
        if not isinstance(stage, Elastic):
            raise NotSupportedError(
                format_message(
                    f"a loader with a {stage.tag} stage ({type(stage).__qualname__}) cannot be restored on another topology: "
                    "the stage does not implement elastic resume (undelivered / carry_in of pipeline/node.py's Elastic)",
                    where="the worker pipeline's stages, top first: " + ", ".join(s.tag for s in stages(pipeline)),
                    expected="the saved number of ranks and workers",
                    fix="restore on the topology the state was saved with",
                )
            )
    return pipeline


def pool_remainders(remainders: Sequence[Remainder], *, ended: bool = False) -> Remainder:
    """Every old worker's remainder as one, per dataset, in global sample order.

    A dataset's workers may be in different epochs of it (a small dataset of a blend cycles
    faster): the oldest running epoch is finished, from the workers still in it; those ahead
    had read their share of it, and what they read of the next one is read again in the new
    topology's order.  Samples waiting in buffers are carried whatever epoch they came from
    (nothing read and not delivered is lost; at an epoch boundary a buffered sample of the next
    epoch comes once more).  ``ended``: the pass had ended everywhere, nothing is carried.

    A ``blend_epochized`` pass (remainders with ``layers``) is finished the same way: the oldest
    running pass, each repetition of it after the other, a sample as often as it is still due.
    """
    count = len(remainders[0].epochs)
    if any(len(r.epochs) != count for r in remainders):
        raise StateError(format_message("the saved workers read different numbers of datasets", found=str(sorted({len(r.epochs) for r in remainders}))))
    epochs, ranges = [], []
    for k in range(count):
        epoch = min(r.epochs[k] for r in remainders)
        running = [] if ended else [r for r in remainders if r.epochs[k] == epoch]
        waiting = [] if ended else [(i, i + 1) for r in remainders for i in r.waiting[k]]
        epochs.append(epoch)
        if remainders[0].layers is None:
            ranges.append(merge_ranges([*(piece for r in running for piece in r.ranges[k]), *waiting]))
            continue
        # Repetitions overlap: ranges are joined within one only, and never where they overlap.
        depth = max((len(r.layers[k]) for r in running), default=0)
        layers = [waiting, *([piece for r in running if j < len(r.layers[k]) for piece in r.layers[k][j]] for j in range(depth))]
        ranges.append([piece for layer in layers for piece in merge_ranges(layer, join_overlaps=False)])
    blend = None
    cursors = [r.blend for r in remainders]
    if any(c is not None for c in cursors):
        # The items waiting above the blend had been counted by it: they are blended again (their
        # costs stay counted: a cost is known only from the item, which is gone).
        put_back = [sum(len(r.waiting[k]) for r in remainders) for k in range(count)]
        # Every worker's stream began at the same global position (after an elastic restore: the
        # one it continued): counted once, then what each worker blended since.
        offset = max(c.offset for c in cursors)
        emitted = offset + sum(c.emitted for c in cursors) - sum(put_back)
        # A weight edit's schedule starts where it did, or where the new stream starts when the
        # samples put back start it earlier.
        mix_from = min(max(c.mix_from for c in cursors), emitted)
        # The furthest saved schedule cursor not past where the new stream starts (its positions
        # count from mix_from).
        behind = [c.schedule for c in cursors if c.schedule is not None and mix_from + c.schedule["position"] <= emitted]
        blend = BlendCursor(
            emitted=emitted,
            counts=tuple(sum(c.counts[k] for c in cursors) - put_back[k] for k in range(count)),
            costs=tuple(sum(c.costs[k] for c in cursors) for k in range(count)),
            schedule=max(behind, key=lambda cursor: cursor["position"], default=None),
            mix_from=mix_from,
        )
    return Remainder(tuple(epochs), tuple(ranges), tuple([] for _ in range(count)), blend)


def schedule_rates(dataset: Recipe, worker_config: WorkerConfig, pooled: Remainder) -> list[list[int]] | None:
    """Exact blends: per new global worker, how often its positions in the schedule take each
    dataset (from the global position where the saved stream stopped); None for other pipelines.

    An exact schedule fixes each position's dataset, so workers take a dataset at different
    rates, and one whose positions are a residue class modulo the period may never take it: its
    share of that dataset's remainder is in proportion to its rate (none when it never takes it).
    """
    if pooled.blend is None:
        return None
    wc = worker_config
    rates = []
    for rank in range(wc.world_size):
        other = dataset.with_topology(WorkerConfig(rank=rank, world_size=wc.world_size, num_workers=wc.num_workers, seed_offset=wc.seed_offset))
        for local in range(wc.workers_per_rank):
            blend = find_stage(other.build_worker(local), BlendNode)
            found = None if blend is None else blend.schedule_rates(pooled.blend.emitted, pooled.blend.schedule, pooled.blend.mix_from)
            if found is None:
                return None
            rates.append(found)
    # A weight schedule may give a dataset no positions over the measured window (it starts
    # later): no worker takes it there, so its rest is shared evenly.
    for k in range(len(rates[0]) if rates else 0):
        if not any(rate[k] for rate in rates):
            for rate in rates:
                rate[k] = 1
    return rates


def share_pooled(pooled: Remainder, worker: int, workers: int, *, rates: list[list[int]] | None = None) -> Remainder:
    """Global worker ``worker``'s part of the pooled remainder: a contiguous share of each
    dataset's samples (even, or in proportion to ``rates[worker][k]``, each worker's rate of
    taking dataset ``k``), and an even share of the blend's counts and costs."""
    blend = pooled.blend
    if blend is not None:
        blend = BlendCursor(
            emitted=blend.emitted,  # the global position: the same for every worker
            counts=tuple(even_share(c, worker, workers) for c in blend.counts),
            costs=tuple(even_share(c, worker, workers) for c in blend.costs),
            schedule=blend.schedule,
            mix_from=blend.mix_from,
        )
    shares = tuple(
        share_remainder(ranges, worker, workers, weights=None if rates is None else [r[k] for r in rates])
        for k, ranges in enumerate(pooled.ranges)
    )
    return Remainder(pooled.epochs, shares, tuple([] for _ in shares), blend)


def even_share(total: int, worker: int, workers: int) -> int:
    """Worker ``worker``'s part of ``total`` split as evenly as integers allow (the parts sum to it)."""
    return (worker + 1) * total // workers - worker * total // workers


def merge_ranges(ranges, *, join_overlaps: bool = True) -> list[tuple[int, int]]:
    """Sample ranges ``[start, end)`` sorted, with touching or overlapping ones joined (with
    ``join_overlaps=False`` only touching ones: a sample in two ranges stays in two)."""
    merged: list[list[int]] = []
    for start, end in sorted(ranges):
        if end <= start:
            continue
        if merged and (start <= merged[-1][1] if join_overlaps else start == merged[-1][1]):
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


def share_remainder(ranges: list[tuple[int, int]], worker: int, workers: int, *, weights: Sequence[int] | None = None) -> list[tuple[int, int]]:
    """Global worker ``worker``'s contiguous share of the samples in ``ranges``: the samples are
    counted in order and worker ``g`` of ``n`` takes positions ``[g * total // n, (g + 1) * total // n)``,
    or, with ``weights`` (one per worker), a part in proportion to its weight."""
    total = sum(end - start for start, end in ranges)
    if weights is None:
        first, last = worker * total // workers, (worker + 1) * total // workers
    else:
        before, whole = sum(weights[:worker]), sum(weights)
        first, last = before * total // whole, (before + weights[worker]) * total // whole
    return samples_between(ranges, first, last)
