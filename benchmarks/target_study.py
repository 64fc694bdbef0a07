"""Which training target carries over to unseen families and machines: the study of issue 16, point 2.

    .venv/bin/python benchmarks/target_study.py --json benchmarks/results/target_study.json

One XGBoost booster per variant (the shipped model's depth, rate and rounds, one member: the study compares
targets, not ensembles), on the same rows, scored with ``collage_ml.models.evaluate``:

- ``log``: log latency (the regressors alone, ``ranker=False``);
- ``roofline``: log(latency / the probes' roofline estimate), through ``base_margin`` (``target=roofline``);
- ``level+delta``: MetaSchedule-style normalisation by the group: one booster on the mean log latency of the
  "same subgraph, which backend" group, one on each row's deviation from it; the prediction is their sum;
- ``rank``: XGBoost ``rank:pairwise`` within those groups alone (scale-free: only its ordering metrics mean
  anything);
- ``ranker-order``: the regressors' values, reassigned within each group in the ranker's order;
- ``log+ranker``: the same in the order of log latency - ``ranker_weight`` x ranker score (what
  ``XGBCostModel`` does by default, weight 0.1): the ranker overrides the regressors where it is sure.

Protocols: leave one family out over ``--db`` (default datasets/cpu-2core-zen5), and leave one machine out over
every dataset with probes (``--hardware-dbs``), as in ``benchmarks/cost_model.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import xgboost as xgb

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from collage_ml.featurize.flat import FEATURES, flat_matrix  # noqa: E402
from collage_ml.models.dataset import Dataset  # noqa: E402
from collage_ml.models.evaluate import average_metrics, evaluate_predictions, json_safe  # noqa: E402
from collage_ml.models.xgb import DEFAULTS, XGBCostModel  # noqa: E402
from shipped_datasets import dataset_dbs  # noqa: E402  (benchmarks/ is on sys.path when run)

VARIANTS = ("log", "roofline", "level+delta", "rank", "ranker-order", "log+ranker")
SHOWN = ("mape", "within_10pct", "pairwise_accuracy", "top1_regret", "backend_pairwise_accuracy", "backend_choice_regret")
#: one member, no bootstrap: the variants differ in their target only
ONE = {"n_members": 1}
#: the level+delta booster's parameters: those of XGBCostModel's single member
PARAMS = dict(objective="reg:squarederror", tree_method="hist", max_depth=DEFAULTS["max_depth"], eta=DEFAULTS["learning_rate"],
              min_child_weight=DEFAULTS["min_child_weight"], subsample=DEFAULTS["subsample"],
              colsample_bytree=DEFAULTS["colsample_bytree"], seed=0, nthread=1, verbosity=0)


def _train(X, y):
    return xgb.train(PARAMS, xgb.DMatrix(X, label=y, feature_names=list(FEATURES)), DEFAULTS["n_estimators"])


def predictions(train: Dataset, test: Dataset, variants) -> dict[str, np.ndarray]:
    """Log-latency predictions of each variant for ``test``, trained on ``train``.

    The shipped variants are :class:`XGBCostModel` itself, fitted once: ``ranker_weight`` 0 leaves the
    regressors' order (``log``), a huge weight is the ranker's order alone (``ranker-order``)."""
    out: dict[str, np.ndarray] = {}
    if {"log", "rank", "ranker-order", "log+ranker"} & set(variants):
        m = XGBCostModel(**ONE).fit(train)
        for name, weight in (("log", 0.0), ("ranker-order", 1e9), ("log+ranker", DEFAULTS["ranker_weight"])):
            m.params["ranker_weight"] = weight
            out[name] = m.predict_log(test.samples)[0]
        out["rank"] = -m.ranker.inplace_predict(flat_matrix([(s.info, s.backend, s.hw) for s in test.samples]))
    if "roofline" in variants:
        out["roofline"] = XGBCostModel(**ONE, target="roofline", ranker=False).fit(train).predict_log(test.samples)[0]
    if "level+delta" in variants:
        ids: dict = {}
        q = np.array([ids.setdefault((s.hardware, s.info.hash), len(ids)) for s in train.samples])
        Xtr, ytr = flat_matrix([(s.info, s.backend, s.hw) for s in train.samples]), train.y()
        mean = (np.bincount(q, weights=ytr) / np.bincount(q))[q]
        many = np.bincount(q)[q] >= 2
        Xte = flat_matrix([(s.info, s.backend, s.hw) for s in test.samples])
        out["level+delta"] = _train(Xtr, mean).inplace_predict(Xte) + _train(Xtr[many], (ytr - mean)[many]).inplace_predict(Xte)
    return {v: out[v] for v in variants}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path, default=ROOT / "datasets" / "cpu-2core-zen5" / "measurements.db")
    ap.add_argument("--hardware-dbs", type=Path, nargs="*",
                    default=dataset_dbs())
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise SystemExit(f"unknown variant(s) {', '.join(bad)}; choose from {', '.join(VARIANTS)}")
    t0 = time.perf_counter()
    results: dict = {"db": str(args.db), "variants": variants, "lofo": {}, "hardware_out": {}}
    not_probe = lambda s: s.family != "probe"  # noqa: E731

    data = Dataset.from_db(args.db).filter(not_probe)
    per = {v: {} for v in variants}
    for fam in data.sources():
        train, test = data.split_by_source([fam])
        for v, p in predictions(train, test, variants).items():
            per[v][fam] = evaluate_predictions(test, np.exp(p))
        print(f"{time.strftime('%H:%M:%S')} family {fam} done", file=sys.stderr, flush=True)
    results["lofo"] = {v: {"families": per[v], "mean": average_metrics(per[v])} for v in variants}

    allrows = None
    for p in args.hardware_dbs:
        part = Dataset.from_db(p).filter(not_probe)
        allrows = part if allrows is None else allrows + part
    for hw in sorted({s.hardware for s in allrows}):
        test = allrows.filter(lambda s: s.hardware == hw)
        if not any(s.hw.probes for s in test.samples[:1]):
            continue  # a machine without probes: nothing to transfer from
        train = allrows.filter(lambda s: s.hardware != hw)
        preds = predictions(train, test, variants)
        results["hardware_out"][hw] = {v: evaluate_predictions(test, np.exp(p)) for v, p in preds.items()}
        print(f"{time.strftime('%H:%M:%S')} machine {hw} done", file=sys.stderr, flush=True)
    results["seconds"] = time.perf_counter() - t0

    def row(label, m):
        print(f"  {label:12s} " + "  ".join(f"{k} {m.get(k, float('nan')):.3f}" for k in SHOWN))

    print(f"leave one family out ({args.db.parent.name}), mean over families:")
    for v in variants:
        row(v, results["lofo"][v]["mean"])
    for hw, per_v in results["hardware_out"].items():
        print(f"leave one machine out: {hw}")
        for v in variants:
            row(v, per_v[v])
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(json_safe(results), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
