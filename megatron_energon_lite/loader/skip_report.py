"""The loader's list of skipped samples, kept in the main process.

The default error handler skips a sample that fails (a part that does not decode, a hook that
raises) and, inside a loader's pipeline, does not log it where it happens: a worker process's log
may never reach the training job's logging.  It collects a :class:`~megatron_energon_lite.errors.SkipRecord`
(sample key, dataset, shard, stage, reason), which travels to the main process with the worker's
next item (or alone after its last one).  There :class:`SkipLedger` logs each skip once, counts
them per dataset and shard, and keeps the first :data:`LISTED_SKIPS` for ``loader.skip_report()``
(bounded memory however bad the data).  Skips with ``SkipSample`` are decisions, not failures,
and are neither logged nor listed.  Samples a replay's skip list names (``pipeline/skip.py``)
are logged at INFO with the step they were dropped before, and counted apart (``replayed``).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from ..errors import SKIP_REPORT_LIMIT, SkipRecord
from ..pipeline.skip import REPLAY_SKIP_STAGE

__all__ = ["LISTED_SKIPS", "SkipLedger"]

# The loader's logger: a skip is the loader's news, wherever the ledger that logs it lives.
logger = logging.getLogger("megatron_energon_lite.loader")

#: Skips listed by ``skip_report()``; later ones are only counted.
LISTED_SKIPS = 10_000


class SkipLedger:
    """Skips reported by a loader's pipelines: logged once here, counted, the first ones listed."""

    def __init__(self, workers: int) -> None:
        self._workers = workers
        self.skips = 0  # skip reports (one may name several samples: a batch, a packing buffer)
        self.samples = 0
        self._by_shard: Counter[tuple[str | None, str | None]] = Counter()
        self._listed: list[dict[str, Any]] = []
        self._unnamed = 0  # counted in a worker past SKIP_REPORT_LIMIT in a row, without details
        self.replayed = 0  # samples dropped because the skip list names them
        self._replayed_listed: list[dict[str, Any]] = []

    def add(self, logical: int, records: tuple[SkipRecord, ...], more: int, *, step: int | None = None) -> None:
        """``step``: the step of the next batch the loader delivers (the skips came with it)."""
        prefix = f"worker {logical}: " if self._workers else ""
        for record in records:
            if record.stage == REPLAY_SKIP_STAGE:
                logger.info("%s%s, before step %s", prefix, record.message, step)
                self.replayed += 1
                if len(self._replayed_listed) < LISTED_SKIPS:
                    self._replayed_listed.append({"worker": logical, "key": record.key, "dataset": record.dataset, "step": step, "sample": record.message})
                continue
            logger.warning("%s%s", prefix, record.message)
            self.skips += 1
            self.samples += record.samples
            for dataset, shard, count in record.places or ((record.dataset, record.shard, record.samples),):
                self._by_shard[(dataset, shard)] += count
            if len(self._listed) < LISTED_SKIPS:
                self._listed.append({"worker": logical, **{k: v for k, v in record._asdict().items() if k not in ("message", "places")}})
        if more:
            logger.warning("%sskipped %d more samples (details not kept: more than %d in a row)", prefix, more, SKIP_REPORT_LIMIT)
            self.skips += more
            self.samples += more
            self._unnamed += more

    def report(self) -> dict[str, Any]:
        """``skipped`` (skip reports), ``samples`` (samples in them), ``by_dataset``
        ({dataset: {"samples": n, "shards": {shard: n}}}; None where a sample did not say where it
        came from), ``listed`` (the first skips: worker, key, samples, dataset, shard, stage,
        reason) and ``not_listed``; ``replay_skipped``: samples dropped because the skip list
        names them, and ``replay_listed``: the first of them (worker, key, dataset, step, sample)."""
        by_dataset: dict[Any, dict[str, Any]] = {}
        for (dataset, shard), count in sorted(self._by_shard.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1]))):
            entry = by_dataset.setdefault(dataset, {"samples": 0, "shards": {}})
            entry["samples"] += count
            entry["shards"][shard] = entry["shards"].get(shard, 0) + count
        return {
            "skipped": self.skips,
            "samples": self.samples,
            "by_dataset": by_dataset,
            "listed": list(self._listed),
            "not_listed": self.skips - len(self._listed),
            "without_details": self._unnamed,
            "replay_skipped": self.replayed,
            "replay_listed": list(self._replayed_listed),
        }
