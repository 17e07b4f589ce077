"""Datasets that grew between save and restore: shards appended after the saved ones.

The restore check (``rank_state.check_saved_data``) finds the datasets whose saved shards are all
still there, unchanged and in their places, with new shards after them.  Their split indices
are the same as before, but every worker's slices (and, through the rotation of remainders, the
slices of the datasets after them) are not.  So each worker's state is rewritten: the pipeline
is built over the data as it was (each grown dataset cut back to its saved shards), restored from
the saved state, and each source's rest of its running epoch is written as carried ranges
(``SliceSource.running_epoch_carried``) that the source over the grown data reads first, in the
same order and with the same draws; its next epoch is its own, over every shard.  The running
epoch thus resumes exactly; the new shards join from the next epoch.  One log line says so.

Not supported (refused, saying why): a ``blend_epochized`` blend (a pass's weights are the
datasets' sizes), a pipeline the task encoder composes itself, and a packing buffer caught open
(it replays from an earlier state of the sources).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Sequence

from ..errors import NotSupportedError, StateError, format_message
from ..format.resolved import data_record, shard_prefix
from ..pipeline.node import Node
from ..pipeline.pack import is_open_pack
from ..pipeline.passes import on_top
from ..pipeline.recipe import Watchdog, passes_continue
from ..pipeline.source import SliceSource
from ..worker import WorkerConfig
from .dataset import PipelineDataset
from .env_settings import JOIN_NEW_SHARDS_ENV
from .rank_state import REDISTRIBUTED_FROM, PrefixRecord, TOPOLOGY_KEYS

__all__ = ["cannot_carry", "grown_states", "pipeline_of", "prefix_records", "with_datasets"]

logger = logging.getLogger("megatron_energon_lite.loader")


def pipeline_of(dataset: Any) -> PipelineDataset | None:
    """The loader's own pipeline under the (transparent) watchdog; None for anything else."""
    while isinstance(dataset, Watchdog):
        dataset = dataset.dataset
    return dataset if isinstance(dataset, PipelineDataset) else None


def prefix_records(dataset: Any) -> PrefixRecord | None:
    """``(k, n)`` -> the data record of dataset ``k`` of ``dataset`` cut to its first ``n``
    shards (None when ``dataset`` is not the loader's own pipeline: nothing is recognised as
    appended)."""
    dataset = pipeline_of(dataset)
    if dataset is None:
        return None
    spec = dataset.spec

    def record(k: int, shards: int) -> dict:
        resolved = spec.datasets[k]
        if resolved.split is None or shards > len(resolved.split.names):
            return {"digest": None, "samples": None}
        leaf = spec.plan.leaves[k]
        return data_record(leaf.path, leaf.split_part, shard_prefix(resolved, shards))

    return record


def cannot_carry(dataset: PipelineDataset) -> str | None:
    """Why the running epoch of ``dataset`` cannot be carried over to data that changed since
    the save (None: it can)."""
    if dataset.composed:
        return "the task encoder composes its own pipeline (build_* overrides)"
    if dataset.spec.training and dataset.spec.plan.kind == "blend_epochized":
        return "a blend_epochized pass mixes the datasets by their sizes"
    return None


def with_datasets(spec: Any, datasets: Sequence[Any]) -> Any:
    """``spec`` reading ``datasets`` (the data as it was saved) instead of its own."""
    saved_spec = dataclasses.replace(spec)
    saved_spec.__dict__["datasets"] = tuple(datasets)
    saved_spec.__dict__["hooks"] = spec.hooks
    return saved_spec


def grown_states(states: Sequence[Any], dataset: Any, grown: dict[int, int]) -> list[Any]:
    """``states`` (one rank's as a one-item list, or every rank's) rewritten so that the datasets
    in ``grown`` (``{dataset index: saved shard count}``) finish their running epoch on the saved
    shards; unchanged when ``grown`` is empty."""
    states = list(states)
    if not grown:
        return states
    dataset = pipeline_of(dataset)  # prefix_records found it: grown is empty without one
    spec = dataset.spec
    why = cannot_carry(dataset)
    names = [f"{spec.plan.leaves[k].path} (split {spec.split_part})" for k in sorted(grown)]
    if why is not None:
        raise NotSupportedError(
            format_message(
                f"shards were appended to {', '.join(names)} since the state was saved, and this loader cannot finish the running epoch on the saved shards: {why}",
                fix="restore into the data the state was saved with, or start the epoch anew without this state",
            )
        )
    saved_spec = with_datasets(spec, [shard_prefix(d, grown[k]) if k in grown else d for k, d in enumerate(spec.datasets)])
    rewritten = []
    for state in states:
        if isinstance(state, dict) and isinstance(state.get(REDISTRIBUTED_FROM), list):
            rewritten.append({**state, REDISTRIBUTED_FROM: [_rewrite(s, dataset, saved_spec) for s in state[REDISTRIBUTED_FROM]]})
        else:
            rewritten.append(_rewrite(state, dataset, saved_spec))
    added = [
        f"{name}: {len(spec.datasets[k].split.names) - grown[k]} shard(s) appended ({spec.datasets[k].total - saved_spec.datasets[k].total} samples)"
        for name, k in zip(names, sorted(grown))
    ]
    logger.info(
        "restoring into grown data: %s; the running epoch finishes on the shards the state was saved with, the new shards join from the next epoch "
        "(join_new_shards=True or %s=1: they join the running one)", "; ".join(added), JOIN_NEW_SHARDS_ENV,
    )
    return rewritten


def _rewrite(state: Any, dataset: PipelineDataset, saved_spec: Any) -> Any:
    if not isinstance(state, dict) or not isinstance(state.get("worker_states"), list) or not isinstance(state.get("config"), dict):
        return state  # the restore's own checks name what is wrong with it
    config = state["config"]
    try:
        wc = WorkerConfig(**{k.partition(".")[2]: int(config[k]) for k in TOPOLOGY_KEYS}, seed_offset=int(config.get("worker_config.seed_offset", 0)))
    except (KeyError, TypeError, ValueError):
        return state
    restart = not passes_continue(dataset)
    then = PipelineDataset(saved_spec.with_topology(wc))
    now = dataset.with_topology(wc)
    worker_states = []
    for local, worker_state in enumerate(state["worker_states"]):
        old = on_top(then.build_worker(local), restart=restart)
        old.reset(worker_state)  # None: not started; its whole first epoch is on the saved shards
        worker_states.append(_carried(old, on_top(now.build_worker(local), restart=restart), old.get_state()))
    return {**state, "worker_states": worker_states}


def _carried(old: Node, new: Node, state: Any) -> Any:
    """``state`` (``old``'s) with each source's state replaced by its running epoch carried over
    to ``new``'s source at the same place."""
    if isinstance(old, SliceSource):
        return old.running_epoch_carried(len(new.slices))
    if not isinstance(state, dict):
        return state
    if is_open_pack(state):
        raise StateError(
            format_message(
                "shards were appended since the state was saved, and it was saved with a packing buffer open: the buffer "
                "replays from an earlier state of the sources, which cannot be carried to the grown data",
                fix="restore into the data the state was saved with, or start the epoch anew without this state",
            )
        )
    inputs_old, inputs_new = list(old.inputs()), list(new.inputs())
    if len(inputs_old) == 1 and state.get("stage") != getattr(old, "tag", None):  # a transparent stage (the watchdog)
        return _carried(inputs_old[0], inputs_new[0], state)
    out = dict(state)
    if "source" in state and len(inputs_old) == 1:
        out["source"] = _carried(inputs_old[0], inputs_new[0], state["source"])
    elif isinstance(state.get("sources"), list) and len(state["sources"]) == len(inputs_old):
        out["sources"] = [_carried(o, n, s) for o, n, s in zip(inputs_old, inputs_new, state["sources"])]
    return out
