"""Which reading of two sittings' calibrations makes their labels agree best?

Each pair is two databases of one machine kind, thread count and protocol that hold the same candidates
(a dataset and its rerun, `datasets/reruns/`). For every candidate both measured, B's label is multiplied
by a factor f and compared with A's; the score is the share within ±10% (symmetric: |log(f B / A)| <=
log 1.1). The factors:

- ``raw``: 1;
- ``roofline``: A's machine roofline estimate of the candidate over B's (``featurize.roofline.
  machine_log_estimate``, each row's own calibration): what the ``roofline-mean`` target does to labels;
- ``roofline-joint``: the same with the probes' rates fitted jointly (one overhead for every probe;
  ``featurize.roofline.FIT = "joint"``, studied 2026-12-06 and not adopted) where ``roofline`` uses the
  featurizer's fit (a line through each kernel's two batches);
- ``probe-median``: per backend, the median over probes of A's probe latency over B's;
- ``probe-all``: the same median over every backend's probes (one factor per pair of calibrations);
- ``oracle``: the median label ratio A/B (one factor per pair, known only after measuring both).

    benchmarks/calibration_normalizers.py A.db,B.db [C.db,D.db ...] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from collage_ml.featurize import roofline  # noqa: E402
from label_ceiling import agreement, load, machine_estimate, row_key  # noqa: E402  (benchmarks/ is not a package)

ARMS = ("raw", "roofline", "roofline-joint", "probe-median", "probe-all", "oracle")


def _rows(path: str) -> dict:
    return {row_key(s): s for s in load(Path(path))}


def _within(r: np.ndarray) -> float:
    """Share of B x factor within ±10% of A, symmetric (``label_ceiling.agreement``)."""
    return agreement(np.ones(len(r)), r)["within_10pct"]


def _probe_ratio(a, b, backend: str | None) -> float:
    """Median over probes (of ``backend``, or of every backend both have) of A's latency over B's."""
    pa, pb = dict(a.hw.probes), dict(b.hw.probes)
    names = [backend] if backend else sorted(set(pa) & set(pb))
    return float(np.median([x / y for n in names for x, y in zip(pa[n], pb[n]) if x and y]))


def compare(pa: str, pb: str, cache: dict) -> dict:
    a = cache.setdefault(pa, _rows(pa))
    b = cache.setdefault(pb, _rows(pb))
    keys = [k for k in b if k in a]
    if not keys:
        raise SystemExit(f"{pa} and {pb} share no candidate")
    lab = np.array([b[k].latency / a[k].latency for k in keys])
    fit = roofline.FIT

    def estimate_ratios(with_fit: str) -> np.ndarray:  # A's machine estimate over B's, the rates fitted so
        try:
            roofline.FIT = with_fit
            return np.array([math.exp(machine_estimate(a[k]) - machine_estimate(b[k])) for k in keys])
        finally:
            roofline.FIT = fit

    est, est2 = estimate_ratios(fit), estimate_ratios("joint")
    memo: dict = {}

    def ratio(k, backend):  # once per pair of calibrations and backend
        m = (id(a[k].hw), id(b[k].hw), backend)
        if m not in memo:
            memo[m] = _probe_ratio(a[k], b[k], backend)
        return memo[m]

    factors = {
        "raw": np.ones(len(keys)), "roofline": est, "roofline-joint": est2,
        "probe-median": np.array([ratio(k, k[-1]) for k in keys]),  # k: label_ceiling.row_key, backend last
        "probe-all": np.array([ratio(k, None) for k in keys]),
        "oracle": np.full(len(keys), 1 / float(np.median(lab))),
    }
    out: dict = {"n": len(keys), **{arm: _within(lab * factors[arm]) for arm in ARMS}}
    out["label_ratio"] = float(np.median(lab))  # B / A
    out["roofline_ratio"] = float(np.median(1 / est))  # B's estimate / A's
    out["roofline_joint_ratio"] = float(np.median(1 / est2))
    out["roofline_fit"] = fit
    out["probe_median_ratio"] = float(np.median(1 / factors["probe-median"]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pairs", nargs="+", help="A.db,B.db: a dataset and its rerun")
    ap.add_argument("--json")
    args = ap.parse_args()
    warnings.filterwarnings("ignore", category=UserWarning)
    cache: dict = {}
    res = {}
    for pair in args.pairs:
        try:
            pa, pb = pair.split(",")
        except ValueError:
            print(f"calibration_normalizers: a pair is A.db,B.db, not {pair!r}", file=sys.stderr)
            return 2
        res[pair] = r = compare(pa, pb, cache)
        print(f"{pa} vs {pb}: n={r['n']} " + " ".join(f"{arm} {100 * r[arm]:.1f}%" for arm in ARMS)
              + f" (labels B/A {r['label_ratio']:.3f}, roofline {r['roofline_ratio']:.3f})", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
