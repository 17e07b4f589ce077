"""Recipes: what the loader needs of a dataset, and one recipe per pipeline stage.

A recipe is built once in the main process; in each dataloader worker, ``build_worker`` makes the
chain of stages (:mod:`.node`) that does the work. The loader, elastic resume, the mock mode and
the map view only use the :class:`Recipe` contract below. Stage recipes are small dataclasses:
their fields are the stage's settings (plain values and the user's functions), so two recipes
that build the same stages compare equal, and ``with_topology`` gives the same recipe for another
rank or number of workers. ``pipeline/build.py`` composes them (the default pipeline of a spec, and
the steps Energon's ``build_*`` methods take); Energon's dataset wrappers are these recipes under
Energon's names and signatures.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
from typing import Any, Callable, Generic, Hashable, Iterator, Sequence, TypeVar

import torch.utils.data

from ..errors import ConfigError, NotSupportedError, WatchdogTimeoutError, format_message
from ..worker import WorkerConfig, global_position
from .batch import BatchNode
from .blend import BlendNode
from .concat import ConcatNode
from .filter import FilterNode
from .group import GroupBatchNode
from .guard import SampleGuard
from .hooks import batch_member_context, stage_hook
from .map import MapNode
from .node import Node, unkeyed
from .pack import PackNode
from .passes import PassNode
from .repeat import RepeatNode
from .runtime import Runtime
from .shuffle import ShuffleBufferNode
from .skip import skipping
from .watchdog import WatchdogNode

__all__ = [
    "CUT_FROM_STREAM",
    "ENDLESS",
    "ENDS_WITH_DATA",
    "Batch",
    "Blend",
    "Concat",
    "Filter",
    "GroupBatch",
    "Map",
    "Pack",
    "Pass",
    "Recipe",
    "Repeat",
    "Shuffle",
    "Watchdog",
    "check_takes_runtime",
    "function_config",
    "pass_end",
    "passes_continue",
    "share",
]

T = TypeVar("T")

logger = logging.getLogger(__name__)


def share(length: int, num_workers: int, local_worker_id: int) -> int:
    """Energon's per-worker share of a per-rank length (virtual epochs, limit)."""
    return length // num_workers + (1 if local_worker_id < length % num_workers else 0)


def function_config(fn: Any) -> str:
    """``module.qualname`` of a function (partials and bound methods too), for config fingerprints."""
    fn = getattr(fn, "func", fn)
    fn = getattr(fn, "__func__", fn)
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"


class Recipe(torch.utils.data.IterableDataset, Generic[T]):
    """What ``get_loader`` needs of a dataset: each worker's stages, lengths and a config.

    Iterate through ``get_loader`` / ``get_savable_loader`` (they run the workers and keep the
    state); iterating the object itself yields the items of worker 0 without state.
    """

    worker_config: WorkerConfig

    def build_worker(self, local_worker_id: int, runtime: Runtime | None = None) -> Node:
        """The stages of dataloader worker ``local_worker_id`` of this rank (0 without workers).

        ``runtime``: what the loader lends this worker's pipeline (``pipeline/runtime.py``: its
        clock, skip sink, cache pool, report channel); a recipe hands it to every input it builds
        and to the stages that use it.  None: the pipeline runs on its own (an empty runtime)."""
        raise NotImplementedError

    def worker_length(self, local_worker_id: int) -> int:
        """Items worker ``local_worker_id`` yields per pass (Energon's ``len_worker``)."""
        raise NotImplementedError

    def config(self) -> dict[str, Any]:
        """Plain JSON describing what this dataset yields, saved with states and checked on restore."""
        raise NotImplementedError

    def data_record(self) -> list[dict[str, Any]] | None:
        """What the data looked like when the dataset was made (per dataset: its shards, their
        sample counts, a digest of them), saved with states so that a restore can say what
        changed since; None: this dataset does not say."""
        return None

    def with_topology(self, worker_config: WorkerConfig) -> Recipe[T]:
        """The same dataset for another rank or topology (elastic resume, ``loader/elastic.py``)."""
        raise NotSupportedError(
            format_message(
                f"restoring a {type(self).__name__} on another topology is not supported: it is not one of the "
                "pipeline's stage recipes (a dataset class of your own, or an Energon stage without one)",
                fix="restore on the topology the state was saved with, or compose the pipeline from the wrappers "
                "of megatron_energon_lite (MapDataset, BatchDataset, ...)",
            )
        )

    def input_recipes(self) -> Sequence[Recipe[Any]]:
        """The recipes this one reads from (none for a source, or a dataset class of the user's own)."""
        return ()

    def __len__(self) -> int:
        return sum(self.worker_length(w) for w in range(self.worker_config.workers_per_rank))

    def __iter__(self) -> Iterator[T]:
        # Items as the hooks made them (a plain dict without the restore key it carries inside).
        return map(unkeyed, self.build_worker(self.worker_config.current_worker_id(type(self).__name__)))

    # --- for stage recipes --------------------------------------------------------------------
    def _stage_fn(self, fn: Callable[..., Any], local_worker_id: int, runtime: Runtime | None, *, batch: bool = False) -> Callable[[Any, int], Any]:
        """``fn`` as a stage calls it: with a sample index unique over this rank's workers, seeded
        for ``@stateless(restore_seeds=True)`` functions, None refused with a clear error."""
        wc = self.worker_config
        return stage_hook(fn, worker_seed=wc.worker_seed(local_worker_id), local_worker_id=local_worker_id, workers=wc.workers_per_rank, batch=batch, runtime=runtime)

    def _guard(self, runtime: Runtime | None, stage: str, tolerance: int, dataset: int | None = None) -> SampleGuard:
        return SampleGuard(self.worker_config.global_error_handler, tolerance=tolerance, stage=stage, dataset=dataset, runtime=runtime)


stage_recipe = dataclasses.dataclass(eq=True, repr=False)


class StageRecipe(Recipe[T]):
    """A stage over one or more input recipes (the dataclass fields ``dataset`` or ``datasets``)."""

    @property
    def inputs(self) -> list[Recipe[Any]]:
        datasets = getattr(self, "datasets", None)
        return list(datasets) if datasets is not None else [self.dataset]

    def input_recipes(self) -> Sequence[Recipe[Any]]:
        return tuple(self.inputs)

    def worker_length(self, local_worker_id: int) -> int:
        return self.inputs[0].worker_length(local_worker_id)

    def with_topology(self, worker_config: WorkerConfig) -> StageRecipe[T]:
        """The same stage (as the core's recipe, also for Energon's wrapper classes) over its
        inputs for another topology."""
        core = next(c for c in type(self).__mro__ if "__dataclass_fields__" in vars(c) and c.__module__ == __name__)
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(core)}
        fields["worker_config"] = worker_config
        if "datasets" in fields:
            fields["datasets"] = tuple(d.with_topology(worker_config) for d in self.datasets)
        else:
            fields["dataset"] = self.dataset.with_topology(worker_config)
        return core(**fields)

    def config(self) -> dict[str, Any]:
        return {"type": type(self).__name__, **self.own_config(), "datasets": [d.config() for d in self.inputs]}

    def own_config(self) -> dict[str, Any]:
        """This stage's own settings for :meth:`config` (plain JSON)."""
        return {}

    def data_record(self) -> list[dict[str, Any]] | None:
        """Its inputs' records, one after the other (None if one of them does not say)."""
        records = [d.data_record() for d in self.inputs]
        return None if any(r is None for r in records) else [entry for r in records for entry in r]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(repr(d) for d in self.inputs)})"


@stage_recipe
class Repeat(StageRecipe[T]):
    """The input again and again (``repeats`` None), or ``repeats`` times (a fraction ends with
    part of a pass). ``count_samples``: the node is told the input's items per pass (needed for
    a fractional count)."""

    dataset: Recipe[Any]
    worker_config: WorkerConfig
    repeats: float | None = None
    count_samples: bool = True

    def __post_init__(self) -> None:
        RepeatNode.check_repeats(self.repeats)

    def build_worker(self, local_worker_id: int, runtime: Runtime | None = None) -> Node:
        samples = self.dataset.worker_length(local_worker_id) if self.count_samples else None
        return RepeatNode(self.dataset.build_worker(local_worker_id, runtime), self.repeats, worker_samples=samples)

    def worker_length(self, local_worker_id: int) -> int:
        inner = self.dataset.worker_length(local_worker_id)
        return inner if self.repeats is None else int(inner * self.repeats)

    def own_config(self) -> dict[str, Any]:
        return {"repeats": None if self.repeats is None else (self.repeats if math.isfinite(self.repeats) else str(self.repeats))}


@stage_recipe
class Blend(StageRecipe[T]):
    """Each item from one of ``datasets`` by weight: ``mode`` "random" (drawn from the worker seed
    and draw number), "exact" (a schedule within one item of the weights) or "cost" (by the
    ``cost`` of the items taken). ``global_batch``: exact schedules follow the global training
    stream (step, rank, position in a batch of that size) instead of this worker's own.
    ``worker_weights``: the weights on each worker are the items each input yields there (an
    exact epochized blend). Weights that add up to 0 (no items at all) blend evenly."""

    datasets: tuple[Recipe[Any], ...]
    worker_config: WorkerConfig
    weights: tuple[Any, ...]
    mode: str = "random"
    names: tuple[str, ...] | None = None
    infinite: bool = False
    cost: Callable[[Any], int] | None = None
    global_batch: int | None = None
    worker_weights: bool = False
    #: Per dataset, its weight's schedule (None: constant), or None when no weight is scheduled.
    schedules: tuple[Any, ...] | None = None

    def build_worker(self, local_worker_id: int, runtime: Runtime | None = None) -> Node:
        wc = self.worker_config
        position = None if self.global_batch is None else global_position(wc, self.global_batch, local_worker_id)
        weights = [d.worker_length(local_worker_id) for d in self.datasets] if self.worker_weights else list(self.weights)
        if sum(weights) == 0:
            weights = [1] * len(weights)  # this worker has no items at all: the blend is empty
        return BlendNode(
            [d.build_worker(local_worker_id, runtime) for d in self.datasets],
            weights,
            seed=wc.worker_seed(local_worker_id),
            mode=self.mode,
            position=position,
            names=None if self.names is None else list(self.names),
            infinite=self.infinite,
            cost=self.cost,
            position_batch=self.global_batch or 1,
            schedules=self.schedules,
        )

    def worker_length(self, local_worker_id: int) -> int:
        return sum(d.worker_length(local_worker_id) for d in self.datasets)

    @property
    def dataset_weights(self) -> tuple[tuple[Recipe[Any], Any], ...]:
        """``((dataset, weight), ...)``, as Energon's ``BlendDataset`` names its inputs."""
        return tuple(zip(self.datasets, self.weights))

    def own_config(self) -> dict[str, Any]:
        scheduled = {"schedules": [None if s is None else s.describe() for s in self.schedules]} if self.schedules is not None else {}
        return {"weights": [float(w) for w in self.weights], "mode": self.mode, **scheduled}


@stage_recipe
class Concat(StageRecipe[T]):
    """The inputs one after the other."""

    datasets: tuple[Recipe[Any], ...]
    worker_config: WorkerConfig

    def build_worker(self, local_worker_id: int, runtime: Runtime | None = None) -> Node:
        return ConcatNode([d.build_worker(local_worker_id, runtime) for d in self.datasets])

    def worker_length(self, local_worker_id: int) -> int:
        return sum(d.worker_length(local_worker_id) for d in self.datasets)


@stage_recipe
class Shuffle(StageRecipe[T]):
    """A shuffle buffer of ``size`` items, drawn from the worker seed."""

    dataset: Recipe[Any]
    worker_config: WorkerConfig
    size: int

    def build_worker(self, local_worker_id: int, runtime: Runtime | None = None) -> Node:
        return ShuffleBufferNode(self.dataset.build_worker(local_worker_id, runtime), self.size, seed=self.worker_config.worker_seed(local_worker_id))

    def own_config(self) -> dict[str, Any]:
        return {"size": self.size}


@stage_recipe
class Map(StageRecipe[T]):
    """``fn`` on every item (a generator ``fn`` gives 0..n outputs); its failures are the
    ``stage``'s, tolerated ``tolerance`` times in a row; ``tag`` names the stage in restore keys;
    ``batch``: ``fn`` takes batches (it sees the batch index)."""

    dataset: Recipe[Any]
    worker_config: WorkerConfig
    fn: Callable[[Any], Any]
    stage: str = "map"
    tolerance: int = 100
    tag: str = "Map"
    batch: bool = False

    def build_worker(self, local_worker_id: int, runtime: Runtime | None = None) -> Node:
        return MapNode(
            self.dataset.build_worker(local_worker_id, runtime),
            self._stage_fn(self.fn, local_worker_id, runtime, batch=self.batch),
            guard=self._guard(runtime, self.stage, self.tolerance),
            tag=self.tag,
        )

    def own_config(self) -> dict[str, Any]:
        return {"map_fn": function_config(self.fn)}


@stage_recipe
class Filter(StageRecipe[T]):
    """Only the items ``predicate`` keeps."""

    dataset: Recipe[Any]
    worker_config: WorkerConfig
    predicate: Callable[[Any], bool]
    tolerance: int = 100

    def build_worker(self, local_worker_id: int, runtime: Runtime | None = None) -> Node:
        return FilterNode(self.dataset.build_worker(local_worker_id, runtime), self._stage_fn(self.predicate, local_worker_id, runtime), guard=self._guard(runtime, "filter", self.tolerance))

    def own_config(self) -> dict[str, Any]:
        return {"filter_fn": function_config(self.predicate)}


@stage_recipe
class Pack(StageRecipe[T]):
    """Sequence packing: ``select`` splits a full buffer of ``buffer_size`` items into groups,
    ``postencode`` (optional) encodes each chosen member, ``pack`` builds one item of a group."""

    dataset: Recipe[Any]
    worker_config: WorkerConfig
    buffer_size: int
    select: Callable[[list[Any]], list[list[Any]]]
    pack: Callable[[list[Any]], Any]
    postencode: Callable[[Any], Any] | None = None
    allow_drop: bool = True
    tolerance: int = 100
    select_tolerance: int = 100

    def build_worker(self, local_worker_id: int, runtime: Runtime | None = None) -> Node:
        return PackNode(
            skipping(self.dataset.build_worker(local_worker_id, runtime), runtime),  # a replay's skips enter here
            self.buffer_size,
            self._stage_fn(self.select, local_worker_id, runtime),
            self._stage_fn(self.pack, local_worker_id, runtime),
            postencode=None if self.postencode is None else self._stage_fn(self.postencode, local_worker_id, runtime),
            allow_drop=self.allow_drop,
            guard=self._guard(runtime, "pack_selected_samples", self.tolerance),
            select_guard=self._guard(runtime, "select_samples_to_pack", self.select_tolerance),
        )

    def own_config(self) -> dict[str, Any]:
        return {
            "buffer_size": self.buffer_size,
            "pre_packer": function_config(self.select),
            "final_packer": function_config(self.pack),
            "sample_encoder": None if self.postencode is None else function_config(self.postencode),
        }


@stage_recipe
class GroupBatch(StageRecipe[T]):
    """Batches of items with equal ``criterion`` keys (each key may set its own batch size);
    ``max_buffered`` bounds the items the buckets hold together."""

    dataset: Recipe[Any]
    worker_config: WorkerConfig
    batch_size: int | None
    criterion: Callable[[Any], tuple[Hashable, int | None]]
    batcher: Callable[[list[Any]], Any]
    drop_last: bool = False
    tolerance: int = 100
    max_buffered: int | None = None

    def build_worker(self, local_worker_id: int, runtime: Runtime | None = None) -> Node:
        return GroupBatchNode(
            skipping(self.dataset.build_worker(local_worker_id, runtime), runtime),  # a replay's skips enter here
            self._stage_fn(self.criterion, local_worker_id, runtime),
            self._stage_fn(self.batcher, local_worker_id, runtime, batch=True),
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            max_buffered=self.max_buffered,
            guard=self._guard(runtime, "batch", self.tolerance),
        )

    def own_config(self) -> dict[str, Any]:
        return {"fixed_batch_size": self.batch_size, "sample_group_key": function_config(self.criterion), "batcher": function_config(self.batcher), "drop_last": self.drop_last}


@stage_recipe
class Batch(StageRecipe[T]):
    """Consecutive items in batches of ``batch_size``, made by ``batcher``."""

    dataset: Recipe[Any]
    worker_config: WorkerConfig
    batch_size: int
    batcher: Callable[[list[Any]], Any]
    drop_last: bool = False
    tolerance: int = 100

    def build_worker(self, local_worker_id: int, runtime: Runtime | None = None) -> Node:
        return BatchNode(
            skipping(self.dataset.build_worker(local_worker_id, runtime), runtime),  # a replay's skips enter here
            self.batch_size,
            self._stage_fn(self.batcher, local_worker_id, runtime, batch=True),
            drop_last=self.drop_last,
            guard=self._guard(runtime, "batch", self.tolerance),
            member_context=batch_member_context(local_worker_id=local_worker_id, workers=self.worker_config.workers_per_rank),
        )

    def worker_length(self, local_worker_id: int) -> int:
        samples = self.dataset.worker_length(local_worker_id)
        return samples // self.batch_size if self.drop_last else -(-samples // self.batch_size)

    def own_config(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size, "batcher": function_config(self.batcher), "drop_last": self.drop_last}


@stage_recipe
class Pass(StageRecipe[T]):
    """Passes of ``length`` items per rank (each worker its share): the next pass continues the
    stream (virtual epochs), or with ``restart`` starts it over (a val limit). ``capped``: a pass
    is no longer than the input's when the input's passes end."""

    dataset: Recipe[Any]
    worker_config: WorkerConfig
    length: int
    restart: bool = False
    capped: bool = False
    what: str = "items per pass"

    def build_worker(self, local_worker_id: int, runtime: Runtime | None = None) -> Node:
        return PassNode(self.dataset.build_worker(local_worker_id, runtime), self._share(local_worker_id), restart=self.restart, what=self.what)

    def _share(self, local_worker_id: int) -> int:
        return share(self.length, self.worker_config.workers_per_rank, local_worker_id)

    def worker_length(self, local_worker_id: int) -> int:
        if self.capped and pass_end(self.dataset) == ENDS_WITH_DATA:
            return min(self._share(local_worker_id), self.dataset.worker_length(local_worker_id))
        return self._share(local_worker_id)

    def own_config(self) -> dict[str, Any]:
        return {"length": self.length, "reset_after_epoch": self.restart}


@stage_recipe
class Watchdog(StageRecipe[T]):
    """Reports a worker stuck longer than ``timeout_seconds`` in one item (``initial_timeout_seconds``
    for the first; None: ``timeout_seconds``) with its Python stack; with ``fail_on_timeout`` the
    worker then raises :class:`WatchdogTimeoutError`. ``timeout_seconds`` None: no watchdog.
    Transparent: the input's length and config, so states do not change."""

    dataset: Recipe[Any]
    worker_config: WorkerConfig
    timeout_seconds: float | None = 60
    initial_timeout_seconds: float | None = None
    fail_on_timeout: bool = False

    def __post_init__(self) -> None:
        self.timeout_seconds = _check_timeout("timeout_seconds", self.timeout_seconds)
        self.initial_timeout_seconds = _check_timeout("initial_timeout_seconds", self.initial_timeout_seconds)
        self.fail_on_timeout = bool(self.fail_on_timeout)

    def build_worker(self, local_worker_id: int, runtime: Runtime | None = None) -> Node:
        inner = self.dataset.build_worker(local_worker_id, runtime)
        if self.timeout_seconds is None:
            return inner
        wc = self.worker_config
        return WatchdogNode(
            inner,
            owner=self,
            timeout=self.timeout_seconds,
            initial_timeout=self.initial_timeout_seconds,
            where=f"rank {wc.rank}, worker {local_worker_id}",
            runtime=runtime,
        )

    def __len__(self) -> int:
        return len(self.dataset)

    def config(self) -> dict[str, Any]:
        return self.dataset.config()

    def _watchdog_trigger(self) -> None:
        """Runs in the watchdog thread once per stuck item, after the stack dump was logged.

        Raises :class:`WatchdogTimeoutError` if ``fail_on_timeout`` (the process then exits),
        else logs a warning and lets the pipeline go on waiting.
        """
        if self.fail_on_timeout:
            raise WatchdogTimeoutError(
                format_message(
                    f"watchdog: producing one item took longer than {self.timeout_seconds} s",
                    expected="each item within watchdog_timeout_seconds",
                    fix="find the stuck call in the logged stack; raise watchdog_timeout_seconds "
                    "(or watchdog_initial_timeout_seconds for the first item) if the work is just slow",
                )
            )
        logger.warning(
            "watchdog: producing one item took longer than %s s; still waiting "
            "(fail_on_timeout=True would stop the process instead)",
            self.timeout_seconds,
        )


def _check_timeout(name: str, value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(
            format_message(
                f"WatchdogDataset {name} (watchdog_{name} of get_loader) must be a positive "
                "number of seconds or None",
                expected="e.g. 60 (None disables the watchdog)",
                found=repr(value),
            )
        )
    return float(value)


#: How a dataset's passes end (:func:`pass_end`): its stream ends after one read of the data, and
#: the next pass starts it over (a plain pass, a repeat of a fixed count) ...
ENDS_WITH_DATA = "data"
#: ... a ``Pass`` stage cuts passes out of a stream that goes on (virtual epochs, limits) ...
CUT_FROM_STREAM = "cut"
#: ... or an endless repeat and no ``Pass``: a pass never ends.
ENDLESS = "endless"


def pass_end(recipe: Recipe[Any]) -> str:
    """How ``recipe``'s passes end (``ENDS_WITH_DATA``, ``CUT_FROM_STREAM`` or ``ENDLESS``), from
    its recipe tree: the one place that decides it.  A ``Pass`` below anything cuts the stream; an
    endless ``Repeat`` without one makes it endless; a recipe the loader does not know (a dataset
    class of the user's own) ends with its data."""
    if isinstance(recipe, Pass):
        return CUT_FROM_STREAM
    inner = {pass_end(r) for r in recipe.input_recipes()}
    if CUT_FROM_STREAM in inner:
        return CUT_FROM_STREAM
    if ENDLESS in inner or (isinstance(recipe, Repeat) and recipe.repeats is None):
        return ENDLESS
    return ENDS_WITH_DATA


def passes_continue(recipe: Recipe[Any]) -> bool:
    """Whether the next of ``recipe``'s passes continues the stream where the last one was cut;
    otherwise the stream starts over (moot for an endless one, which never ends a pass)."""
    return pass_end(recipe) == CUT_FROM_STREAM


def check_takes_runtime(recipe: Recipe[Any]) -> None:
    """Refuses, naming the class, a recipe (or one of its inputs) whose ``build_worker`` has no
    ``runtime`` parameter: the loader hands each worker's pipeline its runtime through it."""
    pending = [recipe]
    while pending:
        current = pending.pop()
        if "runtime" not in inspect.signature(current.build_worker).parameters:
            raise ConfigError(
                format_message(
                    f"{type(current).__qualname__}.build_worker does not take the worker pipeline's runtime",
                    expected="build_worker(self, local_worker_id, runtime=None), handing runtime to the build_worker of its inputs",
                    found=f"build_worker{inspect.signature(current.build_worker)}",
                    fix="add the runtime parameter and pass it on (see megatron_energon_lite.pipeline.recipe.Recipe.build_worker)",
                )
            )
        pending.extend(current.input_recipes())

