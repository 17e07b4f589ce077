"""What choosing each sample's dataset costs in a blend, per sample, in one worker.

Random mode draws once per sample.  Exact mode reads the global schedule at this worker's
positions: with ``W`` global workers (ranks x dataloader workers) and batch size ``B`` a worker
jumps ``W x B`` positions per batch.  Small periods (weights like 6/3/1) are tabulated, so a
jump is a lookup; weights with a huge common denominator (dataset sizes as weights) step through
every position in between.  ``--schedules`` measures weight schedules instead (issue 40): 16
datasets with constant weights against step and linear schedules, alternating rounds, medians.
Run:

    .venv/bin/python benchmarks/bench_blend.py [--schedules]
"""

from __future__ import annotations

import argparse
import statistics
import time

from megatron_energon_lite.format.weight_schedule import LeafSchedule, WeightSchedule
from megatron_energon_lite.pipeline.blend import BlendNode, ExactSchedule, integer_weights


class _Forever:
    """A source that yields the same small dict forever (no loading cost)."""

    def __init__(self) -> None:
        self.item = {"__restore_key__": ("List", 0)}

    def next(self):
        return dict(self.item)

    def reset(self, state=None) -> None:
        pass

    def get_state(self) -> dict:
        return {}


def per_sample_us(node: BlendNode, samples: int) -> tuple[float, float]:
    """Wall-clock and CPU (this process: less sensitive to other jobs on the machine)
    microseconds per sample."""
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(samples):
        node.next()
    return (time.perf_counter() - start) / samples * 1e6, (time.process_time() - cpu) / samples * 1e6


def _position(workers: int, batch: int):
    def position(n: int) -> int:
        k, j = divmod(n, batch)
        return (k * workers) * batch + j  # this worker is global worker 0

    return position


def _scheduled_blend(kind: str, mode: str, datasets: int, workers: int, batch: int) -> BlendNode:
    """``datasets`` sources weighted 1..N: constant, or the same weights at the start of a step
    or linear schedule whose next point lies far beyond the run (a ramp of 50M samples)."""
    start = [1.0 + i for i in range(datasets)]
    if kind == "constant":
        weights, schedules = start, None
    else:
        level = tuple(WeightSchedule(kind, ((0, w), (50_000_000, 2.0))) for w in start)
        weights, schedules = [1.0] * datasets, [LeafSchedule(((level, i),)) for i in range(datasets)]
    return BlendNode([_Forever() for _ in range(datasets)], weights, seed=1, mode=mode, position=_position(workers, batch), infinite=True, schedules=schedules)


def schedules(samples: int, batch: int, rounds: int) -> None:
    print(f"16 datasets, batch {batch}, {rounds} alternating rounds, median us per sample (one worker's blend, no loading)")
    rows = []
    for mode in ("random", "exact"):
        for workers in (1, 16, 64):
            n = samples if mode == "random" or workers == 1 else max(200, samples * 2 // workers)
            times: dict[str, list[tuple[float, float]]] = {kind: [] for kind in ("constant", "step", "linear")}
            for _ in range(rounds):
                for kind in times:
                    times[kind].append(per_sample_us(_scheduled_blend(kind, mode, 16, workers, batch), n))
            rows.append((mode, workers, times))
    for clock, which in (("wall-clock", 0), ("CPU", 1)):
        print(f"\n{clock} us per sample")
        print("| mode | global workers | constant | step schedule | linear schedule | step / constant | linear / constant |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for mode, workers, times in rows:
            c, st, li = (statistics.median(t[which] for t in times[k]) for k in ("constant", "step", "linear"))
            print(f"| {mode} | {workers} | {c:.2f} | {st:.2f} | {li:.2f} | {st / c:.1f}x | {li / c:.1f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--schedules", action="store_true", help="Weight schedules against constant weights (16 datasets).")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.schedules:
        schedules(args.samples, args.batch_size, args.rounds)
        return
    cases = {"6/3/1 (tabulated)": [6, 3, 1], "dataset sizes 1234567/7654321/999983 (stepped)": [1234567, 7654321, 999983]}
    print(f"| weights | global workers | random us/sample | exact us/sample | period |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for label, weights in cases.items():
        period = ExactSchedule(integer_weights(weights)).period
        for workers in (1, 16, 64, 256):
            batch = args.batch_size

            position = _position(workers, batch)
            random_node = BlendNode([_Forever() for _ in weights], weights, seed=1)
            exact_node = BlendNode([_Forever() for _ in weights], weights, seed=1, mode="exact", position=position)
            samples = args.samples if workers <= 64 or period <= 1 << 16 else args.samples // 10
            print(f"| {label} | {workers} | {per_sample_us(random_node, samples)[0]:.2f} | {per_sample_us(exact_node, samples)[0]:.2f} | {period:,} |")


if __name__ == "__main__":
    main()
