"""BlendNode: mixes several sources by weight, in one of two modes.

``random`` (Energon's behaviour): each item's source is drawn with probability proportional to its
weight, from draw ``n`` of a counter-based stream, so a state only needs the draw counter.  The
draws are stratified (:class:`~megatron_energon_lite.rng.StratifiedUniformStream`): each draw
keeps its probabilities, but the counts per source stay within a few items of the weights
instead of drifting as independent draws do.

``cost``: weights share a per-sample cost (tokens, say) instead of samples: each item comes from
the source furthest behind ``weight x total cost so far`` (deterministic, per worker), so each
source's cost share stays within about one sample's cost of its weight.

``exact``: the source of each item is read from :class:`ExactSchedule`, a deterministic schedule
over positions ``0, 1, 2, ...`` of a stream whose per-source counts stay within one item of
``weight * position`` at every prefix.  With ``position`` mapping this worker's ``n``-th item to
its place in the global stream (all ranks and workers; see ``build.py``), the whole training
stream holds the weights within one sample at every step, not only each worker's share.

Weight schedules (``format/weight_schedule.py``): the weights at each item are those at its
global position (``clock``, derived from ``emitted`` and ``offset``, so saved with them); exact
mode then uses :class:`ScheduledExactSchedule` (no period: a worker walks every global position,
a stretch of constant shares at a time).

A source that ends is exhausted: its weight drops to 0 and the others go on; the blend ends when
all are exhausted.  ``start_epoch`` starts every source's next epoch (``blend_epochized`` with
``repeat=True``).

Restore keys: ``("Blend", source_index)`` prepended to the item's key.

State keys:
    ``stage``: ``"Blend"``.
    ``emitted``: items yielded in this epoch (the next item is number ``emitted``).
    ``draws``: random draws used in this epoch (random mode).
    ``counts``: items yielded per source since the start (all epochs; for blend reports).
    ``costs``: summed cost of those items per source (cost mode; zeros otherwise).
    ``exhausted``: per source, whether it ended in this epoch.
    ``epoch``: the epoch (``start_epoch`` calls so far).
    ``schedule``: the exact schedule's cursor (exact mode; with weight schedules it has each
    source's ``lag`` too), else ``None``.
    ``sources``: the sources' states.
    ``offset`` (only after an elastic restore): the global position where the saved topology's
    stream stopped; this worker's items continue the exact schedule from there.
    ``pass_weights`` (exact mode, only in a ``blend_epochized`` pass carried in by an elastic
    restore): the schedule's weights for that pass, the samples carried of each dataset.
    ``mix_from`` (exact mode, only after a weight edit at resume, ``loader/reweight.py``): the
    global position where the schedule of the current weights starts; ``schedule`` counts from it.

Elastic resume (``undelivered`` / ``carry_in``): each dataset's remainder goes to its source, and
the items and costs counted so far are spread over the new workers, so ``counts`` summed over
all workers, and the exact schedule's global stream, go on as if the topology had not changed.
A ``blend_epochized`` blend gives the rest of its pass, every repetition of every dataset
(``RepeatNode.pass_remainder``); a new worker's carried pass mixes what it carried of each
dataset (in exact mode by those amounts), then its own passes follow.
"""

from __future__ import annotations

import bisect
import math
import operator
from fractions import Fraction
from functools import lru_cache
from itertools import accumulate
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import (
    ConfigError,
    DatasetError,
    NotSupportedError,
    StateError,
    format_message,
)
from ..format.weight_schedule import ScheduledWeights
from ..rng import StratifiedUniformStream, UniformStream
from .load import BLEND_TAG
from .node import (
    BlendCursor,
    Elastic,
    ForwardsEpochs,
    Node,
    Remainder,
    State,
    as_key,
    get_restore_key,
    set_restore_key,
    tagged_key_problem,
)
from .state_check import (
    check_bool,
    check_count,
    check_list,
    check_stage,
    invalid,
    nested,
    state_path,
)

__all__ = ["TABLE_LIMIT", "BlendNode", "ExactSchedule", "ScheduledExactSchedule", "blended_costs", "consumed_counts", "integer_weights"]

#: Periods up to this length are tabulated once, so a jump to any position costs O(sources).
TABLE_LIMIT = 1 << 16
#: Positions an untabulated schedule walks to measure a worker's rates (elastic resume).
RATE_WINDOW = 1 << 17


def integer_weights(weights: Sequence[Fraction | float | int]) -> list[int]:
    """Exact integer weights with the same ratios (floats are read as the decimal they print as)."""
    fractions = [w if isinstance(w, Fraction) else Fraction(repr(float(w))) for w in weights]
    scale = math.lcm(*(f.denominator for f in fractions))
    return [int(f * scale) for f in fractions]


class ExactSchedule:
    """Which source takes each position of a stream, with counts within one of the weights.

    Tijdeman's solution of the chairman assignment problem: at position ``p`` (time ``n = p + 1``)
    the candidates are the sources with ``w_i * n - c_i >= d`` (``d = 1 / (2K - 2)``, ``K`` sources,
    ``c_i`` the count so far) and the one whose next deadline ``(c_i + 1 - d) / w_i`` comes first
    wins (ties: the lowest index).  This keeps ``|c_i - w_i * n| <= 1 - d < 1`` for every source
    at every ``n`` (Megatron-LM's greedy rule reaches 1.5).  Integer weights make every comparison
    exact.  The schedule repeats with period ``sum(weights)``; periods up to 65,536 are tabulated.

    The cursor (next position and the counts before it) is the only state; positions must be
    visited in increasing order.
    """

    def __init__(self, weights: Sequence[int]) -> None:
        self.weights = [int(w) for w in weights]
        if not self.weights or any(w < 0 for w in self.weights) or sum(self.weights) == 0:
            raise ConfigError(format_message("invalid exact blend weights", expected="non-negative integers, at least one positive", found=repr(weights)))
        self.period = sum(self.weights)
        self._scale = 2 * len(self.weights) - 2
        self._table: list[int] | None = None
        self._prefix: np.ndarray | None = None
        if self.period <= TABLE_LIMIT:
            self._table, self._prefix = _tabulated(tuple(self.weights))
        self.reset()

    def reset(self, state: dict | None = None) -> None:
        if state is None:
            self.position, self._counts = 0, [0] * len(self.weights)
            return
        if not isinstance(state, dict) or "position" not in state or "counts" not in state:
            raise invalid((), "the exact schedule's cursor: {\"position\": int, \"counts\": [int, ...]}", state, stage="Blend schedule")
        position = check_count(state["position"], "position", stage="Blend schedule")
        counts = check_list(state["counts"], "counts", stage="Blend schedule", length=len(self.weights), of="counts, one per dataset")
        counts = [check_count(c, "counts", i, stage="Blend schedule", high=position) for i, c in enumerate(counts)]
        if sum(counts) != position:
            raise invalid(("counts",), f"counts that add up to the position ({position})", counts, stage="Blend schedule")
        self.position, self._counts = position, counts

    @property
    def counts(self) -> list[int]:
        """How often each source was scheduled before the cursor."""
        if self._table is None:
            return list(self._counts)
        cycles, offset = divmod(self.position, self.period)
        return [int(c) + cycles * w for c, w in zip(self._prefix[offset], self.weights)]

    def get_state(self) -> dict:
        return {"position": self.position, "counts": self.counts}

    def _step(self, position: int, counts: list[int]) -> int:
        """The source at ``position`` given the counts before it (no table)."""
        return _step(self.weights, self.period, self._scale, position, counts)

    def rates(self, first: int, bases: Sequence[int], stride: int, *, start: dict | None = None) -> list[int]:
        """How often the positions ``first + base + k * stride`` (each of ``bases``, ``k = 0, 1,
        ...``) take each source: a worker's rates (elastic resume).

        Tabulated: over ``k < period``, exactly and in O(period) once per stride: those
        positions modulo the period are the residue class of ``first + base`` modulo
        ``g = gcd(stride, period)``, each of its positions ``g`` times.  Otherwise over the window
        ``k < RATE_WINDOW // stride`` (``0 <= base < stride``), walked once from the cursor
        ``start`` (not past ``first``; None: the beginning) and shared by every worker.
        """
        weights = tuple(self.weights)
        if self._table is not None:
            g = math.gcd(stride, self.period)
            by_residue = _residue_counts(weights, g)
            return [int(n) * g for n in sum(by_residue[(first + base) % g] for base in bases)]
        steps = max(1, RATE_WINDOW // stride)
        begin = (0, (0,) * len(weights)) if start is None else (start["position"], tuple(start["counts"]))
        window = _window_sources(weights, begin, first, steps * stride)
        taken = np.concatenate([window[base::stride] for base in bases])
        return np.bincount(taken, minlength=len(weights)).tolist()

    def source_at(self, position: int) -> int:
        """The source of ``position`` (>= the cursor); moves the cursor past it."""
        if position < self.position:
            raise StateError(format_message("exact blend schedule asked for a past position", expected=f">= {self.position}", found=str(position)))
        if self._table is not None:
            # A lookup: the schedule repeats with its period; counts are derived when asked.
            self.position = position + 1
            return self._table[position % self.period]
        counts = self._counts
        for p in range(self.position, position):
            counts[self._step(p, counts)] += 1
        source = self._step(position, counts)
        counts[source] += 1
        self.position = position + 1
        return source


def _step(weights: Sequence[int], period: int, scale: int, position: int, counts: list[int]) -> int:
    """The source at ``position`` given the counts before it (:class:`ExactSchedule`'s rule)."""
    if len(weights) == 1:
        return 0
    n = position + 1
    best, best_num, best_den = -1, 0, 1
    for i, w in enumerate(weights):
        # Eligible: (w_i * n - c_i * period) / period >= 1 / scale, in integers.
        if w == 0 or (w * n - counts[i] * period) * scale < period:
            continue
        num = (counts[i] + 1) * scale - 1  # deadline ~ num / w_i
        if best < 0 or num * best_den < best_num * w:
            best, best_num, best_den = i, num, w
    return best


@lru_cache(maxsize=8)
def _tabulated(weights: tuple[int, ...]) -> tuple[list[int], np.ndarray]:
    """One period of the schedule (a source per position) and the counts before each position;
    made once per process for each weights (every worker's pipeline has the same), never
    written to."""
    period, scale = sum(weights), 2 * len(weights) - 2
    counts = [0] * len(weights)
    table = []
    prefix = np.zeros((period + 1, len(weights)), dtype=np.int64)
    for p in range(period):
        i = _step(weights, period, scale, p, counts)
        table.append(i)
        counts[i] += 1
        prefix[p + 1] = counts
    return table, prefix


@lru_cache(maxsize=8)
def _residue_counts(weights: tuple[int, ...], modulus: int) -> np.ndarray:
    """``counts[r, i]``: the positions ``p ≡ r (mod modulus)`` of one period that source ``i``
    takes (``modulus`` divides the period)."""
    table = np.asarray(_tabulated(weights)[0], dtype=np.int64)
    residues = np.arange(len(table)) % modulus
    return np.bincount(residues * len(weights) + table, minlength=modulus * len(weights)).reshape(modulus, len(weights))


@lru_cache(maxsize=4)
def _window_sources(weights: tuple[int, ...], start: tuple[int, tuple[int, ...]], first: int, length: int) -> np.ndarray:
    """The sources of positions ``[first, first + length)`` of an untabulated schedule, walked
    from the cursor ``start`` (position, counts)."""
    schedule = ExactSchedule(list(weights))
    schedule.reset({"position": start[0], "counts": list(start[1])})
    return np.fromiter((schedule.source_at(p) for p in range(first, first + length)), dtype=np.int64, count=length)


#: Spans (schedule point to point) a scheduled exact schedule looks ahead for a deadline.
LOOKAHEAD_SPANS = 256
#: Positions a scheduled exact schedule walks to measure a worker's rates (elastic resume).
SCHEDULED_RATE_WINDOW = 1 << 14


class _ShiftedWeights:
    """:class:`ScheduledWeights` read ``origin`` positions later (a schedule whose cursor
    counts from a weight edit at resume, over weights that follow the global clock)."""

    def __init__(self, weights: ScheduledWeights, origin: int) -> None:
        self._weights, self._origin = weights, origin

    def at(self, position: int) -> list[float]:
        return self._weights.at(position + self._origin)

    def next_point(self, position: int) -> float:
        return self._weights.next_point(position + self._origin) - self._origin

    def holds_until(self, position: int) -> float:
        return self._weights.holds_until(position + self._origin) - self._origin


#: Lookahead spans a scheduled exact schedule keeps (shares and end, by start) before it forgets them.
SPAN_MEMO = 1 << 12


class ScheduledExactSchedule:
    """:class:`ExactSchedule` for weights that change with the position (``weight:`` schedules).

    Each source's target is the running sum of its share (its weight at the position over the
    level's total), ``lag`` its target minus its count.  At position ``p`` the candidates are the
    sources whose lag including ``p``'s share is at least ``d = 1 / (2K - 2)`` and the one whose
    deadline (the position where its lag reaches ``1 - d``) comes first wins (ties: the lowest
    index): Tijdeman's rule, whose bound (below one sample) he proved for shares that change
    too.  Deadlines are looked up span by span between schedule points (:meth:`_deadline`), so
    inside a linear or cosine ramp they are estimates: the bound is measured there, not proven
    (a hypothesis property in ``tests/pipeline/test_blend.py``; worst seen 0.93).  There is no
    period: a worker walks every global position up to its own, a stretch of constant shares
    at a time (:meth:`_walk`: the shares, and the spans deadlines look across, are computed once
    per stretch, not per position).

    Cursor (the state): the next position, the counts before it and each source's lag (floats;
    JSON keeps them exact).
    """

    period = None

    def __init__(self, weights: Sequence[float], schedules: Sequence[Any], *, origin: int = 0) -> None:
        self.weights = [float(w) for w in weights]
        self.schedules = list(schedules)
        #: The global position of this schedule's position 0 (not 0 after a weight edit at
        #: resume): the weights are looked up at ``origin + position``.
        self.origin = origin
        self._weights_at = _ShiftedWeights(ScheduledWeights(self.weights, self.schedules), origin)
        self._ahead = _ShiftedWeights(ScheduledWeights(self.weights, self.schedules), origin)  # for deadlines (its own cache)
        self._threshold = 1 / (2 * len(self.weights) - 2) if len(self.weights) > 1 else 0.0
        # The stretch of the cursor: [start, stop) where the shares hold, the shares, the next point.
        self._stretch: tuple[int, float, list[float], float] = (0, 0, [], math.inf)
        # Spans by their start: the shares, the next point and where the shares may change
        # (functions of the clock), kept for the deadlines of later positions and the walk.
        self._spans: dict[int, tuple[list[float], float, float]] = {}
        self.reset()

    def shares(self, position: int) -> list[float]:
        values = self._weights_at.at(position)
        total = sum(values)
        return [v / total for v in values]

    def reset(self, state: dict | None = None) -> None:
        n = len(self.weights)
        if state is None:
            self.position, self._counts, self._lag = 0, [0] * n, [0.0] * n
            return
        if not isinstance(state, dict) or not {"position", "counts", "lag"} <= set(state):
            raise invalid((), 'the scheduled exact cursor: {"position": int, "counts": [int, ...], "lag": [float, ...]}', state, stage="Blend schedule")
        position = check_count(state["position"], "position", stage="Blend schedule")
        counts = check_list(state["counts"], "counts", stage="Blend schedule", length=n, of="counts, one per dataset")
        counts = [check_count(c, "counts", i, stage="Blend schedule", high=position) for i, c in enumerate(counts)]
        lag = check_list(state["lag"], "lag", stage="Blend schedule", length=n, of="lags, one per dataset")
        for i, value in enumerate(lag):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or abs(value) > n:
                raise invalid(("lag", i), f"a finite number within {n} of 0", value, stage="Blend schedule")
        if sum(counts) != position:
            raise invalid(("counts",), f"counts that add up to the position ({position})", counts, stage="Blend schedule")
        self.position, self._counts, self._lag = position, counts, [float(v) for v in lag]

    @property
    def counts(self) -> list[int]:
        return list(self._counts)

    def get_state(self) -> dict:
        return {"position": self.position, "counts": self.counts, "lag": list(self._lag)}

    def _span(self, at: int) -> tuple[list[float], float, float]:
        """The shares at ``at``, the next point after it and the first position where the shares
        may differ (kept: deadlines at many positions look across the same spans)."""
        span = self._spans.get(at)
        if span is None:
            if len(self._spans) >= SPAN_MEMO:
                self._spans.clear()
            values = self._ahead.at(at)
            total = sum(values)
            span = self._spans[at] = ([v / total for v in values], self._ahead.next_point(at), self._ahead.holds_until(at))
        return span

    def _deadline(self, source: int, lag: float, position: int) -> float:
        """The position at which ``source``'s lag (``lag`` after ``position``) reaches ``1 - d``:
        walked ahead span by span, a span running from one schedule point to the next at the
        share it starts with (exact across steps; inside a linear or cosine ramp, the share at
        its start stands for the ramp)."""
        need, start = 1 - self._threshold - lag, position + 1
        if need <= 0:
            return position + need
        # The first span is the current position's while no point lies at start.
        at = position if self._span(position)[1] > start else start
        for _ in range(LOOKAHEAD_SPANS):
            shares, end, _ = self._span(at)
            share = shares[source]
            if share > 0 and need <= share * (end - start):
                return start - 1 + need / share
            if end == math.inf:
                return math.inf
            need -= share * (end - start)
            start = at = int(end)
        return math.inf

    def _stretch_of(self, position: int) -> tuple[int, float, list[float], float]:
        """The stretch of constant shares holding ``position``: (start, stop, shares, next point)."""
        stretch = self._stretch
        if not stretch[0] <= position < stretch[1]:
            shares, next_point, stop = self._span(position)
            stretch = self._stretch = (position, stop, shares, next_point)
        return stretch

    def _walk(self, last: int) -> int:
        """Steps the cursor past ``last`` (>= the cursor); returns the source of ``last``."""
        lag, counts, position = self._lag, self._counts, self.position
        threshold, keep = self._threshold, 1 - self._threshold
        best = 0
        while position <= last:
            _, stop, shares, next_point = self._stretch_of(position)
            for position in range(position, int(min(stop, last + 1))):
                lag = list(map(operator.add, lag, shares))
                if len(lag) > 1:
                    best, best_deadline = -1, math.inf
                    # The shares hold until the next point: a deadline before it is one division
                    # (what _deadline's first span computes, without its lookups).
                    constant_for = next_point - position - 1
                    for i, g in enumerate(lag):
                        if g < threshold:
                            continue
                        need, s = keep - g, shares[i]
                        if need <= 0:
                            deadline = position + need
                        elif s > 0 and need <= s * constant_for:
                            deadline = position + need / s
                        else:
                            deadline = self._deadline(i, g, position)
                        if best < 0 or deadline < best_deadline:
                            best, best_deadline = i, deadline
                    if best < 0:
                        # Lags that add up to just under one (rounding; two datasets have d = 1/2)
                        # can leave no candidate: the last dataset takes the position.
                        best = len(lag) - 1
                lag[best] -= 1
                counts[best] += 1
            position += 1
        self._lag, self.position = lag, position
        return best

    def source_at(self, position: int) -> int:
        """The source of ``position`` (>= the cursor); walks the cursor past it."""
        if position < self.position:
            raise StateError(format_message("exact blend schedule asked for a past position", expected=f">= {self.position}", found=str(position)))
        return self._walk(position)

    def rates(self, first: int, bases: Sequence[int], stride: int, *, start: dict | None = None) -> list[int]:
        """How often the positions ``first + base + k * stride`` take each source over a window
        from ``first`` (the shares change, so this is the rate there)."""
        walker = ScheduledExactSchedule(self.weights, self.schedules, origin=self.origin)
        walker.reset(start)
        if walker.position < first:
            walker.source_at(first - 1)
        steps = max(1, SCHEDULED_RATE_WINDOW // stride)
        window = [walker.source_at(p) for p in range(first, first + steps * stride)]
        taken = [window[base + k * stride] for base in bases for k in range(steps) if base + k * stride < len(window)]
        return np.bincount(np.asarray(taken, dtype=np.int64), minlength=len(self.weights)).tolist()


class BlendNode(Node[Any], ForwardsEpochs, Elastic):
    """Mixes ``sources`` by ``weights`` (random draws, or an :class:`ExactSchedule`)."""

    tag = BLEND_TAG

    def __init__(
        self,
        sources: Sequence[Node[Any]],
        weights: Sequence[Fraction | float],
        *,
        seed: int,
        mode: str = "random",
        position: Callable[[int], int] | None = None,
        names: Sequence[str] | None = None,
        infinite: bool = False,
        cost: Callable[[Any], int] | None = None,
        position_batch: int = 1,
        schedules: Sequence[Any] | None = None,
    ) -> None:
        self.sources = list(sources)
        if len(self.sources) != len(weights) or not self.sources:
            raise ConfigError(format_message("BlendNode needs one weight per source", found=f"{len(self.sources)} sources, {len(weights)} weights"))
        if mode not in ("random", "exact", "cost"):
            raise ConfigError(format_message("unknown blend mode", expected="random, exact or cost", found=repr(mode)))
        if (mode == "cost") != (cost is not None):
            raise ConfigError(format_message("blend mode 'cost' needs a cost function (and only it takes one)", found=f"mode {mode!r}, cost {cost!r}"))
        self.cost = cost
        self.weights = [float(w) for w in weights]
        # Per source, the schedule of its weight (``format/weight_schedule.py``: a ``factor(clock)``
        # that multiplies the constant weight), or None when no weight is scheduled.
        if schedules is not None and (mode == "cost" or len(schedules) != len(self.sources) or not infinite):
            raise ConfigError(format_message("weight schedules need blend mode random or exact, an endless blend and one entry per source", found=f"mode {mode!r}, {len(schedules)} schedules for {len(self.sources)} sources"))
        self.schedules = None if schedules is None or all(s is None for s in schedules) else list(schedules)
        self._weights_at = None if self.schedules is None else ScheduledWeights(self.weights, self.schedules)
        self.mode = mode
        self.seed = seed
        self.infinite = infinite  # every source repeats forever (a weighted blend)
        self.names = list(names) if names is not None else [f"source {i}" for i in range(len(self.sources))]
        # The exact schedule runs over global positions; by default this worker's own items.
        self.position = position if position is not None else (lambda n: n)
        self.position_batch = position_batch  # consecutive items at consecutive positions (a batch)
        self.schedule: ExactSchedule | ScheduledExactSchedule | None = None
        if mode == "exact":
            self.schedule = ExactSchedule(integer_weights(weights)) if self.schedules is None else ScheduledExactSchedule(self.weights, self.schedules)
        self._own_schedule = self.schedule  # self.schedule differs only in a carried pass
        self._pass_weights: list[int] | None = None
        self._stream: UniformStream | None = None
        self._counts = [0] * len(self.sources)
        self._costs = [0] * len(self.sources)
        self._offset = 0  # global position where the stream of another topology stopped
        self._mix_from = 0  # global position where the exact schedule of these weights starts
        self.reset()

    # --- state -------------------------------------------------------------------------------
    def _start(self, epoch: int) -> None:
        self._epoch = epoch
        self._emitted = 0
        self._draws = 0
        self._exhausted = [w == 0 for w in self.weights]
        self._stream = StratifiedUniformStream(self.seed, "blend", epoch)
        self._pass_weights, self.schedule = None, self._own_schedule
        if self.schedule is not None:
            self.schedule.reset()

    def inputs(self) -> Sequence[Node[Any]]:
        return tuple(self.sources)

    def start_epoch(self, epoch: int) -> None:
        super().start_epoch(epoch)
        self._start(epoch)

    def reset(self, state: State | None = None) -> None:
        if state is None:
            for source in self.sources:
                source.reset(None)
            self._counts = [0] * len(self.sources)
            self._costs = [0] * len(self.sources)
            self._offset = 0
            self._set_mix_from(0)
            self._start(0)
            return
        check_stage(state, self.tag, "epoch", "emitted", "draws", "counts", "costs", "exhausted", "schedule", "sources")
        n = len(self.sources)
        if not isinstance(state["sources"], list) or not isinstance(state["counts"], list) or len(state["sources"]) != n or len(state["counts"]) != n:
            raise StateError(
                format_message(
                    "saved Blend state has a different number of datasets",
                    where=state_path(),
                    expected=f"{n} datasets ({', '.join(self.names)})",
                    found=f"{len(state['sources']) if isinstance(state['sources'], list) else repr(state['sources'])[:80]} source states",
                    fix="restore a state saved by a loader over the same blend",
                )
            )
        epoch = check_count(state["epoch"], "epoch", stage=self.tag)
        emitted = check_count(state["emitted"], "emitted", stage=self.tag)
        draws = check_count(state["draws"], "draws", stage=self.tag)
        counts = [check_count(c, "counts", i, stage=self.tag) for i, c in enumerate(state["counts"])]
        costs = [check_count(c, "costs", i, stage=self.tag) for i, c in enumerate(check_list(state["costs"], "costs", stage=self.tag, length=n, of="costs, one per dataset"))]
        exhausted = [check_bool(e, "exhausted", i, stage=self.tag) for i, e in enumerate(check_list(state["exhausted"], "exhausted", stage=self.tag, length=n, of="flags, one per dataset"))]
        if self.schedule is None and state["schedule"] is not None:
            raise invalid(("schedule",), f"null (blend mode {self.mode!r} has no schedule)", state["schedule"], stage=self.tag)
        for i, (source, source_state) in enumerate(zip(self.sources, state["sources"])):
            with nested("sources", i):
                source.reset(source_state)
        self._start(epoch)
        self._emitted, self._draws = emitted, draws
        self._counts, self._costs, self._exhausted = counts, costs, exhausted
        self._offset = check_count(state.get("offset", 0), "offset", stage=self.tag)
        self._set_mix_from(check_count(state.get("mix_from", 0), "mix_from", stage=self.tag))
        if "pass_weights" in state:
            self._carry_pass_weights(self._check_pass_weights(state["pass_weights"]))
        if self.schedule is not None:
            with nested("schedule"):
                self.schedule.reset(state["schedule"])

    def get_state(self) -> State:
        return {
            "stage": self.tag,
            "epoch": self._epoch,
            "emitted": self._emitted,
            "draws": self._draws,
            "counts": list(self._counts),
            "costs": list(self._costs),
            "exhausted": list(self._exhausted),
            "schedule": None if self.schedule is None else self.schedule.get_state(),
            "sources": [source.get_state() for source in self.sources],
            **({"offset": self._offset} if self._offset else {}),
            **({"mix_from": self._mix_from} if self._mix_from else {}),
            **({"pass_weights": list(self._pass_weights)} if self._pass_weights is not None else {}),
        }

    def _set_mix_from(self, position: int) -> None:
        """The exact schedule counts from global ``position`` (a weight edit at resume,
        ``loader/reweight.py``): the new weights' shares hold from there on."""
        if position and (self.schedule is None or not self.infinite):
            raise invalid(("mix_from",), "no mix_from (only an endless exact blend has one)", position, stage=self.tag)
        if position != self._mix_from and isinstance(self._own_schedule, ScheduledExactSchedule):
            self._own_schedule = self.schedule = ScheduledExactSchedule(self.weights, self.schedules, origin=position)
        self._mix_from = position

    def _check_pass_weights(self, value: Any) -> list[int]:
        if self.schedule is None or self.infinite:
            raise invalid(("pass_weights",), "no pass weights (only an exact blend_epochized blend has them)", value, stage=self.tag)
        weights = check_list(value, "pass_weights", stage=self.tag, length=len(self.sources), of="weights, one per dataset")
        weights = [check_count(w, "pass_weights", i, stage=self.tag) for i, w in enumerate(weights)]
        if not any(weights):
            raise invalid(("pass_weights",), "at least one positive weight", value, stage=self.tag)
        return weights

    def _carry_pass_weights(self, weights: list[int]) -> None:
        """The exact schedule of a carried pass: by the samples carried of each dataset (its own
        weights could leave out a dataset this worker has no samples of)."""
        divisor = math.gcd(*weights)
        self._pass_weights = weights
        self.schedule = ExactSchedule([w // divisor for w in weights])

    def undelivered(self) -> Remainder:
        """Each source's remainder as dataset ``k``'s, and where this blend stood (epochized: the
        rest of the pass of each dataset, ``epochs`` the pass)."""
        schedule = self.schedule.get_state() if self.schedule is not None and self.infinite else None
        cursor = BlendCursor(self._emitted, tuple(self._counts), tuple(self._costs), schedule, offset=self._offset, mix_from=self._mix_from)
        if self.infinite:
            parts = [source.undelivered() for source in self.sources]
            epochs, layers = tuple(part.epochs[0] for part in parts), None
        else:
            parts = [self._pass_source(k).pass_remainder() for k in range(len(self.sources))]
            epochs, layers = (self._epoch,) * len(parts), tuple(part.layers[0] for part in parts)
        return Remainder(
            epochs=epochs,
            ranges=tuple(part.ranges[0] for part in parts),
            waiting=tuple(part.waiting[0] for part in parts),
            blend=cursor,
            layers=layers,
        )

    def _pass_source(self, k: int) -> Any:
        source = self.sources[k]
        if not hasattr(source, "pass_remainder"):
            raise NotSupportedError(
                format_message(
                    "this blend_epochized blend's dataset is not a repeat of a fixed number of epochs; it cannot be moved to another topology",
                    where=self.names[k],
                    found=source.tag,
                    fix="restore on the topology the state was saved with",
                )
            )
        return source

    def carry_in(self, remainder: Remainder) -> None:
        """Dataset ``k``'s remainder to source ``k``; ``remainder.blend``: this worker's share of
        the counts and costs, and the global position where the saved stream stopped."""
        cursor = remainder.blend
        if not self.infinite:
            self._carry_in_pass(remainder)
        else:
            if self.schedule is not None:
                self._set_mix_from(cursor.mix_from)
                self._check_reads_carried(remainder, cursor)
                if cursor.schedule is not None:  # an untabulated schedule steps on from there
                    self.schedule.reset(cursor.schedule)
            for k, source in enumerate(self.sources):
                source.carry_in(remainder.dataset(k))
            self._offset = cursor.emitted
        self._counts, self._costs = list(cursor.counts), list(cursor.costs)

    def _carry_in_pass(self, remainder: Remainder) -> None:
        """Epochized: pass ``remainder.epochs[0]`` is what was carried of each dataset; a dataset
        with nothing carried is done for it."""
        self._start(remainder.epochs[0])
        carried = []
        for k in range(len(self.sources)):
            part = remainder.dataset(k)
            self._pass_source(k).carry_in_pass(part)
            carried.append(sum(end - start for start, end in part.ranges[0]))
        self._exhausted = [n == 0 for n in carried]
        if self.schedule is not None and any(carried):
            self._carry_pass_weights(carried)

    # --- iteration -----------------------------------------------------------------------------
    def schedule_rates(self, offset: int, start: dict | None = None, mix_from: int = 0) -> list[int] | None:
        """Exact mode: how many of this worker's positions in one period of the schedule take each
        dataset, its stream starting at global position ``offset`` (None in other modes, where
        every worker draws the datasets at the same rates).  A worker's positions are one
        residue class modulo the period when its stride (global workers x batch size) shares a
        factor with the period: it may then never take some dataset.  (Periods too long to
        tabulate: over a window, see :meth:`ExactSchedule.rates`; ``start``, a schedule cursor
        not past ``offset``, spares walking it from the beginning; ``mix_from``: the global
        position where the schedule starts, after a weight edit at resume.)"""
        if self.schedule is None or not self.infinite:
            return None  # an epochized blend's schedule is per worker: it takes every dataset
        # Positions are affine per batch: item k * batch + j sits at position(j) + k * stride.
        bases = [self.position(j) for j in range(self.position_batch)]
        stride = self.position(self.position_batch) - bases[0]
        schedule = self.schedule
        if mix_from != getattr(schedule, "origin", mix_from):  # a fresh pipeline's: counted from 0
            schedule = ScheduledExactSchedule(self.weights, self.schedules, origin=mix_from)
        return schedule.rates(offset - mix_from, bases, stride, start=start)

    def _check_reads_carried(self, remainder: Remainder, cursor: BlendCursor) -> None:
        """A worker that never takes dataset ``k`` must not be given samples of ``k`` to carry:
        they would never come (elastic resume shares by :meth:`schedule_rates`, so this is a
        safety net)."""
        if self.schedule.period is None:
            return  # a weight schedule's rates are over a window: a dataset may start later
        rates = self.schedule_rates(cursor.emitted, cursor.schedule, cursor.mix_from)
        for k, ranges in enumerate(remainder.ranges):
            if ranges and not rates[k]:
                raise NotSupportedError(
                    format_message(
                        "an exact blend cannot move this dataset's rest of the epoch to this worker: its positions in the schedule never take that dataset",
                        where=self.names[k],
                        found=f"the weights' period of {self.schedule.period} positions and this topology's global workers times batch size share a factor",
                        fix="restore with another number of ranks or workers (or batch size), or with blend_mode random",
                    )
                )

    def clock(self) -> int:
        """The global stream position of the next item (all ranks and workers; the clock of
        weight schedules): derived from ``emitted`` and ``offset``, so saved with them."""
        return self._offset + self.position(self._emitted)

    def current_weights(self) -> list[float]:
        """The weights at the clock (constant weights: as given)."""
        return self.weights if self._weights_at is None else self._weights_at.at(self.clock())

    def _choose(self) -> int:
        if self.cost is not None:
            # The source furthest behind its share of the cost so far (ties: the larger weight).
            total = sum(self._costs)
            live = [i for i, done in enumerate(self._exhausted) if not done]
            return max(live, key=lambda i: (self.weights[i] * total - self._costs[i], self.weights[i], -i))
        if self.schedule is not None:
            return self.schedule.source_at(self.clock() - self._mix_from)
        live = [0.0 if done else w for w, done in zip(self.current_weights(), self._exhausted)]
        cumulative = list(accumulate(live))
        draw = self._stream.at(self._draws) * cumulative[-1]
        self._draws += 1
        return min(bisect.bisect_right(cumulative, draw), len(live) - 1)

    def next(self) -> Any:
        while not all(self._exhausted):
            index = self._choose()
            if self._exhausted[index]:
                # Exact mode only (random draws skip exhausted sources): this position's source
                # has ended (an epochized pass with excluded samples); its slot stays empty.
                self._emitted += 1
                continue
            try:
                item = self.sources[index].next()
            except StopIteration:
                self._exhausted[index] = True
                if self.schedule is not None and self.infinite:
                    raise DatasetError(
                        format_message(
                            "a blended dataset ran out of samples on this worker",
                            where=self.names[index],
                            expected="every dataset of an exact blend to have samples on every worker",
                            fix="use fewer workers or ranks, or blend_mode: random",
                        )
                    ) from None
                if self.schedule is not None:
                    self._emitted += 1
                continue
            self._emitted += 1
            self._counts[index] += 1
            if self.cost is not None:
                self._costs[index] += self._cost_of(item)
            return set_restore_key(item, (self.tag, index) + get_restore_key(item))
        raise StopIteration

    def _cost_of(self, item: Any) -> int:
        value = self.cost(item)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ConfigError(
                format_message(
                    "sample_cost must return a non-negative integer",
                    where=f"sample {getattr(item, '__key__', None) or (item.get('__key__') if isinstance(item, dict) else '?')}",
                    found=repr(value)[:80],
                    fix="return the sample's token count (or another integer cost)",
                )
            )
        return value

    def restore_key_problem(self, key: tuple) -> str | None:
        return tagged_key_problem(key, self.tag, self.sources)

    def restore(self, restore_key: tuple) -> Any:
        key = as_key(restore_key)
        if len(key) < 2 or key[0] != self.tag or not isinstance(key[1], int) or not 0 <= key[1] < len(self.sources):
            raise StateError(format_message("restore key does not belong to this Blend stage", expected=f"('Blend', source index < {len(self.sources)}, *item_key)", found=repr(key)[:200]))
        return set_restore_key(self.sources[key[1]].restore(key[2:]), key)


def _blend_state(state: Any) -> dict | None:
    """The Blend stage's state inside a worker's pipeline state, if any."""
    if not isinstance(state, dict):
        return None
    if state.get("stage") == BlendNode.tag:
        return state
    for child in [state.get("source")] + list(state.get("sources") or []):
        found = _blend_state(child)
        if found is not None:
            return found
    return None


def blend_clock(state: Any, position: Callable[[int], int]) -> int | None:
    """The global stream position of a worker's next blended item (:meth:`BlendNode.clock`), from
    its state and its position function (``worker.global_position``); None: no blend."""
    blend = _blend_state(state)
    return None if blend is None else int(blend.get("offset", 0)) + position(int(blend["emitted"]))


def blended_costs(state: Any) -> list[int] | None:
    """Per-source summed cost of the items a worker's blend yielded (cost mode), from its state."""
    blend = _blend_state(state)
    return None if blend is None else [int(c) for c in blend["costs"]]


def consumed_counts(state: Any, num_sources: int) -> list[int] | None:
    """Per-source items a worker has handed on past its shuffle buffer, from its state alone.

    The blend counts what it yielded; items still waiting in a shuffle buffer above it (saved as
    restore keys starting with ``("Blend", source)``) are not consumed yet and are subtracted.
    Returns None when the state holds no blend.
    """
    counts: list[int] | None = None
    waiting = [0] * num_sources

    def walk(node: Any) -> None:
        nonlocal counts
        if not isinstance(node, dict):
            return
        if node.get("stage") == BlendNode.tag:
            counts = [int(c) for c in node["counts"]]
            return
        if node.get("stage") == "Shuffle":
            for key in node.get("buffer", ()):
                if len(key) >= 2 and key[0] == BlendNode.tag and 0 <= key[1] < num_sources:
                    waiting[key[1]] += 1
        for child in [node.get("source")] + list(node.get("sources") or []):
            walk(child)

    walk(state)
    if counts is None:
        return None
    return [c - w for c, w in zip(counts, waiting)]
