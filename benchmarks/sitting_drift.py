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

With three sittings or more, **means of sittings** (over the rows every
sitting holds): each sitting read on the first one's scale, per backend,
either by the median ratio over the rows (what ``merge_sittings`` does) or
through its calibration. Every split into two disjoint sets of ``h``
sittings compares their means (``h`` = 1: one against one), and each
sitting is compared with the mean of the others. If the sittings' noise is
independent, the log ratio's standard deviation falls as ``1/sqrt(h)``;
``sigma`` (one against one, over sqrt 2) is then one sitting's noise, and
``ceiling_k`` the share of a k-sitting mean's labels within +-10% of the
candidate's expected latency, ``P(|N(0, sigma/sqrt k)| <= log 1.1)``: what a
perfect model could score against them.

``--sharded N``: the last sitting was collected as ``N`` shards one after
another (``collect --shard i/N`` in turn), so each source's candidates are
spread over the sitting's time. Within each (source, backend) group, the
log ratio to every other sitting is corrected by the group's median,
leave-one-out, and then by the median of the group's candidates in the same
shard; if the last sitting's drift is in time, not in the candidates, the
shard explains more than a random split of the groups into shards of the
same sizes does (``null``: 20 shuffles).
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cost_model import log, write_json  # noqa: E402  (benchmarks/ is not a package)
from label_ceiling import load, machine_estimate, row_key  # noqa: E402

from collage_ml.collector.sharding import shard_of  # noqa: E402

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


def on_first_scale(runs: list[dict], keys: list, calibrated: bool) -> list[np.ndarray]:
    """Each sitting's log latencies of ``keys`` on the first sitting's scale: per backend by the median ratio,
    or through each row's own calibration."""
    logs = [np.log([r[k].latency for k in keys]) for r in runs]
    if calibrated:
        est = [machine_log_estimates([(r[k].info, r[k].hw) for k in keys]) for r in runs]
        return [lg - e + est[0] for lg, e in zip(logs, est)]
    backends = np.array([k[2] for k in keys])
    out = []
    for lg in logs:
        f = np.zeros_like(lg)
        for be in set(backends):
            sel = backends == be
            f[sel] = np.median((lg - logs[0])[sel])
        out.append(lg - f)
    return out


def ceiling(sigma: float, k: int) -> float:
    """P(|N(0, sigma / sqrt k)| <= log 1.1)."""
    return math.erf(L10 / (sigma / math.sqrt(k)) / math.sqrt(2))


def means_of_sittings(runs: list[dict]) -> dict:
    keys = sorted(set.intersection(*(set(r) for r in runs)))
    n = len(runs)
    out: dict = {"n": len(keys), "sittings": n}
    for read in ("shared", "calibrated"):
        if read == "calibrated" and not all(np.isfinite(machine_estimate(r[keys[0]])) for r in runs):
            continue
        M = on_first_scale(runs, keys, read == "calibrated")
        splits: dict[str, dict] = {}
        for h in range(1, n // 2 + 1):
            agree, sd = [], []
            for first in itertools.combinations(range(n), h):
                for second in itertools.combinations([i for i in range(n) if i not in first], h):
                    if h == n / 2 and first > second:
                        continue
                    r = np.mean([M[i] for i in second], axis=0) - np.mean([M[i] for i in first], axis=0)
                    agree.append(within(r - np.median(r)))
                    sd.append(float(np.std(r)))
            splits[str(h)] = {"pairs": len(agree), "within_10pct": float(np.mean(agree)), "sd_log_ratio": float(np.mean(sd))}
        left = [M[i] - np.mean([M[j] for j in range(n) if j != i], axis=0) for i in range(n)]
        sigma = splits["1"]["sd_log_ratio"] / math.sqrt(2)
        out[read] = {"splits": splits, "one_vs_rest": float(np.mean([within(r - np.median(r)) for r in left])),
                     "sigma": sigma, "ceiling_k": {str(k): ceiling(sigma, k) for k in range(1, 9)},
                     "k_for_80pct": next((k for k in range(1, 65) if ceiling(sigma, k) >= 0.8), None)}
    return out


def sharded(runs: list[dict], shards: int, reps: int = 20) -> dict:
    """Is the last sitting's drift in time (its shards) or in the candidates? See the module docstring."""
    last = runs[-1]
    rng = np.random.default_rng(0)
    out = {}
    for j, other in enumerate(runs[:-1]):
        keys = sorted(k for k in last if k in other)
        r = np.log(np.array([last[k].latency for k in keys]) / np.array([other[k].latency for k in keys]))
        group = [(last[k].source, k[2]) for k in keys]
        shard = np.array([shard_of(last[k].key, shards) for k in keys])

        def corrected(labels) -> float:
            members: dict = {}
            for i, g in enumerate(labels):
                members.setdefault(g, []).append(i)
            left = np.empty_like(r)
            for idx in members.values():
                for i in idx:
                    rest = [x for x in idx if x != i]
                    left[i] = r[i] - (np.median(r[rest]) if rest else 0.0)
            return within(left)

        members: dict = {}
        for i, g in enumerate(group):
            members.setdefault(g, []).append(i)
        null = []
        for _ in range(reps):
            sh = shard.copy()
            for idx in members.values():
                sh[idx] = rng.permutation(sh[idx])
            null.append(corrected([(*g, s) for g, s in zip(group, sh)]))
        out[f"{chr(ord('A') + j)}"] = {
            "n": len(keys), "group": corrected(group), "group_and_shard": corrected([(*g, s) for g, s in zip(group, shard)]),
            "null_mean": float(np.mean(null)), "null_sd": float(np.std(null)), "null_max": float(np.max(null))}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path, action="append", required=True, help="a sitting (repeat: two or more)")
    ap.add_argument("--sharded", type=int, default=0, metavar="N",
                    help="the last sitting was collected as N shards one after another (collect --shard i/N)")
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
    means = means_of_sittings(runs) if len(runs) >= 3 else None
    for read, m in (means or {}).items():
        if isinstance(m, dict):
            log(f"means of sittings ({read}, {means['n']} rows): " + ", ".join(
                f"{h} vs {h}: {v['within_10pct']:.1%} (sd {v['sd_log_ratio']:.3f})" for h, v in m["splits"].items())
                + f"; one vs the rest {m['one_vs_rest']:.1%}; sigma {m['sigma']:.3f}, a k-sitting mean within +-10% "
                f"of the expected latency: " + ", ".join(f"k={k} {v:.0%}" for k, v in m["ceiling_k"].items())
                + f"; 80% at k={m['k_for_80pct']}")
    shards = sharded(runs, args.sharded) if args.sharded > 1 else None
    for other, v in (shards or {}).items():
        log(f"{names[-1]} sharded, against {other}: {v['n']} rows, within +-10% once the (source, backend) "
            f"median is divided out {v['group']:.1%}, the (source, backend, shard) median {v['group_and_shard']:.1%} "
            f"(shards shuffled within groups: {v['null_mean']:.1%} +- {v['null_sd']:.1%}, max {v['null_max']:.1%})")
    if args.json:
        out = {"command": " ".join(sys.argv), "sittings": dict(zip(names, map(str, args.db))), "pairs": pairs,
               "means_of_sittings": means, "sharded": shards, "seconds": time.perf_counter() - t0}
        write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
