"""Training and scoring cost models on a measurement database: what ``collage_ml.train`` / ``evaluate`` and
``collage-ml train`` / ``eval`` run.

:func:`train` fits a model on a database's valid rows (optionally leaving
families out and scoring them); :func:`evaluate` scores an artifact. Errors
are :class:`~collage_ml.errors.CollageError` (one line in the CLI); bad model
parameters are a ``ValueError``.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from collage_ml.defaults import COST_MODEL, DB, MODEL_KIND, PROGRESS, SITTINGS, SITTINGS_CHOICES
from collage_ml.errors import CollageError


def database_path(db: Any) -> Path:
    """``db`` as a path: None is the per-user database; of several, the first."""
    from collage_ml.db import Database, default_db_path

    if db is None:
        return default_db_path()
    if isinstance(db, (list, tuple)):
        return database_path(db[0]) if db else default_db_path()
    if isinstance(db, Database):
        return db.path
    return Path(db)


def load_dataset(db: Any, hardware: str | None = None, progress: bool = False, pool: bool | str = False,
                 sittings: str = SITTINGS):
    """The valid rows of ``db`` (a path, an open Database, None for the per-user one, or a list of those:
    their rows together) as a Dataset.

    With ``pool``, each machine's samples in a list get one probe table, the median of its databases'
    calibrations (:func:`~collage_ml.models.dataset.pool_probes`; ``pool="node"``: each instance of a machine
    apart); ``Dataset.pooled`` says which machines had several. A candidate that several databases of a list
    measured on one machine is one sample under ``sittings="mean"``
    (:func:`~collage_ml.models.dataset.merge_sittings`; ``Dataset.merged`` counts them), one per database
    under ``"each"``."""
    from collage_ml.db import Database
    from collage_ml.models.dataset import Dataset, merge_sittings, pool_probes

    if sittings not in SITTINGS_CHOICES:
        raise ValueError(f"sittings must be one of {', '.join(SITTINGS_CHOICES)}, got {sittings!r}")
    if isinstance(db, (list, tuple)):
        if not db:
            raise CollageError("no measurement database given")
        seen: set[Path] = set()
        for p in map(database_path, db):  # one database twice would read as two sittings of every candidate
            if str(p) != ":memory:" and p.resolve() in seen:
                raise CollageError(f"{p} is given twice; give each database once")
            seen.add(p.resolve())
        parts = [load_dataset(d, hardware, progress) for d in db]
        pooled = pool_probes(parts, "machine" if pool is True else pool) if pool else {}
        if sittings == "mean":
            out = merge_sittings(parts)
        else:
            out = Dataset([s for part in parts for s in part.samples])
            out.merged = {}  # type: ignore[attr-defined]
        out.skipped = sum(int(getattr(part, "skipped", 0)) for part in parts)  # type: ignore[attr-defined]
        out.pooled = pooled  # type: ignore[attr-defined]
        return out

    p = database_path(db)
    if isinstance(db, Database):
        return _dataset_of(db, p, hardware, progress, Dataset)
    if not p.exists() and str(p) != ":memory:":  # Database refuses that name in its own words
        raise CollageError(f"no measurement database at {p}; make one with `collage-ml collect --db {p}`")
    with Database(p, readonly=True) as opened:
        return _dataset_of(opened, p, hardware, progress, Dataset)


def _dataset_of(db, p: Path, hardware: str | None, progress: bool, Dataset):
    ds = Dataset.from_db(db, hardware=hardware, progress=progress)
    if not len(ds):
        st = db.stats()
        have = ", ".join(f"{fp} ({n})" for fp, n in sorted(st["hardware"].items())) or "no rows at all"
        what = f"hardware {hardware}" if hardware else "any hardware"
        raise CollageError(f"{p} has no valid measurements for {what} ({st['valid']} valid rows; hardware: {have})")
    return ds


def check_families(names: Sequence[str], ds, where: Any) -> list[str]:
    """``names`` without duplicates; a CollageError naming the known families when one is not in ``ds``."""
    if isinstance(names, str):
        names = [names]
    known = ds.sources()
    unknown = [f for f in names if f not in known]
    if unknown:
        raise CollageError(
            f"unknown family {', '.join(repr(f) for f in unknown)} in {where}; known families: {', '.join(known)}"
        )
    return list(dict.fromkeys(names))


def per_family(samples, pred, families: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Metrics per source family (predictions made once)."""
    import numpy as np

    from collage_ml.models.evaluate import evaluate_predictions

    pred = np.asarray(pred, dtype=np.float64)
    out: dict[str, dict[str, Any]] = {}
    for fam in families:
        idx = [i for i, s in enumerate(samples) if s.source == fam]
        out[fam] = evaluate_predictions([samples[i] for i in idx], pred[idx])
    return out


def make_model(kind: str, params: Mapping[str, Any] | None = None, what: str = "params"):
    """An unfitted cost model of ``kind`` (``xgb`` or ``gnn``); ValueError for parameters it does not take."""
    from collage_ml.models.base import create_model

    try:
        return create_model(kind, **dict(params or {}))
    except (TypeError, ValueError) as e:
        raise ValueError(f"bad {what} for the {kind} cost model: {e}") from None
    except ImportError as e:
        raise CollageError(f"the {kind} cost model needs a package that is not installed: {e}") from None


def train(
    db: Any = DB,
    model: Any = MODEL_KIND,
    out: str | Path | None = None,
    holdout_families: Sequence[str] = (),
    params: Mapping[str, Any] | None = None,
    *,
    hardware: str | None = None,
    progress: bool = PROGRESS,
    pool_probes: bool | str = False,
    sittings: str = SITTINGS,
):
    """Fits a cost model; returns it, with ``model.training`` holding the summary (see :func:`collage_ml.train`)."""
    from collage_ml.models.base import CostModel
    from collage_ml.models.evaluate import average_metrics

    if isinstance(model, CostModel):
        if params:
            raise ValueError("params are for a model kind; this model was built already")
        m = model
    else:
        m = make_model(str(model), params)
    ds = load_dataset(db, hardware, progress, pool=pool_probes, sittings=sittings)
    where = database_path(db)
    holdout = check_families(holdout_families, ds, where)
    train_set, test = ds.split_by_source(holdout)
    if not len(train_set):
        raise CollageError(f"nothing left to train on: every sample of {where} is in a held-out family")
    t0 = time.perf_counter()
    m.fit(train_set)
    fit_s = time.perf_counter() - t0
    if out is not None:
        try:
            m.save(out)
        except OSError as e:
            raise CollageError(f"cannot write the artifact to {out}: {e.strerror or e}") from None
    summary: dict[str, Any] = {
        "artifact": None if out is None else str(out),
        "kind": m.kind,
        "n": len(train_set),
        "sources": train_set.sources(),
        "backends": sorted({s.backend for s in train_set}),
        "hardware": sorted({s.hardware for s in train_set}),
        "skipped": int(getattr(ds, "skipped", 0)),
        "pooled_probes": dict(getattr(ds, "pooled", {})),
        "merged_sittings": dict(getattr(ds, "merged", {})),
        "fit_seconds": round(fit_s, 3),
        "params": m.params,
        "holdout_families": holdout,
        "n_holdout": len(test),
    }
    if holdout:
        pred, _ = m.predict(test.samples)
        held = per_family(test.samples, pred, holdout)
        summary["holdout"] = held
        if len(held) > 1:
            summary["holdout_average"] = average_metrics(held)
    m.training = summary
    return m


def evaluate(
    db: Any = DB,
    artifact: Any = COST_MODEL,
    holdout_families: Sequence[str] = (),
    *,
    hardware: str | None = None,
    progress: bool = PROGRESS,
    on_warning: Callable[[str], None] | None = None,
    sittings: str = SITTINGS,
) -> dict[str, Any]:
    """The metrics of ``artifact`` on ``db`` (see :func:`collage_ml.evaluate`).

    ``on_warning(text)`` hears that the evaluated families were among the
    artifact's training sources; by default that is a ``UserWarning``.
    """
    import numpy as np

    from collage_ml.models.base import ArtifactError, CostModel, load_model
    from collage_ml.models.evaluate import evaluate_predictions

    if isinstance(artifact, CostModel):
        model, name = artifact, f"<{artifact.kind} model>"
    else:
        try:
            model = load_model(artifact)
        except ImportError as e:
            raise ArtifactError(f"cannot load the cost model {artifact}: a package is missing ({e})") from None
        name = str(artifact)
    ds = load_dataset(db, hardware, progress, sittings=sittings)
    where = database_path(db)
    families = check_families(holdout_families, ds, where) if holdout_families else ds.sources()
    if holdout_families:
        keep = set(families)
        ds = ds.filter(lambda s: s.source in keep)
    trained = (model.meta.get("trained_on") or {}) if isinstance(model.meta, dict) else {}
    overlap = sorted(set(families) & set(trained.get("sources") or []))
    if overlap:
        same_hw = set(trained.get("hardware") or []) & {s.hardware for s in ds}
        text = (f"{', '.join(overlap)} {'was' if len(overlap) == 1 else 'were'} among the artifact's training "
                f"sources ({'on the same hardware' if same_hw else 'on other hardware'}): these numbers are not "
                "held out by family")
        if on_warning is None:
            warnings.warn(text, UserWarning, stacklevel=3)
        else:
            on_warning(text)
    pred, _ = model.predict(ds.samples)
    pred = np.asarray(pred, dtype=np.float64)
    overall = evaluate_predictions(ds, pred)
    return {
        "artifact": name,
        "kind": model.kind,
        "db": " + ".join(str(database_path(d)) for d in db) if isinstance(db, (list, tuple)) else str(where),
        "families": families,
        "overlaps_training": overlap,
        "merged_sittings": dict(getattr(ds, "merged", {})),
        **overall,
        "per_family": per_family(ds.samples, pred, families) if len(families) > 1 else {},
    }


__all__ = ["check_families", "database_path", "evaluate", "load_dataset", "make_model", "per_family", "train"]
