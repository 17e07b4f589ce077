"""Prototype for benchmarks/notes/exact-schedule-random-access.md (issue 40, speed): a random-access
exact blend for scheduled weights, by nested rounding over a fixed binary tree of the datasets.

Standalone: numpy, and (read-only) the project's ``format.weight_schedule`` for the stretches of a
schedule and ``pipeline.blend.ScheduledExactSchedule`` for the cost comparison.

    python benchmarks/notes/exact_schedule_tree_prototype.py sweep --configs 300 --length 32768
    python benchmarks/notes/exact_schedule_tree_prototype.py equal   # constant equal weights, n = 2..32
    python benchmarks/notes/exact_schedule_tree_prototype.py cost

Arithmetic is exact: each stretch's shares are quantised to integers summing to ``M`` (largest
remainder), so every cumulative target is an integer over ``M`` and the rounding is integer
floor division (int64, vectorised over positions; plain Python ints for one position).  The
int64 path overflows past about 2**18 positions at M = 2**22: a prototype, not the product.
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import math
import statistics
import time
from fractions import Fraction

import numpy as np

from megatron_energon_lite.format.weight_schedule import LeafSchedule, ScheduledWeights, WeightSchedule

M = 1 << 22  # share quantum: |F_float - F_quantised| < P / M per dataset (0.016 at P = 2**16)
HALF = M // 2


# --- the schedule as stretches of constant (quantised) shares --------------------------------------

def quantise(shares: list[float]) -> list[int]:
    """Integers summing to M, each within one of share * M (largest remainder)."""
    total = sum(shares)
    exact = [s / total * M for s in shares]
    ints = [math.floor(x) for x in exact]
    for i in sorted(range(len(ints)), key=lambda i: exact[i] - ints[i], reverse=True)[: M - sum(ints)]:
        ints[i] += 1
    return ints


class Pieces:
    """Stretches [X[k], X[k+1]) of constant shares S[k] (ints, sum M) and the scaled cumulative
    targets Fs[k] = M * F(X[k]); the last stretch runs for ever."""

    def __init__(self, starts: list[int], shares: list[list[int]], float_shares: list[list[float]]) -> None:
        self.X = np.asarray(starts, dtype=np.int64)
        self.S = np.asarray(shares, dtype=np.int64)
        self.Sf = np.asarray(float_shares, dtype=np.float64)
        lengths = np.diff(self.X)
        self.Fs = np.zeros_like(self.S)
        self.Fs[1:] = np.cumsum(self.S[:-1] * lengths[:, None], axis=0)
        self.Ff = np.zeros_like(self.Sf)
        self.Ff[1:] = np.cumsum(self.Sf[:-1] * lengths[:, None], axis=0)

    @classmethod
    def from_schedules(cls, weights: list, length: int) -> "Pieces":
        """Stretches of a flat blend whose weights are Fractions or WeightSchedules (the project's
        evaluation, ramps held per stretch), up to ``length``."""
        n = len(weights)
        level = tuple(weights)
        sw = ScheduledWeights([1.0] * n, [LeafSchedule(((level, i),)) for i in range(n)])
        starts, shares, floats, clock = [], [], [], 0
        while clock < length:
            values = sw.at(clock)
            total = sum(values)
            floats.append([v / total for v in values])
            shares.append(quantise(values))
            starts.append(clock)
            until = sw.holds_until(clock)
            clock = length if until == math.inf else int(until)
        return cls(starts, shares, floats)

    def targets(self, positions: np.ndarray, scaled: bool = True) -> np.ndarray:
        """M * F_i(P) (exact ints), or the float targets, for every P in ``positions``: (len, n)."""
        k = np.searchsorted(self.X, positions, side="right") - 1
        d = (positions - self.X[k])[:, None]
        return self.Fs[k] + d * self.S[k] if scaled else self.Ff[k] + d * self.Sf[k]


# --- trees --------------------------------------------------------------------------------------

def balanced_tree(mass: list[float], leaves: list[int] | None = None):
    """Sorted by mass, split where the two halves' masses are closest; a leaf is an int."""
    leaves = sorted(range(len(mass)), key=lambda i: -mass[i]) if leaves is None else leaves
    if len(leaves) == 1:
        return leaves[0]
    prefix = np.cumsum([mass[i] for i in leaves])
    cut = int(np.argmin(np.abs(prefix[:-1] - prefix[-1] / 2))) + 1
    return (balanced_tree(mass, leaves[:cut]), balanced_tree(mass, leaves[cut:]))


def huffman_tree(mass: list[float]):
    """Merge the two lightest (ties by index)."""
    heap = [(m, i, i) for i, m in enumerate(mass)]
    heapq.heapify(heap)
    tick = len(mass)
    while len(heap) > 1:
        m1, _, a = heapq.heappop(heap)
        m2, _, b = heapq.heappop(heap)
        heapq.heappush(heap, (m1 + m2, tick, (a, b)))
        tick += 1
    return heap[0][2]


def index_tree(mass: list[float], leaves: list[int] | None = None):
    """Baseline: halves by count, in index order."""
    leaves = list(range(len(mass))) if leaves is None else leaves
    if len(leaves) == 1:
        return leaves[0]
    h = len(leaves) // 2
    return (index_tree(mass, leaves[:h]), index_tree(mass, leaves[h:]))


TREES = {"balanced": balanced_tree, "huffman": huffman_tree, "index": index_tree}


def depth(node) -> int:
    return 0 if isinstance(node, int) else 1 + max(depth(node[0]), depth(node[1]))


def leaves_of(node) -> list[int]:
    return [node] if isinstance(node, int) else leaves_of(node[0]) + leaves_of(node[1])


# --- the rule -----------------------------------------------------------------------------------

class TreeSchedule:
    """c_A(P) = round_half_up(H_A(c_G(P))), H_A = F_A o F_G^-1, for the left child A of each
    group G (the right child takes c_G - c_A); the root's count is P."""

    def __init__(self, pieces: Pieces, tree) -> None:
        self.pieces, self.tree = pieces, tree
        self.n = pieces.S.shape[1]
        # Per internal node: (knots FGs, left child's Fs, left S, parent S (0 -> 1), children).
        self.nodes = {}
        self._build(tree)
        # Plain-Python copies for the one-position path.
        self.py = {key: (v[0].tolist(), v[1].tolist(), v[2].tolist(), v[3].tolist(), v[4]) for key, v in self.nodes.items()}

    def _build(self, node) -> None:
        if isinstance(node, int):
            return
        left, right = node
        g, a = leaves_of(node), leaves_of(left)
        SG = self.pieces.S[:, g].sum(axis=1)
        self.nodes[id(node)] = (self.pieces.Fs[:, g].sum(axis=1), self.pieces.Fs[:, a].sum(axis=1), self.pieces.S[:, a].sum(axis=1), np.maximum(SG, 1), node)
        self._build(left)
        self._build(right)

    def _left_count(self, node, q: np.ndarray) -> np.ndarray:
        FG, FA, SA, SG, _ = self.nodes[id(node)]
        qs = q * M
        k = np.searchsorted(FG, qs, side="right") - 1
        return (FA[k] * SG[k] + (qs - FG[k]) * SA[k] + SG[k] * HALF) // (SG[k] * M)

    def counts(self, positions: np.ndarray) -> np.ndarray:
        """c_i(P) for every P in ``positions`` (vectorised, top down): (len, n)."""
        out = np.zeros((len(positions), self.n), dtype=np.int64)

        def down(node, c):
            if isinstance(node, int):
                out[:, node] = c
                return
            a = self._left_count(node, c)
            down(node[0], a)
            down(node[1], c - a)

        down(self.tree, positions.astype(np.int64))
        return out

    def sources(self, positions: np.ndarray) -> np.ndarray:
        """s(p) for many positions at once: descend both c(p) and c(p + 1), follow the child that
        increments (what a worker would do for its next block of strided positions)."""
        p = positions.astype(np.int64)
        result = np.full(len(p), -1, dtype=np.int64)

        def down(node, idx, c0, c1):
            if isinstance(node, int):
                result[idx] = node
                return
            a0, a1 = self._left_count(node, c0), self._left_count(node, c1)
            goes_left = a1 > a0
            if goes_left.any():
                down(node[0], idx[goes_left], a0[goes_left], a1[goes_left])
            right = ~goes_left
            if right.any():
                down(node[1], idx[right], (c0 - a0)[right], (c1 - a1)[right])

        down(self.tree, np.arange(len(p)), p, p + 1)
        return result

    def source_at(self, p: int) -> int:
        """s(p) for one position, plain Python ints: two roundings per level."""
        node, c0 = self.tree, p
        while not isinstance(node, int):
            FG, FA, SA, SG, _ = self.py[id(node)]
            qs = c0 * M
            k = bisect.bisect_right(FG, qs) - 1
            num, den = FA[k] * SG[k] + (qs - FG[k]) * SA[k] + SG[k] * HALF, SG[k] * M
            a0 = num // den
            # c_G(p + 1) = c0 + 1: the same stretch unless a knot lies in between.
            qs1 = qs + M
            if k + 1 < len(FG) and FG[k + 1] <= qs1:
                k = bisect.bisect_right(FG, qs1) - 1
                a1 = (FA[k] * SG[k] + (qs1 - FG[k]) * SA[k] + SG[k] * HALF) // (SG[k] * M)
            else:
                a1 = (num + M * SA[k]) // den
            if a1 > a0:
                node, c0 = node[0], a0
            else:
                node, c0 = node[1], c0 - a0
        return node

    def analytic_bound(self) -> float:
        """max over leaves of 1/2 (1 + r_d + r_d r_{d-1} + ... + r_d...r_2), r_k the largest
        share ratio child/parent over the schedule's stretches (parent share > 0)."""
        S = self.pieces.S
        worst = 0.0

        def down(node, ratios):
            nonlocal worst
            if isinstance(node, int):
                total, product = 0.5, 1.0
                for r in reversed(ratios[1:]):  # the top ratio does not count
                    product *= r
                    total += 0.5 * product
                worst = max(worst, total)
                return
            g = S[:, leaves_of(node)].sum(axis=1)
            live = g > 0
            for child in node:
                c = S[:, leaves_of(child)].sum(axis=1)
                down(child, ratios + [float((c[live] / g[live]).max())])

        down(self.tree, [])
        return worst


# --- 2. the bound, swept ---------------------------------------------------------------------------

def random_blend(rng: np.random.Generator, length: int) -> tuple[str, list]:
    n = int(rng.choice([2, 3, 4, 5, 8, 16, 32, int(rng.integers(2, 33))]))
    kind = str(rng.choice(["equal", "uniform", "skewed", "dominant"]))
    schedule = str(rng.choice(["constant", "step", "linear", "cosine", "linear_long", "to_zero"]))

    def draw():
        if kind == "equal":
            return [1.0] * n
        if kind == "uniform":
            return list(rng.uniform(1, 10, n))
        if kind == "skewed":
            return list(10 ** rng.uniform(-3, 0, n))
        w = list(rng.uniform(0.001, 0.01, n))
        w[int(rng.integers(n))] = 1.0
        return w

    rows = [draw() for _ in range(4)]
    if schedule == "constant":
        return f"n={n} {kind} {schedule}", [Fraction(w).limit_denominator(10**6) for w in rows[0]]
    if schedule == "linear_long":  # ramps held per stretch (span >= 2 * 4096)
        clocks = sorted(set(int(x) for x in rng.integers(0, length // 2, 1))) + [length + int(rng.integers(8192, 200_000))]
    else:
        clocks = sorted(set(int(x) for x in rng.integers(0, length, int(rng.integers(2, 5)))))
    kind_name = {"step": "step", "cosine": "cosine"}.get(schedule, "linear")
    weights = []
    for i in range(n):
        values = [rows[j % 4][i] for j in range(len(clocks))]
        if schedule == "to_zero" and rng.random() < 0.5:
            values[-1] = 0.0
        weights.append(WeightSchedule(kind_name, tuple(zip(clocks, values))))
    # A level whose weights are all 0 at some clock is refused by the project: keep one alive.
    if schedule == "to_zero":
        weights[0] = WeightSchedule(kind_name, tuple(zip(clocks, [rows[0][0]] * len(clocks))))
    return f"n={n} {kind} {schedule}", weights


def sweep(configs: int, length: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    positions = np.arange(length + 1, dtype=np.int64)
    names = [*TREES, "best-of-3"]
    stats = {name: {"bound<1": 0, "err>1": 0, "err>=1": 0, "worst": (0.0, ""), "worst_float": 0.0, "err>1|bound<1": 0} for name in names}
    checked = 0
    by_kind: dict[str, list[int]] = {}
    for _ in range(configs):
        label, weights = random_blend(rng, length)
        pieces = Pieces.from_schedules(weights, length)
        target = pieces.targets(positions)
        target_float = pieces.targets(positions, scaled=False)
        mass = list(pieces.Sf.mean(axis=0) + 1e-12)
        built = {name: TreeSchedule(pieces, make(mass)) for name, make in TREES.items()}
        built["best-of-3"] = min(built.values(), key=TreeSchedule.analytic_bound)
        for name, ts in built.items():
            c = ts.counts(positions)
            steps = np.diff(c, axis=0)
            if not (((steps == 0) | (steps == 1)).all() and (c.sum(axis=1) == positions).all()):
                raise SystemExit(f"not a schedule: {label} {name}")
            error = float(np.abs(c * M - target).max()) / M
            error_float = float(np.abs(c - target_float).max())
            s = stats[name]
            bound = ts.analytic_bound()
            if error > bound + 1e-9:
                raise SystemExit(f"error {error} above the analytic bound {bound}: {label} {name}")
            s["bound<1"] += bound < 1
            s["err>1|bound<1"] += bound < 1 and error >= 1
            s["err>1"] += error > 1
            s["err>=1"] += error >= 1
            if error > s["worst"][0]:
                s["worst"] = (error, f"{label} bound {ts.analytic_bound():.3f}")
            s["worst_float"] = max(s["worst_float"], error_float)
        best_bound, best_error = ts.analytic_bound(), float(np.abs(ts.counts(positions) * M - target).max()) / M
        for key in (label.split()[1], label.split()[2], "n<=4" if len(weights) <= 4 else "n<=16" if len(weights) <= 16 else "n>16"):
            row = by_kind.setdefault(key, [0, 0, 0])
            row[0] += 1
            row[1] += best_bound < 1
            row[2] += best_error >= 1
        # Spot-check: the one-position path gives the same sources as the vectorised counts.
        sample = rng.integers(0, length, 200)
        expected = np.argmax(np.diff(ts.counts(positions), axis=0)[sample], axis=1)
        if [ts.source_at(int(p)) for p in sample] != expected.tolist() or ts.sources(sample).tolist() != expected.tolist():
            raise SystemExit(f"random access disagrees with the counts: {label}")
        checked += 1
    print(f"{checked} blends, positions 0..{length} each, M = 2**{M.bit_length() - 1}")
    print("best-of-3 by kind (blends, analytic bound < 1, actual max error >= 1):", {k: tuple(v) for k, v in sorted(by_kind.items())})
    for name, s in stats.items():
        print(f"{name:9s} analytic bound < 1: {s['bound<1']}/{checked}; max |c - F| > 1: {s['err>1']}, >= 1: {s['err>=1']}; "
              f"(>= 1 although bound < 1: {s['err>1|bound<1']}); worst {s['worst'][0]:.4f} ({s['worst'][1]}); worst against the float target {s['worst_float']:.4f}")


def equal() -> None:
    """Constant equal weights, n = 2..32: the balanced tree's analytic bound and actual error."""
    positions = np.arange(1 << 14, dtype=np.int64)
    for n in range(2, 33):
        pieces = Pieces.from_schedules([Fraction(1)] * n, len(positions))
        for name in ("balanced", "huffman"):
            ts = TreeSchedule(pieces, TREES[name]([1.0] * n))
            error = float(np.abs(ts.counts(positions) * M - pieces.targets(positions)).max()) / M
            print(f"n={n:2d} {name:8s} depth {depth(ts.tree)} bound {ts.analytic_bound():.3f} actual {error:.3f}")


# --- 3. cost ------------------------------------------------------------------------------------

def cost() -> None:
    from megatron_energon_lite.pipeline.blend import ScheduledExactSchedule

    print("us per position, median of 5 rounds (walk: 6000 consecutive; tree: 6000 strided by 64, one at a time and as one numpy block)")
    for n in (4, 16, 32):
        weights = list(range(1, n + 1))
        for label, schedule in (("step 50M", "step"), ("linear 1M ramp", "linear")):
            span = 50_000_000 if schedule == "step" else 1_000_000
            scheds = [WeightSchedule(schedule, ((0, float(w)), (span, float(n + 1 - w)))) for w in weights]
            leaf = [LeafSchedule(((tuple(scheds), i),)) for i in range(n)]
            start = 0
            length = start + 6000 * 64 + 2
            pieces = Pieces.from_schedules(scheds, length)
            mass = list(pieces.Sf.mean(axis=0))
            trees = [TreeSchedule(pieces, make(mass)) for make in TREES.values()]
            ts = min(trees, key=TreeSchedule.analytic_bound)
            everything = np.arange(length, dtype=np.int64)
            error = float(np.abs(ts.counts(everything) * M - pieces.targets(everything)).max()) / M
            strided = np.arange(start, start + 6000 * 64, 64)
            walk, one, block = [], [], []
            for _ in range(5):
                w = ScheduledExactSchedule([1.0] * n, leaf)
                if start:
                    w.source_at(start - 1)
                t = time.process_time()
                for p in range(start, start + 6000):
                    w.source_at(p)
                walk.append((time.process_time() - t) / 6000 * 1e6)
                t = time.process_time()
                for p in strided.tolist():
                    ts.source_at(p)
                one.append((time.process_time() - t) / 6000 * 1e6)
                t = time.process_time()
                ts.sources(strided)
                block.append((time.process_time() - t) / 6000 * 1e6)
            print(f"n={n:2d} {label:15s} walk {statistics.median(walk):6.2f}  tree one-by-one {statistics.median(one):6.2f}  "
                  f"tree block {statistics.median(block):6.2f}  (stretches {len(pieces.X)}, best-of-3 tree depth {depth(ts.tree)}, bound {ts.analytic_bound():.3f}, max error {error:.3f})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["sweep", "cost", "equal"])
    parser.add_argument("--configs", type=int, default=400)
    parser.add_argument("--length", type=int, default=1 << 16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    {"sweep": lambda: sweep(args.configs, args.length, args.seed), "cost": cost, "equal": equal}[args.what]()
