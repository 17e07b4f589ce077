"""Weight edits at resume (Megatron-LM issue #457): a state restored into a blend whose weights,
weight schedules or datasets changed since it was saved.

Without an opt-in such a state is refused, naming each change and the opt-in. With it
(``restore_state_rank(state, allow_weight_edit=True)``, ``restore_state_global(...)`` likewise,
or ``ENERGON_LITE_ALLOW_WEIGHT_EDIT=1``) the saved state is rewritten for the new blend before it
is restored, so the loader continues from the saved position with the new mix:

1. Datasets are matched by everything but their weight (path, split, subflavors, subset, ...).
   A kept dataset keeps its source's state: the position in its own epoch order (its slices and
   the offset in them are functions of its size, the topology and the seed, not of the weights),
   so within its running epoch nothing delivered comes again and nothing is skipped; its
   samples waiting in a shuffle buffer or a group bucket above the blend stay there.
2. An added dataset starts fresh (its epoch 0); a removed one is dropped, with its samples
   waiting in buffers (counted in the log line).
3. ``random``: the draw counter goes on, each draw by the new weights.  ``exact``: a new
   schedule of the new weights starts at the global position ``mix_from``, the start of the
   round (one batch of every worker of every rank) of the workers furthest behind; from there the
   blend holds the new weights within one sample at every step.  ``cost`` (the costs counted
   since the start would first be made up at the new weights) and ``blend_epochized`` (a pass
   reads each dataset a fixed number of times) are refused, saying why; so is a packing buffer
   caught open (its replay would read other samples).

Everything here runs in the main process at restore time, on the plain JSON of the state.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

from ..errors import StateError, format_message
from ..pipeline.pack import is_open_pack
from ..pipeline.recipe import global_position
from ..pipeline.state_check import invalid
from ..rng import dataset_seed
from ..worker import WorkerConfig
from .env_settings import WEIGHT_EDIT_ENV, weight_edit_allowed
from .rank_state import REDISTRIBUTED_FROM

__all__ = ["BlendEdit", "apply_weight_edit", "find_blend_edit"]

logger = logging.getLogger("megatron_energon_lite.loader")

#: The parts of a blend dataset's fingerprint that a weight edit may change.
_WEIGHT_KEYS = ("weight", "target_share", "weight_schedule")
_BLEND = "Blend"


@dataclass(frozen=True)
class BlendEdit:
    """How the blend of a saved configuration maps to the current one."""

    #: Per current dataset, its index in the saved blend (None: added).
    saved_index: tuple[int | None, ...]
    #: Saved datasets that are gone.
    removed: tuple[int, ...]
    #: One line per change, for the refusal and the log line.
    changes: tuple[str, ...]
    #: Datasets in the saved blend.
    saved_count: int


def _identity(entry: Any) -> str:
    return json.dumps({k: v for k, v in entry.items() if k not in _WEIGHT_KEYS}, sort_keys=True, default=str) if isinstance(entry, dict) else repr(entry)


def _name(entry: Any) -> str:
    return f"{entry.get('path')} (split {entry.get('split_part')})" if isinstance(entry, dict) else repr(entry)[:80]


def _weight(entry: Any) -> str:
    """A dataset's normalised weight (its share of the blend), with its schedule if any."""
    if not isinstance(entry, dict):
        return "?"
    schedule = entry.get("weight_schedule")
    return f"{entry.get('weight')!r}" + (f" x schedule {json.dumps(schedule, sort_keys=True)}" if schedule is not None else "")


def _target_share(entry: Any) -> str:
    share = entry.get("target_share") if isinstance(entry, dict) else None
    return f"{share:.4g}" if isinstance(share, (int, float)) else repr(share)


def find_blend_edit(saved: dict, current: dict) -> BlendEdit | None:
    """The edit from the blend of configuration ``saved`` to that of ``current`` (None: the
    same datasets with the same weights, or no blend on either side)."""
    old, new = saved.get("datasets"), current.get("datasets")
    if not isinstance(old, list) or not isinstance(new, list) or old == new:
        return None
    unused = list(range(len(old)))
    saved_index: list[int | None] = []
    for entry in new:
        match = next((i for i in unused if _identity(old[i]) == _identity(entry)), None)
        if match is not None:
            unused.remove(match)
        saved_index.append(match)
    changes = []
    for entry, i in zip(new, saved_index):
        if i is None:
            changes.append(f"{_name(entry)}: added (share {_weight(entry)})")
        elif _weight(old[i]) != _weight(entry):
            changes.append(f"{_name(entry)}: share {_weight(old[i])} -> {_weight(entry)}")
        elif _target_share(old[i]) != _target_share(entry):  # same weights, other sizes (blend_epochized: shares follow the data)
            changes.append(f"{_name(entry)}: target share {_target_share(old[i])} -> {_target_share(entry)} (the datasets' sample counts changed)")
    changes += [f"{_name(old[i])}: removed (share {_weight(old[i])})" for i in unused]
    kept = [i for i in saved_index if i is not None]
    if kept != sorted(kept):
        changes.append("the datasets' order changed")
    return BlendEdit(tuple(saved_index), tuple(unused), tuple(changes or ["the blend's datasets changed"]), len(old))


def _unsupported(saved: dict, current: dict) -> str | None:
    """Why an edit of this blend cannot be applied (None: it can)."""
    kind, mode = current.get("blend_kind"), current.get("blend_mode")
    if not current.get("training"):
        return "a validation loader reads its datasets one after another: it has no mix to edit"
    if kind == "blend_epochized":
        return "a blend_epochized pass reads each dataset a fixed number of times (its repetitions); its datasets cannot change within a pass"
    if mode == "cost":
        return "blend_mode cost balances the costs counted since the start of the run: new weights would first make up the whole past difference (a long run of one dataset)"
    if "composition" in current or "composition" in saved:
        return "the task encoder composes its own pipeline (build_* overrides): its stages' states are its own"
    return None


def _refusal(what: str, edit: BlendEdit, where: str, fix: str) -> StateError:
    return StateError(format_message(what, where=where, found="\n" + "\n".join(f"    {line}" for line in edit.changes), fix=fix))


def apply_weight_edit(states: Sequence[Any], current: dict, current_data: list | None, *, allow: bool | None) -> list[Any]:
    """``states`` (every rank's, or one rank's as a one-item list) rewritten for the blend of
    the ``current`` configuration (``current_data``: the loader's data record), when their blend
    differs from it and the edit is allowed (``allow``, else ``ENERGON_LITE_ALLOW_WEIGHT_EDIT``);
    unchanged when it does not differ; else a :class:`StateError` naming each change."""
    states = list(states)
    first = next((s for s in states if isinstance(s, dict) and isinstance(s.get("config"), dict)), None)
    if first is None:
        return states
    saved = first["config"]
    edit = find_blend_edit(saved, current)
    if edit is None:
        return states
    if any(saved.get(k) != current.get(k) for k in ("blend_kind", "blend_mode")):
        return states  # not a weight edit: the configuration check refuses, naming what differs
    reason = _unsupported(saved, current)
    where = f"the blend of {current.get('path')} (split {current.get('split_part')})"
    if reason is not None:
        raise _refusal(f"the blend changed since the state was saved, and this change cannot be applied at resume: {reason}", edit, where,
                       "restore into the blend and the data the state was saved with (the saved weights, datasets and shards)")
    if not weight_edit_allowed(allow):
        raise _refusal(
            "the blend's weights or datasets changed since the state was saved", edit, where,
            "to continue from the saved position with the new mix (samples already delivered of each dataset's running epoch are not "
            f"delivered again), restore with allow_weight_edit=True (restore_state_rank / restore_state_global) or set {WEIGHT_EDIT_ENV}=1; "
            "otherwise build the loader with the saved metadataset",
        )
    rewritten, dropped, mix_from = _rewrite_all(states, edit, current, current_data)
    logger.info(
        "weight edit at resume of %s: %s%s%s",
        where,
        "; ".join(edit.changes),
        f"; {sum(dropped.values())} sample(s) of removed datasets waiting in buffers dropped" if dropped else "",
        f"; the exact schedule of the new weights starts at global position {mix_from}" if mix_from is not None else "",
    )
    return rewritten


def _rewrite_all(states: list[Any], edit: BlendEdit, current: dict, current_data: list | None) -> tuple[list[Any], Counter, int | None]:
    """Every state rewritten (a redistributed one through the states it holds); the exact
    schedule's start is shared by all of them."""
    flat = [inner for s in states for inner in (s[REDISTRIBUTED_FROM] if isinstance(s, dict) and isinstance(s.get(REDISTRIBUTED_FROM), list) else [s])]
    mix_from = None
    if current.get("blend_mode") == "exact":
        starts = [_round_start(s) for s in flat if isinstance(s, dict)]
        mix_from = min(starts, default=0)
    dropped: Counter = Counter()
    rewritten = []
    for state in states:
        if isinstance(state, dict) and isinstance(state.get(REDISTRIBUTED_FROM), list):
            inner = [_rewrite(s, edit, current, current_data, mix_from, dropped) for s in state[REDISTRIBUTED_FROM]]
            rewritten.append({**state, "config": _edited_config(state.get("config"), current), REDISTRIBUTED_FROM: inner})
        else:
            rewritten.append(_rewrite(state, edit, current, current_data, mix_from, dropped))
    return rewritten, dropped, mix_from


def _edited_config(config: Any, current: dict) -> Any:
    """The saved configuration with the current blend (its other keys are still compared)."""
    if not isinstance(config, dict):
        return config
    return {**config, "datasets": current.get("datasets"), "path": current.get("path")}


def _pick(values: Any, edit: BlendEdit, fresh: Any, what: str) -> list:
    if not isinstance(values, list) or len(values) != edit.saved_count:
        raise invalid((what,), "one entry per dataset of the saved blend", values, stage=_BLEND)
    return [fresh if i is None else values[i] for i in edit.saved_index]


def _rewrite(state: Any, edit: BlendEdit, current: dict, current_data: list | None, mix_from: int | None, dropped: Counter) -> Any:
    if not isinstance(state, dict) or not isinstance(state.get("worker_states"), list):
        return state  # the restore's own checks name what is wrong with it
    out = {**state, "config": _edited_config(state.get("config"), current)}
    wc = _saved_topology(state)
    out["worker_states"] = [_rewrite_stage(w, edit, mix_from, dropped, wc.worker_seed(local)) for local, w in enumerate(state["worker_states"])]
    if isinstance(state.get("data"), list) and current_data is not None:
        # Another length: left as it is, for the data check to name.
        if len(state["data"]) == edit.saved_count:
            out["data"] = [current_data[j] if i is None else state["data"][i] for j, i in enumerate(edit.saved_index)]
    skips = state.get("sample_skips")
    if isinstance(skips, dict) and isinstance(skips.get("samples"), list):
        out["sample_skips"] = {**skips, "samples": _renumbered_skips(skips["samples"], edit)}
    return out


def _renumbered_skips(samples: list, edit: BlendEdit) -> list:
    """A saved skip list (``sample_skips.py``) names samples by dataset index: the current
    index of each kept dataset; samples of removed datasets are dropped (nothing to skip)."""
    current = {saved: now for now, saved in enumerate(edit.saved_index) if saved is not None}
    out = []
    for sample in samples:
        if isinstance(sample, dict) and sample.get("dataset") in current:
            out.append({**sample, "dataset": current[sample["dataset"]]})
        elif not isinstance(sample, dict) or not isinstance(sample.get("dataset"), int) or isinstance(sample.get("dataset"), bool):
            out.append(sample)  # malformed: left for the restore's own check to name
    return out


def _rewrite_stage(node: Any, edit: BlendEdit, mix_from: int | None, dropped: Counter, worker_seed: int) -> Any:
    """A worker's pipeline state (or a stage's) for the new blend: the Blend stage's per-dataset
    lists remapped, and the restore keys of blended samples waiting above it renumbered."""
    if not isinstance(node, dict):
        return node
    stage = node.get("stage")
    if stage == _BLEND:
        return _rewrite_blend(node, edit, mix_from, worker_seed)
    out = dict(node)
    if is_open_pack(node):
        raise StateError(
            format_message(
                "a weight edit at resume cannot be applied to a state saved with a packing buffer open: the buffer is replayed "
                "from the blend, which would now read other samples",
                where="the Pack stage's state",
                fix="restore into the saved blend, save again where the packing buffer is used up, then edit the weights; or restore without packing",
            )
        )
    if stage == "Shuffle" and isinstance(node.get("buffer"), list):
        out["buffer"] = _renumbered(node["buffer"], edit, dropped)
    if stage == "Group" and isinstance(node.get("buckets"), list):
        buckets = [[b[0], b[1], _renumbered(b[2], edit, dropped)] for b in node["buckets"] if isinstance(b, (list, tuple)) and len(b) == 3 and isinstance(b[2], (list, tuple))]
        out["buckets"] = [b for b in buckets if b[2]]
    if "source" in node:
        out["source"] = _rewrite_stage(node["source"], edit, mix_from, dropped, worker_seed)
    if isinstance(node.get("sources"), list):
        out["sources"] = [_rewrite_stage(s, edit, mix_from, dropped, worker_seed) for s in node["sources"]]
    return out


def _renumbered(keys: list, edit: BlendEdit, dropped: Counter) -> list:
    """Restore keys ``("Blend", saved index, ...)`` with the current index; those of removed
    datasets left out (counted in ``dropped``)."""
    new_index = {i: j for j, i in enumerate(edit.saved_index) if i is not None}
    out = []
    for key in keys:
        if isinstance(key, (list, tuple)) and len(key) >= 2 and key[0] == _BLEND and isinstance(key[1], int):
            if key[1] not in new_index:
                dropped[key[1]] += 1
                continue
            key = type(key)([key[0], new_index[key[1]], *key[2:]])
        out.append(key)
    return out


def _rewrite_blend(blend: dict, edit: BlendEdit, mix_from: int | None, worker_seed: int) -> dict:
    out = dict(blend)
    sources = _pick(blend.get("sources"), edit, None, "sources")
    # A dataset's slice order and draws come from a seed of its place in the blend: one that
    # moved keeps the seed of the place it was saved from (its source state says so).
    out["sources"] = [s if i is None or i == j else _with_seed(s, dataset_seed(worker_seed, i)) for j, (i, s) in enumerate(zip(edit.saved_index, sources))]
    out["counts"] = _pick(blend.get("counts"), edit, 0, "counts")
    out["costs"] = _pick(blend.get("costs"), edit, 0, "costs")
    out["exhausted"] = _pick(blend.get("exhausted"), edit, False, "exhausted")
    if mix_from is not None:
        out["schedule"] = None  # a new schedule: the new weights' from mix_from on
        out["mix_from"] = mix_from
    return out


def _with_seed(node: Any, seed: int) -> Any:
    """A dataset's pipeline state with ``seed`` on its Source stage (one set by an earlier
    edit stays: it is the seed the dataset was read with from the start)."""
    if not isinstance(node, dict):
        return node
    if node.get("stage") == "Source":
        return node if "seed" in node else {**node, "seed": seed}
    return {**node, **({"source": _with_seed(node["source"], seed)} if "source" in node else {})}


def _blend_of(node: Any) -> dict | None:
    if not isinstance(node, dict):
        return None
    if node.get("stage") == _BLEND:
        return node
    for child in [node.get("source"), *(node.get("sources") if isinstance(node.get("sources"), list) else [])]:
        found = _blend_of(child)
        if found is not None:
            return found
    return None


def _saved_topology(state: dict) -> WorkerConfig:
    config = state.get("config") if isinstance(state.get("config"), dict) else {}
    try:
        return WorkerConfig(
            rank=int(config["worker_config.rank"]),
            world_size=int(config["worker_config.world_size"]),
            num_workers=int(config["worker_config.num_workers"]),
            seed_offset=int(config.get("worker_config.seed_offset", 0)),
        )
    except (KeyError, TypeError, ValueError):
        raise invalid(("config",), "the saved topology (worker_config.rank, world_size, num_workers)", config) from None


def _round_start(state: dict) -> int:
    """The global position where the round (one batch of every worker of every rank) of this
    rank's furthest-behind worker begins: where an exact blend's new schedule starts.  The
    ranks deliver their batches in step, so every rank finds the same round."""
    wc = _saved_topology(state)
    config = state["config"]
    batch = config.get("batch_size") or 1
    round_length = wc.world_size * wc.workers_per_rank * batch
    starts = []
    for local, worker_state in enumerate(state.get("worker_states") or []):
        blend = _blend_of(worker_state) or {}
        offset, emitted = blend.get("offset", 0), blend.get("emitted", 0)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (offset, emitted)):
            raise invalid(("worker_states", local), "a Blend stage with emitted and offset >= 0", {"emitted": emitted, "offset": offset}, stage=_BLEND)
        clock = offset + global_position(wc, batch, local)(emitted)
        starts.append(offset + (clock - offset) // round_length * round_length)
    return min(starts, default=0)
