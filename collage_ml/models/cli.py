"""``collage-ml train`` and ``collage-ml eval``: fit a cost model on a measurement database, and score one.

Registered in :mod:`collage_ml.cli` through :func:`add_parser` / :func:`run`,
like ``collect``. Errors are :class:`~collage_ml.errors.CollageError` (one
line, exit 1); a malformed or unknown ``--param`` is a usage error (exit 2).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from collage_ml.errors import CollageError

KINDS = ("xgb", "gnn")


def _param_arg(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key or not key.replace("_", "").isalnum():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (e.g. n_estimators=200), got {text!r}")
    try:
        v: Any = json.loads(value)
    except json.JSONDecodeError:
        v = value  # a bare string, e.g. conv=gin
    return key, v


def add_parser(subparsers) -> None:
    """Adds the ``train`` and ``eval`` subcommands to an argparse subparsers object; ``run(args)`` executes them."""
    t = subparsers.add_parser(
        "train",
        help="train a cost model on a measurement database",
        description=(
            "Fit a learned cost model (xgb: gradient-boosted trees on flat features; gnn: a graph network) on the "
            "valid measurements of a database and save it as an artifact directory. With --holdout-family, those "
            "families are left out of training and scored afterwards."
        ),
    )
    t.add_argument("--db", required=True, metavar="PATH", help="measurement database")
    t.add_argument("--model", required=True, choices=KINDS, help="model kind")
    t.add_argument("-o", "--output", required=True, metavar="ARTIFACT", help="artifact directory to write")
    t.add_argument("--holdout-family", action="append", default=[], metavar="NAME",
                   help="leave this source family out of training and report its metrics (repeatable)")
    t.add_argument("--hardware", default=None, metavar="FP", help="train on this hardware fingerprint only")
    t.add_argument("--param", type=_param_arg, action="append", default=[], metavar="KEY=VALUE",
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
    e.add_argument("--db", required=True, metavar="PATH", help="measurement database")
    e.add_argument("--artifact", required=True, metavar="ARTIFACT|default",
                   help="artifact directory, or 'default' for the shipped one that fits this machine")
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
def _load_dataset(path: str, hardware: str | None, progress: bool):
    from collage_ml.db import Database
    from collage_ml.models.dataset import Dataset

    p = Path(path)
    if not p.exists():
        raise CollageError(f"no measurement database at {p}; make one with `collage-ml collect --db {p}`")
    with Database(p, readonly=True) as db:
        ds = Dataset.from_db(db, hardware=hardware, progress=progress)
        if not len(ds):
            st = db.stats()
            have = ", ".join(f"{fp} ({n})" for fp, n in sorted(st["hardware"].items())) or "no rows at all"
            what = f"hardware {hardware}" if hardware else "any hardware"
            raise CollageError(
                f"{p} has no valid measurements for {what} ({st['valid']} valid rows; hardware: {have})"
            )
    return ds


def _check_families(names: Sequence[str], ds, path: str) -> list[str]:
    known = ds.sources()
    unknown = [f for f in names if f not in known]
    if unknown:
        raise CollageError(
            f"unknown family {', '.join(repr(f) for f in unknown)} in {path}; known families: {', '.join(known)}"
        )
    return list(dict.fromkeys(names))


def _progress_enabled(args) -> bool:
    return not args.no_progress and not args.json and sys.stderr.isatty()


def _per_source(ds, pred, families: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Metrics per source family (predictions made once), plus "all" when there is more than one."""
    import numpy as np

    from collage_ml.models.evaluate import evaluate_predictions

    pred = np.asarray(pred, dtype=np.float64)
    out: dict[str, dict[str, Any]] = {}
    for fam in families:
        idx = [i for i, s in enumerate(ds) if s.source == fam]
        sub = [ds[i] for i in idx]
        out[fam] = evaluate_predictions(sub, pred[idx])
    return out


def _metrics_table(title: str, rows: dict[str, dict[str, Any]]) -> None:
    """One column per family (and "all"), one row per metric."""
    from rich.console import Console
    from rich.table import Table

    from collage_ml.models.evaluate import METRIC_LABELS, METRICS, format_metric

    t = Table(title=title)
    t.add_column("metric")
    for fam in rows:
        t.add_column(fam, justify="right")
    t.add_row("samples", *(str(m.get("n", "")) for m in rows.values()))
    for k in METRICS:
        t.add_row(METRIC_LABELS.get(k, k), *(format_metric(k, m.get(k)) for m in rows.values()))
    t.add_row("decision groups", *(str(m.get("n_groups", "")) for m in rows.values()))
    t.add_row("backend groups", *(str(m.get("n_backend_groups", "")) for m in rows.values()))
    Console().print(t)


# ----------------------------------------------------------------------------- train
def _train(args) -> int:
    from collage_ml.models.base import create_model
    from collage_ml.models.evaluate import average_metrics, json_safe

    params = dict(args.param)
    try:
        model = create_model(args.model, **params)
    except (TypeError, ValueError) as e:
        raise ValueError(f"bad --param for {args.model}: {e}") from None
    except ImportError as e:
        raise CollageError(f"the {args.model} cost model needs a package that is not installed: {e}") from None
    ds = _load_dataset(args.db, args.hardware, _progress_enabled(args))
    holdout = _check_families(args.holdout_family, ds, args.db)
    train, test = ds.split_by_source(holdout)
    if not len(train):
        raise CollageError(f"nothing left to train on: every sample of {args.db} is in a held-out family")
    t0 = time.perf_counter()
    model.fit(train)
    fit_s = time.perf_counter() - t0
    try:
        model.save(args.output)
    except OSError as e:
        raise CollageError(f"cannot write the artifact to {args.output}: {e.strerror or e}") from None
    summary: dict[str, Any] = {
        "artifact": str(args.output),
        "kind": args.model,
        "n": len(train),
        "sources": train.sources(),
        "backends": sorted({s.backend for s in train}),
        "hardware": sorted({s.hardware for s in train}),
        "skipped": int(getattr(ds, "skipped", 0)),
        "fit_seconds": round(fit_s, 3),
        "params": model.params,
    }
    held: dict[str, dict[str, Any]] = {}
    if holdout:
        pred, _ = model.predict(test.samples)
        held = _per_source(test.samples, pred, holdout)
        summary["holdout"] = held
        if len(held) > 1:
            summary["holdout_average"] = average_metrics(held)
    if args.json:
        print(json.dumps(json_safe(summary), indent=2, default=str))
        return 0
    print(
        f"trained {args.model} on {len(train)} samples ({len(summary['sources'])} sources: "
        f"{', '.join(summary['sources'])}; backends {', '.join(summary['backends'])}) in {fit_s:.1f} s"
    )
    if summary["skipped"]:
        print(f"skipped {summary['skipped']} rows whose stored subgraph no longer parses")
    if held:
        rows = dict(held)
        if len(held) > 1:
            rows["mean over families"] = summary["holdout_average"]
        _metrics_table(f"held out: {', '.join(holdout)} ({len(test)} samples)", rows)
    print(f"saved {args.output}")
    return 0


# ----------------------------------------------------------------------------- eval
def _eval(args) -> int:
    import numpy as np

    from collage_ml.models.base import ArtifactError, load_model
    from collage_ml.models.evaluate import evaluate_predictions, json_safe

    try:
        model = load_model(args.artifact)
    except ImportError as e:
        raise ArtifactError(f"cannot load the cost model {args.artifact}: a package is missing ({e})") from None
    ds = _load_dataset(args.db, args.hardware, _progress_enabled(args))
    families = _check_families(args.holdout_family, ds, args.db) if args.holdout_family else ds.sources()
    if args.holdout_family:
        keep = set(families)
        ds = ds.filter(lambda s: s.source in keep)
    trained = (model.meta.get("trained_on") or {}) if isinstance(model.meta, dict) else {}
    overlap = sorted(set(families) & set(trained.get("sources") or []))
    if overlap:
        hw_trained = set(trained.get("hardware") or [])
        hw_eval = {s.hardware for s in ds}
        where = "on the same hardware" if hw_trained & hw_eval else "on other hardware"
        print(
            f"collage-ml: warning: {', '.join(overlap)} {'was' if len(overlap) == 1 else 'were'} among the artifact's "
            f"training sources ({where}): these numbers are not held out by family",
            file=sys.stderr,
        )
    pred, _ = model.predict(ds.samples)
    pred = np.asarray(pred, dtype=np.float64)
    overall = evaluate_predictions(ds, pred)
    per = _per_source(ds.samples, pred, families) if len(families) > 1 else {}
    name = str(args.artifact)
    result = {
        "artifact": name,
        "kind": model.kind,
        "db": str(args.db),
        "families": families,
        "overlaps_training": overlap,
        **overall,
        "per_family": per,
    }
    if args.json:
        print(json.dumps(json_safe(result), indent=2, default=str))
        return 0
    rows = dict(per)
    rows["all" if per else families[0]] = overall
    _metrics_table(f"{model.kind} cost model {name} on {args.db}", rows)
    print(f"{overall['n']} samples, {overall['n_groups']} decision groups ({overall['ungrouped']} samples in none), "
          f"{overall['n_backend_groups']} backend groups")
    return 0


__all__ = ["add_parser", "run"]
