"""The ``collage-ml collect`` command: its arguments and how it runs (:func:`collage_ml.collector.collect`)."""

from __future__ import annotations

import argparse
import json

from collage_ml.argtypes import arg, fraction, nonneg_float, nonneg_int, positive_int
from collage_ml.collector import (
    DEFAULT_INDUCTOR_FRACTION, DEFAULT_SAMPLES_PER_GRAPH, SAMPLERS, collect, parse_batch_sizes, parse_shard,
)
from collage_ml.defaults import MAX_REGION_SIZE, RECALIBRATE_HOURS


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
                        "'tiny' = every -tiny one, 'synthetic:N' = N seeded random networks (synthetic-0 to "
                        "synthetic-<N-1>; 'synthetic:A-B' for seeds A to B-1) (default: all)")
    p.add_argument("--backends", default=None, metavar="a,b", help="backends, comma-separated (default: the CPU set)")
    p.add_argument("--db", default=None, metavar="PATH",
                   help="database (default: $COLLAGE_ML_CACHE/measurements.db or ~/.cache/collage-ml/measurements.db)")
    p.add_argument("--budget-minutes", type=arg(nonneg_float), default=None, metavar="N",
                   help="stop after N minutes of planning and measuring (checked between candidates)")
    p.add_argument("--max-candidates", type=arg(nonneg_int), default=None, metavar="N",
                   help="measure at most N new candidates")
    p.add_argument("--sampler", choices=SAMPLERS, default="enumerate",
                   help="enumerate: what the placement search sees; random: random convex subgraphs at several "
                        "batch sizes; focus: where --cost-model is least sure (default: enumerate)")
    p.add_argument("--shard", type=arg(parse_shard), default=None, metavar="I/N",
                   help="measure only shard I of N (0 <= I < N), split by a stable hash of the candidate key")
    p.add_argument("--seed", type=int, default=0, help="seed of the random and focus samplers (default: 0)")
    p.add_argument("--threads", type=arg(positive_int), default=None, metavar="N",
                   help="intra-op threads for every backend (default: $COLLAGE_ML_THREADS or the physical cores)")
    p.add_argument("--max-region-size", type=arg(positive_int), default=MAX_REGION_SIZE, metavar="N",
                   help=f"largest region (nodes) enumerated or sampled (default: {MAX_REGION_SIZE})")
    p.add_argument("--batch-sizes", type=arg(parse_batch_sizes), default=None, metavar="1,2,...",
                   help="batch sizes of zoo models (default: 1 for enumerate, 1,2,4,8,16 for random and focus)")
    p.add_argument("--samples-per-graph", type=arg(positive_int), default=DEFAULT_SAMPLES_PER_GRAPH, metavar="N",
                   help=f"random subgraphs per model and batch size (default: {DEFAULT_SAMPLES_PER_GRAPH})")
    p.add_argument("--inductor-fraction", type=arg(fraction), default=DEFAULT_INDUCTOR_FRACTION, metavar="F",
                   help=f"share of inductor candidates measured; its compiles are slow (default: "
                        f"{DEFAULT_INDUCTOR_FRACTION})")
    p.add_argument("--timeout", type=arg(nonneg_float), default=120.0, metavar="S",
                   help="seconds allowed for one candidate's compile and timing (default: 120)")
    p.add_argument("--ray", dest="ray_address", default=None, metavar="ADDRESS",
                   help="run one shard per node of this Ray cluster ('local' starts one here) and merge the results")
    p.add_argument("--cost-model", default=None, metavar="PATH", help="trained cost model (needed by --sampler focus)")
    p.add_argument("--recalibrate-after", type=arg(nonneg_float), default=RECALIBRATE_HOURS, metavar="HOURS",
                   help="calibrate the machine (the probe set) when the run starts, and again before a source once "
                        f"the newest calibration is this old (default: {RECALIBRATE_HOURS:g})")
    p.add_argument("--no-calibrate", action="store_true",
                   help="never run the probe set (rows of an uncalibrated machine train models without its probes)")
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
        recalibrate_hours=None if args.no_calibrate else args.recalibrate_after,
    )
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2))
    elif args.no_progress:
        print(
            f"{summary.stopped}: {summary.measured} measured ({summary.valid} valid, {summary.invalid} invalid), "
            f"{summary.cache_hits} cache hits, {summary.remaining} left"
            + (f" and {summary.unplanned_sources} sources not planned" if summary.unplanned_sources else "")
            + f"; db {summary.db}"
        )
    return 130 if summary.stopped == "interrupted" else 0
