"""What choosing each sample's dataset costs in a blend, per sample, in one worker.

Random mode draws once per sample.  Exact mode reads the global schedule at this worker's
positions: with ``W`` global workers (ranks x dataloader workers) and batch size ``B`` a worker
jumps ``W x B`` positions per batch.  Small periods (weights like 6/3/1) are tabulated, so a
jump is a lookup; weights with a huge common denominator (dataset sizes as weights) step through
every position in between.  Run:

    .venv/bin/python benchmarks/bench_blend.py
"""

from __future__ import annotations

import argparse
import time

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


def per_sample_us(node: BlendNode, samples: int) -> float:
    start = time.perf_counter()
    for _ in range(samples):
        node.next()
    return (time.perf_counter() - start) / samples * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    cases = {"6/3/1 (tabulated)": [6, 3, 1], "dataset sizes 1234567/7654321/999983 (stepped)": [1234567, 7654321, 999983]}
    print(f"| weights | global workers | random us/sample | exact us/sample | period |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for label, weights in cases.items():
        period = ExactSchedule(integer_weights(weights)).period
        for workers in (1, 16, 64, 256):
            batch = args.batch_size

            def position(n: int, w=workers) -> int:
                k, j = divmod(n, batch)
                return (k * w) * batch + j  # this worker is global worker 0

            random_node = BlendNode([_Forever() for _ in weights], weights, seed=1)
            exact_node = BlendNode([_Forever() for _ in weights], weights, seed=1, mode="exact", position=position)
            samples = args.samples if workers <= 64 or period <= 1 << 16 else args.samples // 10
            print(f"| {label} | {workers} | {per_sample_us(random_node, samples):.2f} | {per_sample_us(exact_node, samples):.2f} | {period:,} |")


if __name__ == "__main__":
    main()
