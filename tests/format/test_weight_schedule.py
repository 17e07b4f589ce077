"""Weight schedules (issue 40): parsing, bad input named by YAML path and point, evaluation."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_energon_lite.errors import ConfigError
from megatron_energon_lite.format.metadataset import load_blend_plan
from megatron_energon_lite.format.weight_schedule import RAMP_STEPS, LeafSchedule, ScheduledWeights, TargetShares, WeightSchedule, check_level, parse_weight_schedule, target_shares

HEADER = {"__module__": "megatron.energon", "__class__": "MetadatasetV2"}


def test_energon_issue_17_spelling_loads_and_interpolates() -> None:
    schedule = parse_weight_schedule({"linear": {0: 100, 100: 10, 1000: 0}}, "w")
    assert schedule == WeightSchedule("linear", ((0, 100.0), (100, 10.0), (1000, 0.0)))
    assert [schedule.at(t) for t in (0, 50, 100, 550, 1000, 5000)] == [100.0, 55.0, 10.0, 5.0, 0.0, 0.0]


def test_energon_issue_17_full_spelling_with_module_and_class_loads() -> None:
    """The issue's example, indented as it is written there."""
    text = """
weight:
  __module__: megatron.energon
  __class__: WeightSchedule
  linear:
    0: 100
    100: 10
    1000: 0
"""
    raw = yaml.safe_load(text)["weight"]
    assert parse_weight_schedule(raw, "w").points == ((0, 100.0), (100, 10.0), (1000, 0.0))
    with pytest.raises(ConfigError, match="__class__"):
        parse_weight_schedule({**raw, "__class__": "Schedule"}, "w")


def test_step_holds_the_last_points_weight_and_cosine_eases() -> None:
    step = parse_weight_schedule({"step": {0: 1, 10: 3}}, "w")
    assert [step.at(t) for t in (0, 9, 10, 11)] == [1.0, 1.0, 3.0, 3.0]
    cosine = parse_weight_schedule({"cosine": {"0": 0, "100": 2}}, "w")  # string keys (JSON) too
    assert cosine.at(0) == 0 and cosine.at(100) == 2 and cosine.at(50) == pytest.approx(1.0)
    assert cosine.at(25) == pytest.approx(1 - math.cos(math.pi / 4))


def test_a_step_clock_is_scaled_by_the_global_batch_size() -> None:
    schedule = parse_weight_schedule({"step": {0: 1, 5: 2}, "clock": "steps", "global_batch_size": 8}, "w")
    assert schedule.points == ((0, 1.0), (40, 2.0))


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ({"linear": {0: 1, 10: 2, 10: 3}}, None),  # a duplicate key collapses in Python: allowed
        ({"linear": {10: 1, 5: 2}}, r"not increasing.*linear\[5\]"),
        ({"step": {0: -1}}, r"negative.*step\[0\]"),
        ({"step": {0: float("nan")}}, r"negative or not a finite.*step\[0\]"),
        ({"step": {0: float("inf")}}, r"step\[0\]"),
        ({"step": {0: True}}, r"step\[0\]"),
        ({"step": {-1: 1}}, r"not a non-negative integer.*step\[-1\]"),
        ({"exponential": {0: 1}}, r"unknown schedule kind.*exponential"),
        ({"step": {0: 1}, "linear": {0: 1}}, "one schedule kind"),
        ({"step": {}}, "no points"),
        ({"step": {0: 1}, "clock": "steps"}, "global_batch_size"),
        ({"step": {0: 1}, "clock": "hours"}, "unknown clock"),
        ({"step": {0: 1}, "global_batch_size": 4}, "only applies to clock: steps"),
    ],
)
def test_bad_schedules_are_named_by_path_and_point(raw, match) -> None:
    if match is None:
        parse_weight_schedule(raw, "f.yaml: splits.train.blend[0].weight")
        return
    with pytest.raises(ConfigError, match="(?s)" + match) as info:
        parse_weight_schedule(raw, "f.yaml: splits.train.blend[0].weight")
    assert "splits.train.blend[0].weight" in str(info.value)


def test_a_level_whose_weights_all_vanish_at_a_point_is_refused() -> None:
    fading = parse_weight_schedule({"linear": {0: 1, 100: 0}}, "w")
    rising = parse_weight_schedule({"linear": {200: 0, 300: 1}}, "w")
    with pytest.raises(ConfigError, match="(?s)zero at a point.*clock 100"):
        check_level((fading, rising), "f.yaml: splits.train.blend")
    check_level((fading, Fraction(0), parse_weight_schedule({"linear": {50: 0, 150: 1}}, "w")), "ok")  # crosses: fine
    check_level((fading, Fraction(1)), "ok")


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["step", "linear", "cosine"]), st.lists(st.tuples(st.integers(0, 50), st.integers(0, 3)), min_size=1, max_size=4)), min_size=1, max_size=3),
)
def test_check_level_accepts_exactly_the_levels_positive_everywhere(raw) -> None:
    """check_level's claim (checking the points suffices) against a walk of every clock."""
    weights = []
    for kind, points in raw:
        table = {}
        for x, w in sorted(points):
            table[x] = w
        weights.append(WeightSchedule(kind, tuple((x, float(w)) for x, w in table.items())))
    positive_everywhere = all(sum(w.at(t) for w in weights) > 0 for t in range(0, 60))
    try:
        check_level(weights, "w")
        accepted = True
    except ConfigError:
        accepted = False
    assert accepted == positive_everywhere


def _plan(blend: list, **extra):
    return load_blend_plan({**HEADER, "splits": {"train": {"blend": blend, **extra}}}, "train", training=True, check_datasets=False)


def test_yaml_weight_schedule_reaches_the_leaves_and_nests(tmp_path) -> None:
    inner = [{"path": "a", "weight": {"step": {0: 1, 10: 0}}}, {"path": "b", "weight": 1}]
    plan = _plan(inner)
    a, b = plan.leaves
    assert a.weight == b.weight == 1 and a.weight_schedule is not None
    assert [a.weight_schedule.factor(t) for t in (0, 10)] == [0.5, 0.0]
    assert [b.weight_schedule.factor(t) for t in (0, 10)] == [0.5, 1.0]
    assert "weight_schedule" in a.describe()


def test_constant_weights_describe_as_before() -> None:
    plan = _plan([{"path": "a", "weight": 3}, {"path": "b", "weight": 1}])
    assert [leaf.weight for leaf in plan.leaves] == [Fraction(3, 4), Fraction(1, 4)]
    assert all(leaf.weight_schedule is None and "weight_schedule" not in leaf.describe() for leaf in plan.leaves)


def test_schedule_times_schedule_multiplies_the_shares() -> None:
    inner = LeafSchedule(()).outer((WeightSchedule("step", ((0, 1.0), (10, 3.0))), Fraction(1)), 0)
    both = inner.outer((Fraction(1), WeightSchedule("linear", ((0, 1.0), (100, 3.0)))), 1)
    assert both.factor(0) == pytest.approx(0.5 * 0.5)
    assert both.factor(100) == pytest.approx(0.75 * 0.75)


def test_repetitions_cannot_be_scheduled() -> None:
    with pytest.raises(ConfigError, match=r"(?s)repetitions cannot be a schedule.*blend_epochized\[0\]\.repetitions"):
        load_blend_plan({**HEADER, "splits": {"train": {"blend_epochized": [{"path": "a", "repetitions": {"step": {0: 1}}}]}}}, "train", training=True, check_datasets=False)


def test_a_level_all_zero_at_a_point_is_named_in_the_yaml() -> None:
    with pytest.raises(ConfigError, match=r"(?s)splits\.train\.blend.*clock 10"):
        _plan([{"path": "a", "weight": {"step": {0: 1, 10: 0}}}, {"path": "b", "weight": 0}])


def test_a_constant_zero_next_to_a_schedule_has_weight_zero() -> None:
    """So that the loader leaves it out with its usual warning (it would never be drawn)."""
    a, b = _plan([{"path": "a", "weight": {"step": {0: 1}}}, {"path": "b", "weight": 0}]).leaves
    assert a.weight == 1 and b.weight == 0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["step", "linear", "cosine"]), st.dictionaries(st.integers(0, 60), st.sampled_from([0, 1, 3]), min_size=1, max_size=4)), min_size=2, max_size=4),
    st.lists(st.integers(0, 80), min_size=1, max_size=40),
)
def test_cached_weights_equal_the_schedules_at_every_clock(raw, clocks: list[int]) -> None:
    """ScheduledWeights keeps values while no schedule can change: the same as evaluating anew."""
    level = tuple(WeightSchedule(kind, tuple((x, float(w)) for x, w in sorted(points.items()))) for kind, points in raw)
    leaves = [LeafSchedule(((level, i),)) for i in range(len(level))]
    cached = ScheduledWeights([2.0] * len(level), leaves)
    for clock in sorted(clocks) + clocks:  # forward walks and jumps back
        if sum(w.at(clock) for w in level) == 0:
            continue
        assert cached.at(clock) == pytest.approx([2.0 * leaf.factor(clock) for leaf in leaves]), clock


def _shares_by_hand(level: tuple[WeightSchedule, ...], clock: int) -> list[float]:
    values = [w.at(clock) for w in level]
    return [v / sum(values) for v in values]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["step", "linear", "cosine"]), st.dictionaries(st.integers(0, 300), st.sampled_from([1, 2, 5]), min_size=1, max_size=4)), min_size=2, max_size=3),
    st.integers(0, 400),
    st.integers(1, 400),
)
def test_mean_target_shares_equal_the_sum_over_every_clock(raw, start: int, length: int) -> None:
    """Ramps shorter than SAMPLES_PER_RAMP and constant stretches are summed exactly."""
    level = tuple(WeightSchedule(kind, tuple((x, float(w)) for x, w in sorted(points.items()))) for kind, points in raw)
    shares = TargetShares([1.0] * len(level), [LeafSchedule(((level, i),)) for i in range(len(level))])
    by_hand = [_shares_by_hand(level, t) for t in range(start, start + length)]
    assert shares.mean(start, start + length) == pytest.approx([sum(column) / length for column in zip(*by_hand)])
    assert shares.at(start) == pytest.approx(by_hand[0])


def test_mean_target_shares_sample_long_ramps_closely() -> None:
    """A 1 -> 0 ramp over a million samples against a constant 1: the mean share of the ramp is
    the integral of (1 - x) / (2 - x) over [0, 1], 1 - ln 2."""
    ramp = WeightSchedule("linear", ((0, 1.0), (1_000_000, 0.0)))
    level = (ramp, Fraction(1))
    shares = TargetShares([1.0, 1.0], [LeafSchedule(((level, 0),)), LeafSchedule(((level, 1),))])
    mean = shares.mean(0, 1_000_000)
    assert mean[0] == pytest.approx(1 - math.log(2), abs=1e-6)
    assert sum(mean) == pytest.approx(1.0)


def test_target_shares_read_back_a_states_description() -> None:
    """What a state's configuration holds (``LeafDataset.describe``) rebuilds the same shares,
    a schedule nested in a schedule included."""
    inner = (WeightSchedule("step", ((0, 1.0), (50, 3.0))), Fraction(1))
    outer = (WeightSchedule("cosine", ((0, 2.0), (80, 0.5))), Fraction(1))
    leaves = [LeafSchedule(((inner, 0),)).outer(outer, 0), LeafSchedule(((inner, 1),)).outer(outer, 0), LeafSchedule(((outer, 1),))]
    weights = [1.0, 1.0, 1.0]
    rows = [{"weight": w, "weight_schedule": leaf.describe()} for w, leaf in zip(weights, leaves)] + [{"weight": 0.0}]
    rebuilt, original = target_shares(rows), TargetShares(weights + [0.0], leaves + [None])
    for clock in (0, 10, 49, 50, 79, 80, 500):
        assert rebuilt.at(clock) == pytest.approx(original.at(clock))
    # Outer level: 2 -> 0.5 cosine against 1; inner: 1 then 3 against 1.
    outer_share = outer[0].at(60) / (outer[0].at(60) + 1)
    assert rebuilt.at(60) == pytest.approx([outer_share * 3 / 4, outer_share / 4, 1 - outer_share, 0.0])


def test_a_long_ramp_holds_each_value_for_a_stretch_at_its_middle() -> None:
    """100,000 samples from 1 to 0: stretches of 100,000 // RAMP_STEPS = 24 samples, each at the
    ramp's value at the mean clock of the stretch; points and short ramps are untouched."""
    ramp = WeightSchedule("linear", ((1000, 1.0), (101_000, 0.0)))
    held = 100_000 // RAMP_STEPS
    assert held == 24
    for first in (1000, 1000 + 24 * 7, 1000 + 24 * 4000):
        middle = 1 - (first + (held - 1) / 2 - 1000) / 100_000
        assert [ramp.at(first + j) for j in range(held)] == [pytest.approx(middle)] * held
        assert ramp.holds_until(first) == ramp.holds_until(first + held - 1) == first + held
        assert ramp.next_point(first + 3) == first + held
    last = 1000 + 24 * 4166  # the final, shorter stretch ends at the point
    assert ramp.holds_until(last) == 101_000 and ramp.at(101_000) == 0.0 and ramp.at(999) == 1.0
    short = WeightSchedule("linear", ((0, 1.0), (8000, 0.0)))  # 8000 // 4096 = 1: every sample
    assert [short.at(t) for t in (0, 1, 4000, 7999)] == [1.0, 1 - 1 / 8000, 0.5, 1 - 7999 / 8000]
    assert short.holds_until(10) == 11


def test_a_held_ramps_sum_stays_within_a_hundredth_of_the_true_ramps() -> None:
    """What an exact blend is held to (the running sum of the shares) moves by less than 0.01
    samples over a million-sample cosine ramp against a constant weight."""
    ramp = WeightSchedule("cosine", ((0, 5.0), (1_000_000, 0.5)))
    true_sum = held_sum = 0.0
    for t in range(1_000_000):
        w = 5.0 + (0.5 - 5.0) * (1 - math.cos(math.pi * t / 1_000_000)) / 2
        true_sum += w / (w + 1)
        held = ramp.at(t)
        held_sum += held / (held + 1)
    assert abs(true_sum - held_sum) < 0.01, true_sum - held_sum
