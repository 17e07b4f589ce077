"""Target and realized blend shares: the table of a metadataset's weight schedule and the PNG
plots that ``info --plot-schedule`` and ``manifest stats --plot`` draw (matplotlib, optional)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import click

from ..format.metadataset import BlendPlan
from ..format.weight_schedule import TargetShares, WeightSchedule

__all__ = ["Shares", "plan_targets", "plot_shares", "schedule_clocks", "schedule_points"]

#: Per row: its clock (samples or steps) and one share per dataset.
Shares = list[tuple[int, list[float]]]


def plan_targets(plan: BlendPlan) -> TargetShares:
    """The target shares of a ``blend`` plan's leaves (constant or scheduled weights)."""
    return TargetShares([float(leaf.weight) for leaf in plan.leaves], [leaf.weight_schedule for leaf in plan.leaves])


def schedule_points(plan: BlendPlan) -> list[int]:
    """Every clock at which some schedule of the plan has a point."""
    points = set()
    for leaf in plan.leaves:
        for siblings, _ in () if leaf.weight_schedule is None else leaf.weight_schedule.levels:
            for weight in siblings:
                if isinstance(weight, WeightSchedule):
                    points.update(x for x, _ in weight.points)
    return sorted(points)


def schedule_clocks(plan: BlendPlan, until: int | None, samples: int = 400) -> tuple[list[int], int]:
    """Clocks to draw the schedule at (evenly spaced, plus each point) and the end of the range:
    ``until``, or a quarter past the last point."""
    points = schedule_points(plan)
    end = until if until is not None else max(1, (points[-1] * 5) // 4 if points else 1000)
    clocks = sorted({*(end * i // samples for i in range(samples + 1)), *(x for x in points if x <= end)})
    return clocks, end


def plot_shares(path: Path, names: Sequence[str], *, realized: Shares | None = None, target: Shares | None = None, xlabel: str, title: str = "") -> bool:
    """Draws each dataset's share over the clock: realized as solid lines, target as dashed lines
    in the same colour (solid when drawn alone).  Returns False (and says so) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        click.echo(f"note: no plot written to {path}: matplotlib is not installed (pip install matplotlib)", err=True)
        return False
    figure, axes = plt.subplots(figsize=(8, 4))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, name in enumerate(names):
        colour = colours[k % len(colours)]
        if realized:
            axes.plot([x for x, _ in realized], [row[k] for _, row in realized], color=colour, label=f"ds{k} {name}")
        if target:
            axes.plot([x for x, _ in target], [row[k] for _, row in target], color=colour, linestyle="--" if realized else "-", label=f"ds{k} target" if realized else f"ds{k} {name}")
    axes.set_xlabel(xlabel)
    axes.set_ylabel("share of samples")
    axes.set_ylim(-0.02, 1.02)
    if title:
        axes.set_title(title, fontsize="medium")
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    click.echo(f"plot written to {path}")
    return True
