"""``prepare``: index tar shards and write ``.nv-meta/`` the way Energon 7.4 does.

Differences from Energon, on purpose:

* Shards are scanned in parallel processes with a progress bar, and a re-run only re-scans shards
  whose size or modification time changed (rows of unchanged shards are copied from the previous
  ``index.sqlite``).  What was scanned is remembered in ``.nv-meta/.lite-prepare.json``, a file
  Energon ignores.
* Split ratios use Energon's cut points, except that the last split always ends at the last
  shard: Energon's float rounding can leave a shard in no split (7,2,1 over 10 shards gives
  7/2/0; we give 7/2/1, and the same splits as Energon wherever it loses nothing).
* Nothing is written when a duplicate key, an empty shard or a corrupt tar is found: every
  metadata file is written through a temporary file and a rename, ``.info.json`` last.  A
  previous ``index.sqlite`` that cannot be read is not an error: every shard is scanned again.
* Memory does not grow with the dataset: each shard's rows go to SQLite as soon as its scan
  arrives, and the mapped pages of a tar are released behind the parser.
* Many small shards (measured with 10,000: benchmarks/bench_prepare_many.py): the workers send
  back ready-made SQLite rows and write each new ``.tar.idx`` under a temporary name, renamed
  into place once the index is built (after one ``syncfs`` rather than an ``fsync`` per file);
  a re-run takes one ``stat`` per tar and ``.tar.idx`` (the tree walk takes none), and leaves
  ``split.yaml`` alone when it is the file the previous run wrote and would not change.  When
  the shards are the ones of the previous run, in the same order, and at most a quarter of them
  changed, the new ``index.sqlite`` is a copy of the previous one with the changed shards' rows
  replaced (their lookup indexes are kept, not rebuilt); otherwise it is built afresh, runs of
  unchanged shards copied from the previous index with one statement each.  Both hold the same
  rows, in each shard in the order a scan inserts them; only the rowids of an in-place update
  differ (its new rows come last), which no reader of ours or Energon's depends on.
* Media metadata (``media_filter``) is extracted in the same pass over each tar.  A re-prepare
  without a filter keeps the one the index was built with (Energon keeps the old tables, stale
  or not); a different filter re-scans every shard.

The work is split by job: :mod:`.discover` finds the shards, :mod:`.scan` indexes one (the
worker processes' task), :mod:`.splits` assigns shards to splits and writes ``split.yaml``,
:mod:`.incremental` holds what a re-prepare reuses (``.lite-prepare.json``, the unchanged shards,
the temporary ``.tar.idx`` names), :mod:`.write` writes the new index, ``.tar.idx`` files and
metadata, and :mod:`.run` is :func:`prepare_dataset`, which runs those steps in order.
:mod:`.nodes` shares the scanning over the ranks of a job (``torchrun``, or ``--rank`` and
``--world-size``) and has rank 0 run the same steps on the ranks' scans.
"""

from __future__ import annotations

from braceexpand import braceexpand  # importable from here as before (flavors.webdataset uses it)

from .discover import discover_shards
from .incremental import PREPARE_STATE, PREPARE_STATE_VERSION
from .nodes import FileRanks, Ranks, TorchRanks, prepare_across_ranks, shares_by_size
from .run import PrepareResult, prepare_dataset
from .scan import ShardScan, scan_shard
from .splits import DEFAULT_SPLIT_NAMES, split_counts_by_ratio, splits_by_patterns, splits_by_ratio

__all__ = [
    "DEFAULT_SPLIT_NAMES",
    "FileRanks",
    "PREPARE_STATE",
    "PREPARE_STATE_VERSION",
    "PrepareResult",
    "Ranks",
    "ShardScan",
    "TorchRanks",
    "discover_shards",
    "prepare_across_ranks",
    "prepare_dataset",
    "scan_shard",
    "shares_by_size",
    "split_counts_by_ratio",
    "splits_by_patterns",
    "splits_by_ratio",
]
