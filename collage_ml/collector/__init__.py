"""``collage-ml collect``: gather measurements for training cost models.

A collection has two steps:

1. **Plan.** For each source graph (a zoo model at a batch size, or an ONNX
   file), list candidates with the chosen sampler, drop duplicate keys (the
   first model that produces a key gives its family), keep this shard's part,
   subsample slow backends (inductor), and skip every key the database already
   holds for this hardware fingerprint, valid or invalid. Planning imports
   each graph but keeps only node bitsets, so memory stays small.
2. **Measure.** One :class:`~collage_ml.measure.runner.Runner` (one persistent
   worker process) serves the whole run. For each source, the graph is
   imported again, its reference activations are computed once, and its
   candidates are measured one backend per phase. The Runner commits every
   measurement as it arrives, so a ``kill -9`` loses at most the candidate in
   flight, and a restart plans again and skips what is stored.

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

import argparse
import json
import math
from typing import Any, Callable

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
from collage_ml.defaults import MAX_REGION_SIZE


# ----------------------------------------------------------------------------- CLI


def _arg(fn: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type from a parser that raises ValueError with a clear message."""

    def parse(text: str) -> Any:
        try:
            return fn(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = fn.__name__
    return parse


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise ValueError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise ValueError(f"expected a positive integer, got {text!r}")
    return v


def _nonneg_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise ValueError(f"expected an integer >= 0, got {text!r}") from None
    if v < 0:
        raise ValueError(f"expected an integer >= 0, got {text!r}")
    return v


def _nonneg_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"expected a number >= 0, got {text!r}") from None
    if not v >= 0 or math.isinf(v):
        raise ValueError(f"expected a finite number >= 0, got {text!r}")
    return v


def _fraction(text: str) -> float:
    v = _nonneg_float(text)
    if v > 1:
        raise ValueError(f"expected a fraction in [0, 1], got {text!r}")
    return v


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Adds the ``collect`` subcommand to an argparse subparsers object; ``run(args)`` executes it."""
    p = subparsers.add_parser(
        "collect",
        help="measure candidates into a database (resumable, shardable, budgeted)",
        description=(
            "Measure candidates of models on backends into a measurement database, for training cost models. "
            "Safe to stop at any time (Ctrl-C or kill): a restart skips everything the database already holds "
            "for this hardware."
        ),
    )
    p.add_argument("--models", default="all", metavar="a,b|all",
                   help="zoo names and .onnx paths, comma-separated; 'all' = every full-size zoo model, "
                        "'tiny' = every -tiny one (default: all)")
    p.add_argument("--backends", default=None, metavar="a,b", help="backends, comma-separated (default: the CPU set)")
    p.add_argument("--db", default=None, metavar="PATH",
                   help="database (default: $COLLAGE_ML_CACHE/measurements.db or ~/.cache/collage-ml/measurements.db)")
    p.add_argument("--budget-minutes", type=_arg(_nonneg_float), default=None, metavar="N",
                   help="stop after N minutes (checked between candidates)")
    p.add_argument("--max-candidates", type=_arg(_nonneg_int), default=None, metavar="N",
                   help="measure at most N new candidates")
    p.add_argument("--sampler", choices=SAMPLERS, default="enumerate",
                   help="enumerate: what the placement search sees; random: random convex subgraphs at several "
                        "batch sizes; focus: where --cost-model is least sure (default: enumerate)")
    p.add_argument("--shard", type=_arg(parse_shard), default=None, metavar="I/N",
                   help="measure only shard I of N (0 <= I < N), split by a stable hash of the candidate key")
    p.add_argument("--seed", type=int, default=0, help="seed of the random and focus samplers (default: 0)")
    p.add_argument("--threads", type=_arg(_positive_int), default=None, metavar="N",
                   help="intra-op threads for every backend (default: $COLLAGE_ML_THREADS or the physical cores)")
    p.add_argument("--max-region-size", type=_arg(_positive_int), default=MAX_REGION_SIZE, metavar="N",
                   help=f"largest region (nodes) enumerated or sampled (default: {MAX_REGION_SIZE})")
    p.add_argument("--batch-sizes", type=_arg(parse_batch_sizes), default=None, metavar="1,2,...",
                   help="batch sizes of zoo models (default: 1 for enumerate, 1,2,4,8,16 for random and focus)")
    p.add_argument("--samples-per-graph", type=_arg(_positive_int), default=DEFAULT_SAMPLES_PER_GRAPH, metavar="N",
                   help=f"random subgraphs per model and batch size (default: {DEFAULT_SAMPLES_PER_GRAPH})")
    p.add_argument("--inductor-fraction", type=_arg(_fraction), default=DEFAULT_INDUCTOR_FRACTION, metavar="F",
                   help=f"share of inductor candidates measured; its compiles are slow (default: "
                        f"{DEFAULT_INDUCTOR_FRACTION})")
    p.add_argument("--timeout", type=_arg(_nonneg_float), default=120.0, metavar="S",
                   help="seconds allowed for one candidate's compile and timing (default: 120)")
    p.add_argument("--ray", dest="ray_address", default=None, metavar="ADDRESS",
                   help="run one shard per node of this Ray cluster ('local' starts one here) and merge the results")
    p.add_argument("--cost-model", default=None, metavar="PATH", help="trained cost model (needed by --sampler focus)")
    p.add_argument("--dry-run", action="store_true", help="plan only: count what would be measured")
    p.add_argument("--no-progress", action="store_true", help="no progress bar or summary table")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    return p


def run(args: argparse.Namespace) -> int:
    """Runs ``collage-ml collect`` for parsed ``args``; 0 when done or stopped by a budget, 130 when interrupted."""
    summary = collect(
        models=args.models, backends=args.backends, db=args.db, budget_minutes=args.budget_minutes,
        max_candidates=args.max_candidates, sampler=args.sampler, shard=args.shard, seed=args.seed,
        threads=args.threads, max_region_size=args.max_region_size, batch_sizes=args.batch_sizes,
        progress=not args.no_progress, ray_address=args.ray_address, cost_model=args.cost_model,
        inductor_fraction=args.inductor_fraction, samples_per_graph=args.samples_per_graph,
        timeout=args.timeout, dry_run=args.dry_run,
    )
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2))
    elif args.no_progress:
        print(
            f"{summary.stopped}: {summary.measured} measured ({summary.valid} valid, {summary.invalid} invalid), "
            f"{summary.cache_hits} cache hits, {summary.remaining} left; db {summary.db}"
        )
    return 130 if summary.stopped == "interrupted" else 0


__all__ = [
    "DEFAULT_FOCUS_SHARE", "DEFAULT_INDUCTOR_FRACTION", "DEFAULT_MAX_REFERENCE_BYTES", "DEFAULT_SAMPLES_PER_GRAPH",
    "FOCUS_NEEDS_MODEL", "RAY_LOCAL_ENV", "RAY_MISSING", "RAY_TASK_RETRIES", "SAMPLERS", "CollectPlan",
    "CollectSummary", "add_parser", "collect", "default_db_path", "focus_weights", "in_shard", "model_family",
    "parse_batch_sizes", "parse_shard", "plan", "ray_run_key", "ray_shard_dir", "resolve_models", "run", "shard_of",
    "subsample_keep", "summary_table",
]
