"""Blend weights that change over a run: a ``weight:`` given as a schedule (issue 40).

A schedule is a list of points ``(clock, weight)`` over the blend's clock, the number of samples
the blend has delivered *globally* (all ranks and workers: the global stream position the exact
blend uses, ``worker.py: global_position``), so it does not depend on the topology.
Between points, ``step`` keeps the last point's weight, ``linear`` interpolates, ``cosine`` eases
from one point's weight to the next (``a + (b - a) * (1 - cos(pi * f)) / 2``); before the first
point the first weight holds, after the last the last.

YAML (the spelling of Energon's issue #17, its ``__module__: megatron.energon`` and
``__class__: WeightSchedule`` keys optional; keys are clock values, values are weights)::

    weight: {linear: {0: 100, 100: 10, 1000: 0}}
    weight: {step: {0: 1, 5000: 3}, clock: steps, global_batch_size: 64}

``clock: steps`` (with ``global_batch_size``) reads the keys as training steps: a step is
``global_batch_size`` samples of the global stream.

A blended leaf's weight at clock ``t`` is the product, over the levels of the metadataset tree
above it, of its entry's share at that level, ``w(t) / sum of its siblings' w(t)``
(:class:`LeafSchedule`), so a schedule nested in a schedule is defined the same way as a schedule
nested in constant weights.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Mapping, Sequence

from ..errors import ConfigError, format_message

__all__ = ["SCHEDULE_KINDS", "LeafSchedule", "ScheduledWeights", "TargetShares", "WeightSchedule", "check_level", "parse_weight_schedule", "target_shares"]

#: The kinds of schedule a ``weight:`` may name.
SCHEDULE_KINDS = ("step", "linear", "cosine")
#: A linear or cosine ramp takes at most this many values: a ramp of ``span`` samples holds each
#: value for ``span // RAMP_STEPS`` samples when that is 2 or more (the value at the middle of the
#: stretch), so that weights are evaluated once per stretch, not once per sample.
RAMP_STEPS = 4096
_CLOCKS = ("samples", "steps")


@dataclass(frozen=True)
class WeightSchedule:
    """``kind`` between ``points`` (clock in samples, weight), clocks strictly increasing."""

    kind: str
    points: tuple[tuple[int, float], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "_clocks", tuple(x for x, _ in self.points))

    def at(self, clock: int) -> float:
        """The weight at global sample ``clock``."""
        after = bisect.bisect_right(self._clocks, clock)  # points[after - 1] <= clock < points[after]
        if after == 0:
            return self.points[0][1]
        if after == len(self.points) or self.kind == "step":
            return self.points[after - 1][1]
        (x0, a), (x1, b) = self.points[after - 1], self.points[after]
        held = (x1 - x0) // RAMP_STEPS
        # A long ramp holds each value for ``held`` samples: the mean clock of the stretch's.
        at = clock if held < 2 else min(x0 + (clock - x0) // held * held + (held - 1) / 2, x1)
        fraction = (at - x0) / (x1 - x0)
        if self.kind == "cosine":
            fraction = (1 - math.cos(math.pi * fraction)) / 2
        return a + (b - a) * fraction

    def describe(self) -> dict[str, Any]:
        """Plain JSON for fingerprints."""
        return {self.kind: [[x, w] for x, w in self.points]}

    @classmethod
    def from_description(cls, data: Mapping[str, Any]) -> "WeightSchedule":
        """The schedule :meth:`describe` gave (as saved in a state's configuration)."""
        ((kind, points),) = data.items()
        return cls(kind, tuple((int(x), float(w)) for x, w in points))

    def next_point(self, clock: int) -> float:
        """The first point after ``clock`` (inf: none); inside a long ramp, the end of the stretch
        that holds ``at(clock)``, so that the weight is constant up to the next point."""
        after = bisect.bisect_right(self._clocks, clock)
        if after == len(self.points):
            return math.inf
        return self._stretch_end(after, clock) or self._clocks[after]

    def holds_until(self, clock: int) -> float:
        """The first clock after ``clock`` at which the weight may differ from ``at(clock)``."""
        after = bisect.bisect_right(self._clocks, clock)
        if after == len(self.points):
            return math.inf
        if self.kind == "step" or after == 0 or self.points[after - 1][1] == self.points[after][1]:
            return self._clocks[after]
        return self._stretch_end(after, clock) or clock + 1

    def _stretch_end(self, after: int, clock: int) -> int | None:
        """Inside a long ramp (``points[after - 1]`` to ``points[after]``), the end of the stretch
        of ``clock`` (see :data:`RAMP_STEPS`); None elsewhere."""
        if after == 0 or self.kind == "step":
            return None
        x0, x1 = self._clocks[after - 1], self._clocks[after]
        held = (x1 - x0) // RAMP_STEPS
        return min(x0 + ((clock - x0) // held + 1) * held, x1) if held >= 2 else None


Weight = Fraction | WeightSchedule


def weight_at(weight: Weight, clock: int) -> float:
    return weight.at(clock) if isinstance(weight, WeightSchedule) else float(weight)


@dataclass(frozen=True)
class LeafSchedule:
    """A leaf's scheduled factors: per scheduled level above it, the weights of the siblings at
    that level and the index of the entry the leaf is under.  The leaf's weight at ``clock`` is
    its constant weight times each level's share ``w[index](clock) / sum(w(clock))``."""

    levels: tuple[tuple[tuple[Weight, ...], int], ...]

    def factor(self, clock: int) -> float:
        result = 1.0
        for siblings, index in self.levels:
            values = [weight_at(w, clock) for w in siblings]
            result *= values[index] / sum(values)
        return result

    def describe(self) -> list[Any]:
        return [[[w.describe() if isinstance(w, WeightSchedule) else float(w) for w in siblings], index] for siblings, index in self.levels]

    @classmethod
    def from_description(cls, data: Sequence[Any]) -> "LeafSchedule":
        """The leaf schedule :meth:`describe` gave (as saved in a state's configuration)."""
        levels = []
        for siblings, index in data:
            weights = tuple(WeightSchedule.from_description(w) if isinstance(w, Mapping) else Fraction(w) for w in siblings)
            levels.append((weights, int(index)))
        return cls(tuple(levels))

    def outer(self, siblings: tuple[Weight, ...], index: int) -> "LeafSchedule":
        """This schedule under one more (outer) scheduled level."""
        return LeafSchedule(((siblings, index), *self.levels))


class ScheduledWeights:
    """The leaves' weights at a clock (constant weight times :meth:`LeafSchedule.factor`), each
    level evaluated once per clock, and kept while no schedule can change (a step schedule
    between its points costs one comparison per sample)."""

    def __init__(self, weights: Sequence[float], schedules: Sequence[LeafSchedule | None]) -> None:
        self.weights = [float(w) for w in weights]
        self.schedules = list(schedules)
        self._valid = (0, -1)  # [from, until) where self._values hold
        self._values: list[float] = []
        self._next_point = math.inf

    def at(self, clock: int) -> list[float]:
        if not self._valid[0] <= clock < self._valid[1]:
            self._values, until, self._next_point = self._evaluate(clock)
            self._valid = (clock, until)
        return self._values

    def next_point(self, clock: int) -> float:
        """The first point of any schedule after ``clock`` (inf: none)."""
        self.at(clock)
        return self._next_point

    def holds_until(self, clock: int) -> float:
        """The first clock after ``clock`` at which the weights may differ from ``at(clock)``."""
        self.at(clock)
        return self._valid[1]

    def _evaluate(self, clock: int) -> tuple[list[float], float, float]:
        shares: dict[int, list[float]] = {}
        until = next_point = math.inf
        values = []
        for weight, schedule in zip(self.weights, self.schedules):
            factor = 1.0
            for siblings, index in () if schedule is None else schedule.levels:
                if id(siblings) not in shares:
                    level = [weight_at(w, clock) for w in siblings]
                    total = sum(level)
                    shares[id(siblings)] = [v / total for v in level]
                    scheduled = [w for w in siblings if isinstance(w, WeightSchedule)]
                    until = min([until, *(w.holds_until(clock) for w in scheduled)])
                    next_point = min([next_point, *(w.next_point(clock) for w in scheduled)])
                factor *= shares[id(siblings)][index]
            values.append(weight * factor)
        # Not past the next point: inside a ramp whose two ends are equal, ``holds_until`` is the
        # ramp's end but ``next_point`` the stretch's, and both must be functions of the clock alone.
        return values, min(until, next_point), next_point


class TargetShares:
    """Each leaf's target share of a blend (its weight over the sum of all leaves' weights) at a
    clock, and averaged over a range of clocks: what a report compares the realized shares with."""

    #: Clocks evaluated at most per stretch between two points of the schedules (a linear or
    #: cosine ramp); longer stretches are averaged at this many evenly spaced clocks.
    SAMPLES_PER_RAMP = 2048

    def __init__(self, weights: Sequence[float], schedules: Sequence[LeafSchedule | None]) -> None:
        self._weights = ScheduledWeights(weights, schedules)

    def at(self, clock: int) -> list[float]:
        values = self._weights.at(clock)
        total = sum(values)
        return [v / total if total else 0.0 for v in values]

    def mean(self, start: int, stop: int) -> list[float]:
        """The mean share over clocks ``start <= t < stop``: exact where the weights are piecewise
        constant, sampled on ramps longer than :attr:`SAMPLES_PER_RAMP`."""
        if stop <= start:
            return self.at(start)
        sums = [0.0] * len(self._weights.weights)
        clock = start
        while clock < stop:
            shares = self.at(clock)
            held = min(self._weights.holds_until(clock), stop)  # the weights are constant up to here
            if held > clock + 1:
                span, points = held - clock, [(clock, held - clock)]
            else:  # a ramp: every clock up to the next point, or evenly spaced samples of it
                end = int(min(self._weights.next_point(clock), stop))
                span = end - clock
                count = min(span, self.SAMPLES_PER_RAMP)
                points = [(clock + (2 * i + 1) * span // (2 * count), span / count) for i in range(count)]
            for at, times in points:
                for k, share in enumerate(self.at(at) if at != clock else shares):
                    sums[k] += share * times
            clock += span
        return [total / (stop - start) for total in sums]


def target_shares(datasets: Sequence[Mapping[str, Any]]) -> TargetShares:
    """The target shares of the blend a state's configuration describes (its ``datasets`` rows:
    ``weight`` and, when scheduled, ``weight_schedule``)."""
    weights = [float(row["weight"]) for row in datasets]
    schedules = [LeafSchedule.from_description(row["weight_schedule"]) if row.get("weight_schedule") else None for row in datasets]
    return TargetShares(weights, schedules)


def _bad(where: str, what: str, expected: str, found: Any) -> ConfigError:
    return ConfigError(format_message(f"invalid weight schedule: {what}", where=where, expected=expected, found=repr(found)[:120], fix="see docs/guide/blending.md, 'Weights that change during a run'"))


def _clock_value(key: Any, where: str) -> int:
    if isinstance(key, str) and key.strip().isdigit():
        key = int(key.strip())
    if not isinstance(key, int) or isinstance(key, bool) or key < 0:
        raise _bad(where, "a point's clock is not a non-negative integer", "a clock value (samples, or steps with clock: steps) >= 0", key)
    return key


def parse_weight_schedule(raw: Mapping, where: str) -> WeightSchedule:
    """A ``weight:`` mapping (``{kind: {clock: weight, ...}, clock: ..., global_batch_size: ...}``)
    -> a schedule over samples; ``where`` is the YAML path of the ``weight`` key."""
    if raw.get("__module__", "megatron.energon") not in ("megatron.energon", "megatron_energon_lite") or raw.get("__class__", "WeightSchedule") != "WeightSchedule":
        raise _bad(where, "unknown __module__ / __class__", "__module__: megatron.energon, __class__: WeightSchedule (or neither)", {k: raw.get(k) for k in ("__module__", "__class__")})
    kinds = [key for key in raw if key in SCHEDULE_KINDS]
    unknown = [key for key in raw if key not in (*SCHEDULE_KINDS, "clock", "global_batch_size", "__module__", "__class__")]
    if unknown or len(kinds) != 1:
        raise _bad(where, "unknown schedule kind" if unknown else "one schedule kind expected", f"one of {', '.join(SCHEDULE_KINDS)} (with optional clock: samples|steps and global_batch_size)", f"keys {', '.join(map(str, raw))}")
    kind = kinds[0]
    clock = raw.get("clock", "samples")
    if clock not in _CLOCKS:
        raise _bad(f"{where}.clock", "unknown clock", " or ".join(_CLOCKS), clock)
    scale = 1
    if clock == "steps":
        scale = raw.get("global_batch_size")
        if not isinstance(scale, int) or isinstance(scale, bool) or scale <= 0:
            raise _bad(f"{where}.global_batch_size", "clock: steps needs the global batch size", "a positive integer (samples per training step, all ranks)", scale)
    elif "global_batch_size" in raw:
        raise _bad(f"{where}.global_batch_size", "global_batch_size only applies to clock: steps", "clock: steps, or no global_batch_size", raw["global_batch_size"])
    table = raw[kind]
    if not isinstance(table, Mapping) or not table:
        raise _bad(f"{where}.{kind}", "no points", "a mapping {clock: weight, ...} with at least one point", table)
    points: list[tuple[int, float]] = []
    for key, value in table.items():
        point_where = f"{where}.{kind}[{key!r}]"
        x = _clock_value(key, point_where)
        if points and x * scale <= points[-1][0]:
            raise _bad(point_where, "points are not increasing", f"a clock > {points[-1][0] // scale}", x)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
        if not ok:
            raise _bad(point_where, "a weight is negative or not a finite number", "a finite number >= 0", value)
        points.append((x * scale, float(value)))
    return WeightSchedule(kind, tuple(points))


def check_level(weights: Sequence[Weight], where: str) -> None:
    """Some weight of a blend level is positive at every clock.  Between two consecutive points of
    all its schedules each weight is constant or monotone, so a level whose weights all vanish
    somewhere vanishes at one of those points: checking them (and 0) suffices."""
    clocks = sorted({0, *(x for w in weights if isinstance(w, WeightSchedule) for x, _ in w.points)})
    for clock in clocks:
        values = [weight_at(w, clock) for w in weights]
        if sum(values) <= 0:
            raise ConfigError(
                format_message(
                    "all blend weights are zero at a point of the schedule",
                    where=where,
                    expected="at least one positive weight at every clock",
                    found=f"at clock {clock} (samples): weights " + ", ".join(f"{v:g}" for v in values),
                    fix="give some entry a positive weight at that point",
                )
            )
