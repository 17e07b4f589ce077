"""Mock data: the loader's ceiling (``get_train_dataset(..., mock=True)``, ``mock: true`` in a
metadataset YAML).

Megatron's scaling guide: run with ``--mock-data`` and "the gap tells you exactly how much time
the dataloader is costing you".  A mock dataset yields items of exactly the structure, shapes and
dtypes of the real ones, because they *are* a real one: each worker builds its real pipeline
once, takes its first item (batch) and then yields that item again and again, with no reading,
decoding or batching afterwards.  Everything else is the real loader's: the number of items per
pass (``len()`` is the real dataset's; a training stream that repeats is endless), the order of
the workers, and ``save_state_rank()`` / ``restore_state_rank()``.

Decisions:

* **The same object, not copies** (``mock=True``).  The point is zero loader cost, and a copy of
  an image batch costs as much as a memcpy of it.  So every item of worker ``w`` is the same
  object (with worker processes: the same object in the main process; without: the same tensors,
  in a container the loader's conversion may rebuild), and a training loop that writes into its
  batch in place changes every later batch of that worker.  ``mock="copy"`` hands out a deep copy
  of the first item each time instead: no I/O or decode either, but one copy per item, paid in
  the main process (the training loop's process).  On a machine with CUDA the loader pins each
  item into page-locked memory (a copy, as for real data) whatever the mode.
* **Workers**: each worker builds its own first item (the real pipeline of that worker: its
  shards, seeds and task encoder hooks), sends it to the main process once, and from then on
  sends only a small token that the main process turns back into that item (it keeps one item per
  worker).  So with workers the mock costs the queue round trip of a token, not the hand-over of
  a batch; without workers it costs nothing.  A worker that has nothing to read ends its passes
  at once, as the real one does.
* **State** (plain JSON, DESIGN.md state rule 1): ``{"stage": "Mock", "version": 1, "offset": n}``,
  the items yielded in the current pass (in an endless stream: since the start).  After a restore
  each worker builds its first item again (one real read), which is the same item as before: it
  depends only on the worker's pipeline settings.  The loader's configuration fingerprint is the
  real dataset's with ``"mock"`` added, so a state of the real loader does not restore into a
  mock one, nor the other way round.  A mock dataset cannot be restored on another topology.
"""

from __future__ import annotations

import copy
import uuid
import weakref
from typing import Any, Sequence

import torch.utils.data

from ..errors import ConfigError, EmptyDatasetError, StateError, format_message
from ..pipeline.node import Node, State, get_restore_key, set_restore_key
from ..pipeline.recipe import Recipe
from ..pipeline.runtime import Runtime
from ..pipeline.state_check import check_count, check_stage

__all__ = ["MOCK_MODES", "MockDataset", "MockNode", "mock_mode"]

#: ``mock=True`` (or ``"same"``): every item is the same object; ``"copy"``: a deep copy each time.
MOCK_MODES = ("same", "copy")
_STATE_VERSION = 1


def mock_mode(value: Any, *, where: str = "mock") -> str | None:
    """``mock`` as the loader and the YAML take it: ``None``/``False`` (off), ``True`` or
    ``"same"`` (the same object every time), ``"copy"`` (a copy every time)."""
    if value is None or value is False:
        return None
    if value is True:
        return "same"
    if isinstance(value, str) and value in MOCK_MODES:
        return value
    raise ConfigError(
        format_message(
            "invalid mock setting",
            where=where,
            expected="true (the first real item again and again, the same object), 'copy' (a copy of it each time) or false",
            found=repr(value)[:80],
        )
    )


# --- the hand-over: the first item once, then tokens ------------------------------------------

#: Mock datasets of this process by key (a forked worker has the same keys).
_datasets: weakref.WeakValueDictionary[str, MockDataset] = weakref.WeakValueDictionary()


class _FirstItem:
    """What a worker sends with its first item: unpickled in the main process, it stores the item
    there and becomes it.  It carries the restore key the loader gives the item (the loader sets
    ``__restore_key__`` on what a worker yields)."""

    __slots__ = ("__restore_key__", "item", "key", "worker")

    def __init__(self, key: str, worker: int, item: Any) -> None:
        self.key, self.worker, self.item = key, worker, item
        self.__restore_key__ = get_restore_key(item)

    def __reduce__(self):
        return _remember, (self.key, self.worker, self.item, self.__restore_key__)


class _Again:
    """What a worker sends for every later item: unpickled in the main process, it becomes the
    item stored there (no tensor data crosses the process boundary)."""

    __slots__ = ("key", "worker")

    def __init__(self, key: str, worker: int) -> None:
        self.key, self.worker = key, worker

    def __reduce__(self):
        return _recall, (self.key, self.worker)


def _remember(key: str, worker: int, item: Any, restore_key: tuple) -> Any:
    dataset = _datasets.get(key)
    item = set_restore_key(item, tuple(restore_key))
    if dataset is None:  # nobody to keep it for (the dataset is gone): just this item
        return item
    try:  # a private copy: the received tensors live in the worker's shared-memory slab
        item = copy.deepcopy(item)
    except Exception:  # noqa: BLE001 - an item that cannot be copied is kept as received
        pass
    dataset._received[worker] = item
    return dataset._hand_out(item)


def _recall(key: str, worker: int) -> Any:
    dataset = _datasets.get(key)
    item = None if dataset is None else dataset._received.get(worker)
    if item is None:
        raise StateError(
            format_message(
                "a mock dataset's worker sent a repeat of an item the main process never received",
                where=f"worker {worker}",
                fix="iterate a mock dataset through get_loader / get_savable_loader of the process that built it",
            )
        )
    return dataset._hand_out(item)


# --- the stage ---------------------------------------------------------------------------------


class MockNode(Node[Any]):
    """Yields worker ``local_worker_id``'s first real item again and again: ``per_pass`` times per
    pass, then ``StopIteration`` once (``None``: endless).

    The real pipeline is built and read on the first ``next()`` only, and dropped after its first
    item.

    State keys:
        ``stage``: ``"Mock"``.
        ``version``: 1.
        ``offset``: items yielded in the current pass (endless: in all).
    """

    tag = "Mock"

    def __init__(self, owner: MockDataset, local_worker_id: int, per_pass: int | None, runtime: Runtime | None = None) -> None:
        self.owner = owner
        self.runtime = runtime  # the real pipeline's, built with the first item
        self.worker = local_worker_id
        self.per_pass = per_pass
        self._offset = 0
        self._item: Any = None
        self._built = False
        self._sent = False  # this process has sent the first item to the main process

    def _first(self) -> Any:
        if not self._built:
            pipeline = self.owner.dataset.build_worker(self.worker, self.runtime)
            try:
                item = pipeline.next()
            except StopIteration:
                raise EmptyDatasetError(
                    format_message(
                        "mock data needs one real item to copy, but the pipeline yielded none",
                        where=f"{self.owner.name}, worker {self.worker}",
                        expected=f"{self.owner.dataset.worker_length(self.worker)} items per pass on this worker",
                        found="the pipeline ended at once (every sample filtered or skipped?)",
                        fix="check the dataset with `energon-lite preview` and the task encoder's filters",
                    )
                ) from None
            del pipeline  # its files and buffers go now: nothing is read again
            # What the loader would do to it (numpy arrays to tensors), once.
            self._item = torch.utils.data.default_convert(item)
            self._built = True
        return self._item

    def next(self) -> Any:
        if self.per_pass is not None and self._offset >= self.per_pass:
            self._offset = 0
            raise StopIteration
        item = self._first()
        self._offset += 1
        if torch.utils.data.get_worker_info() is None:  # in the main process: the item itself
            return self.owner._hand_out(item)
        if not self._sent:
            self._sent = True
            return _FirstItem(self.owner.key, self.worker, item)
        return _Again(self.owner.key, self.worker)

    def get_state(self) -> State:
        return {"stage": self.tag, "version": _STATE_VERSION, "offset": self._offset}

    def reset(self, state: State | None = None) -> None:
        if state is None:
            self._offset = 0
            return
        check_stage(state, self.tag, "version", "offset")
        if state["version"] != _STATE_VERSION:
            raise StateError(format_message("unknown version of a mock stage's state", expected=str(_STATE_VERSION), found=repr(state["version"])[:40]))
        high = self.per_pass
        self._offset = check_count(state["offset"], "offset", stage=self.tag, high=high, high_reason="items per pass on this worker")

    def restore(self, restore_key: tuple) -> Any:
        return self._first()


# --- the dataset -------------------------------------------------------------------------------


class MockDataset(Recipe[Any]):
    """``dataset``'s first item per worker, again and again (see the module's docstring).

    ``endless``: the real stream never ends (a training stream that repeats); otherwise each
    pass yields the real number of items per worker.  ``name`` names the dataset in errors.
    """

    def __init__(self, dataset: Recipe[Any], *, mode: str = "same", endless: bool, name: str) -> None:
        super().__init__()
        if mode not in MOCK_MODES:
            raise ConfigError(format_message("invalid mock mode", expected=" or ".join(MOCK_MODES), found=repr(mode)))
        self.dataset = dataset
        self.worker_config = dataset.worker_config
        self.mode = mode
        self.endless = endless
        self.name = name
        if len(dataset) == 0:
            raise EmptyDatasetError(
                format_message(
                    "mock data needs one real item to copy, but the dataset yields none",
                    where=name,
                    expected="at least one item (batch) per pass on this rank",
                    found=f"0 items ({self.worker_config.world_size} rank(s) x {self.worker_config.workers_per_rank} worker(s))",
                    fix="use a dataset (or subset) with samples, a smaller batch_size, or batch_drop_last=False",
                )
            )
        self.key = uuid.uuid4().hex
        #: In the main process: the first item each worker sent (see ``_FirstItem``).
        self._received: dict[int, Any] = {}
        _datasets[self.key] = self

    def __getstate__(self) -> dict:  # pickled (a spawned worker): without the received items
        return {**self.__dict__, "_received": {}}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        _datasets.setdefault(self.key, self)

    def _hand_out(self, item: Any) -> Any:
        return copy.deepcopy(item) if self.mode == "copy" else item

    def build_worker(self, local_worker_id: int, runtime: Runtime | None = None) -> Node:
        per_pass = None if self.endless else self.dataset.worker_length(local_worker_id)
        if per_pass is None and self.dataset.worker_length(local_worker_id) == 0:
            per_pass = 0  # a worker with nothing to read ends at once, as the real one does
        return MockNode(self, local_worker_id, per_pass, runtime)

    def worker_length(self, local_worker_id: int) -> int:
        return self.dataset.worker_length(local_worker_id)

    def __len__(self) -> int:
        return len(self.dataset)

    def config(self) -> dict[str, Any]:
        return {**self.dataset.config(), "mock": self.mode}

    @property
    def spec(self) -> Any:
        """The spec of the dataset it mocks (``get_val_datasets`` makes its factory of it)."""
        return self.dataset.spec

    def input_recipes(self) -> Sequence[Recipe[Any]]:
        return (self.dataset,)
