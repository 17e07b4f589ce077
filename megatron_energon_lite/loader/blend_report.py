"""The realized blend against its target, from saved loader states alone (no torch: the
``checkpoint info`` command reads it too)."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError, format_message
from ..format.weight_schedule import target_shares
from ..pipeline.blend import blend_clock, blended_costs, consumed_counts
from ..worker import WorkerConfig, global_position

__all__ = ["blend_report"]


def blend_report(states: dict | list[dict]) -> list[dict[str, Any]]:
    """Samples consumed per blended dataset and their share against the target, computed from
    saved states alone.

    ``states`` is one rank's state (``save_state_rank()``) or all ranks' (``save_state_global``),
    so a blend can be checked while training or from a checkpoint.  Each row holds the dataset's
    ``path``, ``split_part``, ``target_share`` (its normalised weight at the start; for
    ``blend_epochized`` its share of the samples of one pass), ``samples`` consumed so far
    (samples waiting in a shuffle buffer are not counted) and ``share`` of all consumed samples;
    ``clock``, the blend's position in the global stream (the clock of weight schedules: samples
    the blends of all ranks yielded, those waiting in a shuffle buffer included; from one rank's
    state, within a step of it; None when the states do not say), ``target_share_now`` (the
    share at ``clock``) and ``target_share_so_far`` (the mean target share over the clocks
    before it: what ``share`` should be); with constant weights both equal ``target_share``.
    With ``blend_mode="cost"`` also ``cost`` (e.g. tokens) and ``cost_share``, counted as the
    blend yielded them (a shuffle buffer's waiting samples included).
    """
    rank_states = [states] if isinstance(states, dict) else list(states)
    config = rank_states[0].get("config", {}) if rank_states else {}
    datasets = config.get("datasets")
    if not datasets:
        raise ConfigError(format_message("the state holds no blend", expected="a state of a loader over a metadataset with several datasets or a Blender", fix="blend reports exist for blended training datasets"))
    totals = [0] * len(datasets)
    costs = [0] * len(datasets)
    for state in rank_states:
        for worker_state in state["worker_states"]:
            counts = consumed_counts(worker_state, len(datasets)) if worker_state is not None else None
            for i, count in enumerate(counts or ()):
                totals[i] += count
            for i, cost in enumerate((blended_costs(worker_state) if worker_state is not None else None) or ()):
                costs[i] += cost
    consumed = sum(totals)
    clock = _blend_clock(rank_states)
    now = so_far = [leaf["target_share"] for leaf in datasets]
    if config.get("blend_kind") == "blend" and any(leaf.get("weight_schedule") for leaf in datasets) and clock is not None:
        shares = target_shares(datasets)
        now, so_far = shares.at(clock), shares.mean(0, clock)
    rows = [
        {
            "path": leaf["path"],
            "split_part": leaf["split_part"],
            "target_share": leaf["target_share"],
            "samples": count,
            "share": count / consumed if consumed else 0.0,
            "clock": clock,
            "target_share_now": target_now,
            "target_share_so_far": target_so_far,
        }
        for leaf, count, target_now, target_so_far in zip(datasets, totals, now, so_far)
    ]
    if config.get("blend_mode") == "cost":
        # Costs of everything the blends yielded, samples waiting in a shuffle buffer included.
        for row, cost in zip(rows, costs):
            row["cost"] = cost
            row["cost_share"] = cost / sum(costs) if sum(costs) else 0.0
    return rows


def _blend_clock(rank_states: list[dict]) -> int | None:
    """The first global stream position no given worker has delivered yet: each worker's next
    position, the lowest of them (ranks run in lock step, so with every rank's state this is
    the number of samples the whole job has taken; one rank's state is within a step of it)."""
    clocks = []
    for state in rank_states:
        config = state.get("config", {})
        try:
            worker_config = WorkerConfig(rank=int(config["worker_config.rank"]), world_size=int(config["worker_config.world_size"]), num_workers=int(config["worker_config.num_workers"]))
        except (KeyError, TypeError, ValueError):
            return None  # e.g. a state redistributed by the CLI: its topology is decided at restore
        batch = config.get("batch_size") or 1
        for worker, worker_state in enumerate(state["worker_states"]):
            position = global_position(worker_config, batch, worker)
            clock = position(0) if worker_state is None else blend_clock(worker_state, position)
            if clock is not None:
                clocks.append(clock)
    return min(clocks, default=None)
