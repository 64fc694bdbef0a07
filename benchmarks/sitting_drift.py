"""How a machine's labels move from one sitting to another, and how much of the move the candidates explain.

    .venv/bin/python benchmarks/sitting_drift.py --db A.db --db B.db [--db C.db ...] [--json OUT]

Each database is a sitting of the same candidates on one CPU kind, thread
count and protocol (a dataset and its reruns, ``datasets/reruns/``). For
every pair of sittings, over the rows both hold, of each candidate's log
ratio ``r = log(second / first)``:

- **raw**: the share within +-10% (``|r| <= log 1.1``);
- **rescaled**: the same once one factor for the whole machine (the median
  ratio) is divided out;
- **calibrated**: once each row is read against its own sitting's
  calibration (the ``roofline-mean`` target's scale): what training does;
- **features**: once the part of ``r`` that the candidate's features
  explain is divided out, a 5-fold XGBoost fit of ``r`` on the subgraph
  features, the backend and the first sitting's log latency, folds grouped
  by subgraph (``r2_cv``: the share of ``r``'s variance it explains). If it
  is high, a sitting's move could be learnt from a few re-measured anchors;
  what is left is the noise no correction removes;
- the same per backend and per latency band.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cost_model import log, write_json  # noqa: E402  (benchmarks/ is not a package)
from label_ceiling import load, row_key  # noqa: E402

from collage_ml.featurize.flat import FEATURES, flat_matrix, machine_log_estimates  # noqa: E402

L10 = math.log(1.1)
#: the machine's columns are the same for every row of a sitting: left out, so the fit sees the candidate only
MACHINE_PREFIXES = ("hw_", "probe:", "roof_", "rel_")
BANDS = ((0.0, 1e-4), (1e-4, 1e-3), (1e-3, 1e-2), (1e-2, math.inf))


def within(r: np.ndarray) -> float:
    return float(np.mean(np.abs(r) <= L10)) if len(r) else math.nan


def explained(first: list, r: np.ndarray, keys: list, folds: int = 5) -> np.ndarray:
    """Out-of-fold predictions of ``r`` from each candidate's features and first-sitting log latency."""
    import xgboost as xgb

    cols = [i for i, f in enumerate(FEATURES) if not f.startswith(MACHINE_PREFIXES)]
    X = flat_matrix([(s.info, s.backend, s.hw) for s in first])[:, cols]
    X = np.column_stack([X, np.log([s.latency for s in first])])
    fold = np.array([zlib.crc32(k[1].encode()) % folds for k in keys])
    pred = np.zeros_like(r)
    for f in range(folds):
        tr, te = fold != f, fold == f
        if not te.any() or not tr.any():
            continue
        m = xgb.XGBRegressor(n_estimators=200, max_depth=4, learning_rate=0.05, subsample=0.8, n_jobs=2, random_state=0)
        m.fit(X[tr], r[tr])
        pred[te] = m.predict(X[te])
    return pred


def pair(a: dict, b: dict) -> dict:
    keys = sorted(k for k in a if k in b)
    first, second = [a[k] for k in keys], [b[k] for k in keys]
    r = np.log(np.array([s.latency for s in second]) / np.array([s.latency for s in first]))
    med = float(np.median(r))
    est = (machine_log_estimates([(s.info, s.hw) for s in second])
           - machine_log_estimates([(s.info, s.hw) for s in first]))
    pred = explained(first, r, keys)
    out = {"n": len(keys), "raw": within(r), "median_ratio": math.exp(med), "rescaled": within(r - med),
           "calibrated": within(r - est) if np.isfinite(est).all() else None, "features": within(r - pred),
           "r2_cv": float(1 - np.var(r - pred) / np.var(r)), "sd_log_ratio": float(np.std(r)),
           "sd_left": float(np.std(r - pred)), "per_backend": {}, "per_latency": {}}
    backends = np.array([k[2] for k in keys])
    for be in sorted(set(backends)):
        sel = backends == be
        out["per_backend"][be] = {"n": int(sel.sum()), "raw": within(r[sel]), "median_ratio": math.exp(np.median(r[sel])),
                                  "rescaled": within(r[sel] - np.median(r[sel]))}
    lat = np.array([s.latency for s in first])
    for lo, hi in BANDS:
        sel = (lat >= lo) & (lat < hi)
        if sel.any():
            out["per_latency"][f"{lo * 1e3:g}-{hi * 1e3:g} ms"] = {
                "n": int(sel.sum()), "median_ratio": math.exp(np.median(r[sel])), "rescaled": within(r[sel] - med)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path, action="append", required=True, help="a sitting (repeat: two or more)")
    ap.add_argument("--json", type=Path, default=None, metavar="PATH")
    args = ap.parse_args()
    if len(args.db) < 2:
        raise SystemExit("sitting_drift: give two --db or more (sittings of the same candidates)")
    t0 = time.perf_counter()
    runs = [{row_key(s): s for s in load(p)} for p in args.db]
    names = [chr(ord("A") + i) for i in range(len(runs))]
    pairs = {}
    for i in range(len(runs)):
        for j in range(i + 1, len(runs)):
            p = pair(runs[i], runs[j])
            if not p["n"]:
                log(f"{names[i]} and {names[j]} share no rows (another machine, thread count or protocol?)")
                continue
            pairs[f"{names[i]}~{names[j]}"] = p
            cal = "-" if p["calibrated"] is None else f"{p['calibrated']:.1%}"
            log(f"{names[i]}~{names[j]}: {p['n']} rows, within +-10% raw {p['raw']:.1%}, rescaled {p['rescaled']:.1%} "
                f"(x{p['median_ratio']:.3f}), calibrated {cal}, features out {p['features']:.1%} "
                f"(R2 {p['r2_cv']:.2f}; sd of log ratio {p['sd_log_ratio']:.3f} -> {p['sd_left']:.3f})")
    if args.json:
        out = {"command": " ".join(sys.argv), "sittings": dict(zip(names, map(str, args.db))), "pairs": pairs,
               "seconds": time.perf_counter() - t0}
        write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
