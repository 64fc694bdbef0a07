"""``collage-ml collect``: gather measurements for training cost models.

A collection has two steps per source (a zoo model at a batch size, or an ONNX
file): it is planned when the run reaches it, then measured, so a budget covers
planning too and a long random collection starts measuring at once. (The
``focus`` sampler and ``dry_run`` plan every source first.)

1. **Plan.** For each source graph (a zoo model at a batch size, or an ONNX
   file), list candidates with the chosen sampler, drop duplicate keys (the
   first model that produces a key gives its family), keep this shard's part,
   subsample slow backends (inductor), and skip every key the database already
   holds for this hardware fingerprint, valid or invalid. Planning imports
   each graph but keeps only node bitsets, so memory stays small.
2. **Measure.** One :class:`~collage_ml.measure.runner.Runner` (one persistent
   worker process) serves the whole run. For each source, the graph (kept
   from planning, or imported again after a full plan) gives its reference
   activations once, and its candidates are measured one backend per phase.
   The Runner commits every measurement as it arrives, so a ``kill -9`` loses
   at most the candidate in flight, and a restart plans again and skips what
   is stored.

Samplers:

- ``enumerate``: every candidate the placement search would see
  (:func:`~collage_ml.candidates.enumerate_candidates` with ``max_region_size``).
- ``random``: random convex connected subgraphs (:mod:`collage_ml.collector.sampling`)
  of 1..``max_region_size`` nodes from the models at several batch sizes
  (default 1, 2, 4, 8, 16), each measured on every backend whose patterns can
  run it. Their family is ``"random"``; the pattern recorded in ``extra`` is
  ``random:<model>@b<batch>``.
- ``focus``: like ``random``, but drawn in proportion to a trained cost
  model's relative uncertainty (nn-Meter's builder loop); see
  :func:`focus_weights`.

Determinism: shards and the inductor subsample are pure functions of the
candidate key (SHA-256, never Python's ``hash()``), so ``--shard i/n`` on n
machines measures disjoint parts whose union is the unsharded work, and every
restart keeps the same subsample.
"""

from __future__ import annotations

from collage_ml.collector.loop import collect
from collage_ml.collector.planning import DEFAULT_MAX_REFERENCE_BYTES, CollectPlan, plan
from collage_ml.collector.ray_fleet import RAY_LOCAL_ENV, RAY_MISSING, RAY_TASK_RETRIES, ray_run_key, ray_shard_dir
from collage_ml.collector.samplers import (
    DEFAULT_FOCUS_SHARE, DEFAULT_SAMPLES_PER_GRAPH, FOCUS_NEEDS_MODEL, SAMPLERS, focus_weights,
)
from collage_ml.collector.sharding import DEFAULT_INDUCTOR_FRACTION, in_shard, parse_shard, shard_of, subsample_keep
from collage_ml.collector.sources import model_family, parse_batch_sizes, resolve_models
from collage_ml.collector.summary import CollectSummary, summary_table
from collage_ml.db import default_db_path

__all__ = [
    "DEFAULT_FOCUS_SHARE", "DEFAULT_INDUCTOR_FRACTION", "DEFAULT_MAX_REFERENCE_BYTES", "DEFAULT_SAMPLES_PER_GRAPH",
    "FOCUS_NEEDS_MODEL", "RAY_LOCAL_ENV", "RAY_MISSING", "RAY_TASK_RETRIES", "SAMPLERS", "CollectPlan",
    "CollectSummary", "collect", "default_db_path", "focus_weights", "in_shard", "model_family",
    "parse_batch_sizes", "parse_shard", "plan", "ray_run_key", "ray_shard_dir", "resolve_models", "shard_of",
    "subsample_keep", "summary_table",
]
