"""``collage-ml train`` and ``collage-ml eval``: fit a cost model on a measurement database, and score one.

Registered in :mod:`collage_ml.cli` through :func:`add_parser` / :func:`run`,
like ``collect``. Errors are :class:`~collage_ml.errors.CollageError` (one
line, exit 1); a malformed or unknown ``--param`` is a usage error (exit 2).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from collage_ml.argtypes import arg, key_value
from collage_ml.defaults import COST_MODEL, DB, MODEL_KIND, POOL_BY, SITTINGS, SITTINGS_CHOICES

KINDS = ("xgb", "gnn", "blend")
DB_HELP = "measurement database (default: the per-user one that place and collect write)"
SITTINGS_HELP = ("of several --db, a candidate that more than one measured on one machine (a rerun): 'mean' reads it "
                 "as one sample, the geometric mean of its sittings, each scaled to the first by the candidates they "
                 "share; 'each' "
                 f"as one sample per database (default: {SITTINGS})")


def add_parser(subparsers) -> None:
    """Adds the ``train`` and ``eval`` subcommands to an argparse subparsers object; ``run(args)`` executes them."""
    t = subparsers.add_parser(
        "train",
        help="train a cost model on a measurement database",
        description=(
            "Fit a learned cost model (xgb: gradient-boosted trees on flat features; gnn: a graph network; blend: "
            "both, their log predictions averaged) on the "
            "valid measurements of a database and save it as an artifact directory. With --holdout-family, those "
            "families are left out of training and scored afterwards."
        ),
    )
    t.add_argument("--db", action="append", default=None, metavar="PATH",
                   help=DB_HELP + "; repeat it to train on several databases (e.g. one per machine) at once")
    t.add_argument("--model", default=MODEL_KIND, choices=KINDS, help=f"model kind (default: {MODEL_KIND})")
    t.add_argument("-o", "--output", required=True, metavar="ARTIFACT", help="artifact directory to write")
    t.add_argument("--holdout-family", action="append", default=[], metavar="NAME",
                   help="leave this source family out of training and report its metrics (repeatable)")
    t.add_argument("--hardware", default=None, metavar="FP", help="train on this hardware fingerprint only")
    t.add_argument("--pool-probes", nargs="?", const="machine", default=False, choices=POOL_BY, metavar="machine|node",
                   help="of several --db, give each machine (or, with 'node', each instance of it: a VM's boot) one "
                        "probe table: the median of their calibrations")
    t.add_argument("--sittings", default=SITTINGS, choices=SITTINGS_CHOICES, help=SITTINGS_HELP)
    t.add_argument("--param", type=arg(key_value), action="append", default=[], metavar="KEY=VALUE",
                   help="model parameter; VALUE is parsed as JSON when it can be (repeatable)")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--json", action="store_true", help="print the summary as JSON")

    e = subparsers.add_parser(
        "eval",
        help="score a trained cost model on a measurement database",
        description=(
            "Predict every valid measurement of a database with a trained cost model and report ranking and "
            "accuracy metrics (see collage_ml.models.evaluate). Warns when the data overlaps the model's training "
            "sources."
        ),
    )
    e.add_argument("--db", action="append", default=None, metavar="PATH",
                   help=DB_HELP + "; repeat it to score on several databases at once (e.g. a dataset and its rerun)")
    e.add_argument("--sittings", default=SITTINGS, choices=SITTINGS_CHOICES, help=SITTINGS_HELP)
    e.add_argument("--artifact", default=COST_MODEL, metavar="ARTIFACT|default",
                   help="artifact directory, or 'default' for the shipped one that fits this machine (default: "
                        f"{COST_MODEL})")
    e.add_argument("--holdout-family", action="append", default=[], metavar="NAME",
                   help="evaluate on this source family only (repeatable)")
    e.add_argument("--hardware", default=None, metavar="FP", help="evaluate on this hardware fingerprint only")
    e.add_argument("--no-progress", action="store_true", help="no progress bar")
    e.add_argument("--json", action="store_true", help="print the metrics as JSON")


def run(args: argparse.Namespace) -> int:
    if args.command == "train":
        return _train(args)
    if args.command == "eval":
        return _eval(args)
    raise ValueError(f"not a cost-model command: {args.command}")


# ----------------------------------------------------------------------------- shared
def _dbs(args) -> Any:
    """``--db`` as ``train``/``evaluate`` take it: the default, one path, or a list of them."""
    if args.db is None:
        return DB
    return args.db[0] if len(args.db) == 1 else list(args.db)


def _say_merged(merged: dict) -> None:
    if merged.get("candidates"):
        rest = merged["candidates"] - merged.get("by_shared", 0)
        how = (f"; {rest} of them read through their calibrations, too few candidates shared to scale by"
               if rest else "")
        print(f"{merged['candidates']} candidates were measured in more than one sitting ({merged['rows']} rows): "
              "each is one sample, the geometric mean of its sittings, each sitting scaled to the first by the "
              f"candidates they share{how} (--sittings each keeps them apart)")


def _progress_enabled(args) -> bool:
    return not args.no_progress and not args.json and sys.stderr.isatty()


def _metrics_table(title: str, rows: dict[str, dict[str, Any]]) -> None:
    """One column per family (and "all"), one row per metric."""
    from collage_ml.models.evaluate import METRIC_LABELS, METRICS, format_metric
    from collage_ml.ui import print_table

    lines = [("samples", *(m.get("n", "") for m in rows.values()))]
    lines += [(METRIC_LABELS.get(k, k), *(format_metric(k, m.get(k)) for m in rows.values())) for k in METRICS]
    lines.append(("decision groups", *(m.get("n_groups", "") for m in rows.values())))
    lines.append(("backend groups", *(m.get("n_backend_groups", "") for m in rows.values())))
    print_table(title, ["metric", *rows], lines, right=rows)


# ----------------------------------------------------------------------------- train
def _train(args) -> int:
    from collage_ml.models import training
    from collage_ml.models.evaluate import json_safe

    model = training.make_model(args.model, dict(args.param), what="--param")  # usage errors before the database
    model = training.train(_dbs(args), model, args.output, args.holdout_family, hardware=args.hardware,
                           progress=_progress_enabled(args), pool_probes=args.pool_probes, sittings=args.sittings)
    summary = model.training
    if args.json:
        print(json.dumps(json_safe(summary), indent=2, default=str))
        return 0
    print(
        f"trained {args.model} on {summary['n']} samples ({len(summary['sources'])} sources: "
        f"{', '.join(summary['sources'])}; backends {', '.join(summary['backends'])}) in {summary['fit_seconds']:.1f} s"
    )
    if summary["skipped"]:
        print(f"skipped {summary['skipped']} rows whose stored subgraph no longer parses")
    _say_merged(summary.get("merged_sittings") or {})
    if summary.get("pooled_probes"):
        per = "instance of a machine (node)" if args.pool_probes == "node" else "machine"
        print(f"one probe table per {per}, the median of its databases' calibrations: "
              + ", ".join(f"{fp} ({n})" for fp, n in sorted(summary["pooled_probes"].items())))
    held = summary.get("holdout") or {}
    if held:
        rows = dict(held)
        if len(held) > 1:
            rows["mean over families"] = summary["holdout_average"]
        _metrics_table(f"held out: {', '.join(summary['holdout_families'])} ({summary['n_holdout']} samples)", rows)
    print(f"saved {args.output}")
    return 0


# ----------------------------------------------------------------------------- eval
def _eval(args) -> int:
    from collage_ml.models import training
    from collage_ml.models.evaluate import json_safe

    result = training.evaluate(
        _dbs(args), args.artifact, args.holdout_family, hardware=args.hardware, progress=_progress_enabled(args),
        on_warning=lambda text: print(f"collage-ml: warning: {text}", file=sys.stderr), sittings=args.sittings,
    )
    if args.json:
        print(json.dumps(json_safe(result), indent=2, default=str))
        return 0
    per = result["per_family"]
    overall = {k: v for k, v in result.items()
               if k not in ("artifact", "kind", "db", "families", "per_family", "merged_sittings")}
    rows = dict(per)
    rows["all" if per else result["families"][0]] = overall
    _metrics_table(f"{result['kind']} cost model {result['artifact']} on {result['db']}", rows)
    print(f"{overall['n']} samples, {overall['n_groups']} decision groups ({overall['ungrouped']} samples in none), "
          f"{overall['n_backend_groups']} backend groups")
    _say_merged(result.get("merged_sittings") or {})
    return 0


__all__ = ["add_parser", "run"]
