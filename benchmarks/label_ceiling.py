"""How well can a cost model score against labels that do not repeat? The same candidates measured twice or more.

    .venv/bin/python benchmarks/label_ceiling.py --db A.db --rerun B.db [--rerun C.db ...] [--extra-train-db S.db]
        [--train-on-mean] [--models xgb|none] [--json OUT]

``B.db`` (and ``C.db``, ...) is another collection of ``A.db``'s candidates
on the same CPU kind, thread count and protocol (``collage-ml collect`` into
a fresh database): a sitting of its own. Every pair of sittings is compared
first (``agreement_pairs``: within +-10%, the median ratio, and within +-10%
with that one factor divided out). Then, over the rows every sitting holds,
per held-out family and the mean over families, with the metrics of
``collage_ml.models.evaluate``:

1. **re-measured**: run B's latencies scored as predictions of run A's
   labels, as a cost model is scored in ``benchmarks/cost_model.py``. This is
   what measuring every candidate a second time scores. It is not a strict
   ceiling: a model that predicted each candidate's expected latency would
   carry run A's noise only, where run B carries both runs'. Runs hours
   apart can also differ by one factor for the whole machine (the host's
   load); **re-measured, rescaled** divides it out (run B times the median
   of A / B), which the probe-relative targets are meant to do for a model.
   **re-measured, calibrated** reads each run against its own sitting's
   calibration instead (run B times A's / B's machine estimate of the
   candidate, the ``roofline-mean`` target's scale): what training does with
   databases that ``collect`` calibrated in every sitting. It is left out when
   either run holds no calibration. With three sittings or more, **the last
   sitting as predictions of the others' mean** is scored beside the model
   against the same labels: a fresh measurement and the model predicting a
   label with less noise in it.
2. **the model against each label set**: leave one family out, XGBoost (or
   ``--models``) trained on run A's rows of the other families (plus
   ``--extra-train-db``), its predictions for the held-out family scored
   against each sitting's labels and against the geometric mean of all of
   them (each candidate's noise, if independent between sittings, shrunk by
   the square root of their count). If the metrics rise against the mean,
   label noise is holding them down.
3. ``--train-on-mean``: the same, trained on the sittings merged as
   ``collage-ml train`` merges them (``models.dataset.merge_sittings``: one
   sample per candidate, the geometric mean of its sittings, each read
   against its own calibration), scored against the mean. The other
   families' training labels then share their sittings with the scored
   labels; ``--train-on-rest`` (three sittings or more) trains on every
   sitting but the last, merged, and scores against the last, which no
   training label came from. ``--no-base`` skips the model trained on run A
   alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cost_model import log, side_by_side, write_json  # noqa: E402  (benchmarks/ is not a package)

from collage_ml.errors import CollageError  # noqa: E402
from collage_ml.featurize.flat import machine_log_estimates  # noqa: E402
from collage_ml.models.base import create_model  # noqa: E402
from collage_ml.models.dataset import Dataset, merge_sittings  # noqa: E402
from collage_ml.models.evaluate import average_metrics, evaluate_predictions  # noqa: E402


def row_key(s) -> tuple[str, str, str]:
    return (s.hardware, s.info.hash, s.backend)


def with_labels(data: Dataset, labels: dict[tuple[str, str, str], float]) -> Dataset:
    """``data`` with each sample's latency replaced where ``labels`` has its key."""
    return Dataset([dataclasses.replace(s, latency=labels[row_key(s)]) if row_key(s) in labels else s for s in data])


def load(path: Path) -> Dataset:
    try:
        return Dataset.from_db(path).filter(lambda s: s.source != "probe")
    except CollageError as e:
        raise SystemExit(f"{Path(sys.argv[0]).stem}: {path}: {e}") from None


def machine_estimate(s) -> float:
    """The machine's mean roofline estimate of a sample's candidate (log seconds) from the calibration its row
    reads (its own sitting's); NaN for an uncalibrated machine."""
    return float(machine_log_estimates([(s.info, s.hw)])[0])


def agreement(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """How two runs' labels of the same rows agree: ``within_10pct`` symmetric in the runs (|log B/A| <= log 1.1),
    ``within_10pct_of_a`` as the cost-model metric counts B as a prediction of A (|B/A - 1| <= 0.1)."""
    r = np.abs(np.log(b / a))
    return {"n": int(len(a)), "within_10pct": float((r <= math.log(1.1)).mean()),
            "within_10pct_of_a": float((np.abs(b / a - 1) <= 0.10).mean()), "median_abs_log_ratio": float(np.median(r)),
            "median_ratio_b_over_a": float(np.exp(np.median(np.log(b / a))))}


def names_of(n: int) -> list[str]:
    """The sittings' names: A (the dataset), then B, C, ... (its reruns)."""
    return [chr(ord("A") + i) for i in range(n)]


def geomean(labels: list[dict], keys) -> dict:
    return {k: float(np.exp(np.mean([math.log(lab[k]) for lab in labels]))) for k in keys}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path, required=True, help="run A: the dataset the model trains on")
    ap.add_argument("--rerun", type=Path, required=True, action="append",
                    help="run B: the same candidates measured again (repeat it for C, D, ...)")
    ap.add_argument("--extra-train-db", type=Path, action="append", default=[], metavar="PATH",
                    help="rows that join every training set (less the held-out family), never scored")
    ap.add_argument("--models", default="xgb", help="model kinds, comma-separated (default: xgb); 'none': the "
                                                    "re-measured rows only")
    ap.add_argument("--families", default=None, help="hold out only these families (default: every one both runs hold)")
    ap.add_argument("--train-on-mean", action="store_true", help="also train on the sittings merged (their mean)")
    ap.add_argument("--train-on-rest", action="store_true",
                    help="with three sittings or more, also train on every sitting but the last merged, and score "
                         "against the last: a sitting the model never trained on")
    ap.add_argument("--no-base", action="store_true", help="skip the model trained on run A alone")
    ap.add_argument("--json", type=Path, default=None, metavar="PATH")
    args = ap.parse_args()
    t0 = time.perf_counter()

    runs = [load(args.db)] + [load(p) for p in args.rerun]
    names = names_of(len(runs))
    lat = [{row_key(s): s.latency for s in r} for r in runs]
    a, b, b_lat = runs[0], runs[1], lat[1]
    both = a.filter(lambda s: all(row_key(s) in m for m in lat[1:]))
    if not len(both):
        raise SystemExit(f"label_ceiling: the reruns hold none of {args.db}'s rows in common (another machine, "
                         "thread count or protocol?)")
    keys = [row_key(s) for s in both]
    mean_lat = geomean(lat, keys)
    rest_mean = geomean(lat[:-1], keys) if len(runs) > 2 else {}  # every sitting but the last
    fams = [f.strip() for f in args.families.split(",")] if args.families else sorted(set(both.sources()))
    extra = Dataset()
    for p in args.extra_train_db:
        extra = extra + load(p)
    pairs: dict[str, dict[str, Any]] = {}
    for i in range(len(runs)):
        for j in range(i + 1, len(runs)):
            shared = [k for k in lat[i] if k in lat[j]]
            x, y = np.array([lat[i][k] for k in shared]), np.array([lat[j][k] for k in shared])
            pair = agreement(x, y)
            pair["rescaled"] = agreement(x, y / pair["median_ratio_b_over_a"])
            pairs[f"{names[i]}~{names[j]}"] = pair
            log(f"{names[i]} and {names[j]}: {len(shared)} rows in both, within +-10% {pair['within_10pct']:.1%} "
                f"({pair['rescaled']['within_10pct']:.1%} rescaled), {names[j]}/{names[i]} at the median "
                f"{pair['median_ratio_b_over_a']:.3f}")
    agree = agreement(both.latencies(), np.array([b_lat[k] for k in keys]))
    log(f"{len(both)} rows in every sitting ({', '.join(f'{n} {len(r)}' for n, r in zip(names, runs))}); "
        f"A~B within +-10%: {agree['within_10pct']:.1%}, B/A at the median {agree['median_ratio_b_over_a']:.3f}; "
        f"families {', '.join(fams)}")
    agree["rescaled"] = agreement(both.latencies(), np.array([b_lat[k] for k in keys]) / agree["median_ratio_b_over_a"])
    est_b = {row_key(s): machine_estimate(s) for s in b}
    cal = {row_key(s): math.exp(machine_estimate(s) - est_b[row_key(s)]) for s in both}  # A's estimate / B's
    calibrated = all(math.isfinite(v) for v in cal.values())
    if calibrated:
        agree["calibrated"] = agreement(both.latencies(), np.array([b_lat[k] * cal[k] for k in keys]))
        log(f"each run read against its own calibration: within +-10% {agree['calibrated']['within_10pct']:.1%}, "
            f"rescaled {agree['rescaled']['within_10pct']:.1%}, "
            f"B/A {agree['calibrated']['median_ratio_b_over_a']:.3f}")
    else:
        log("one of the runs holds no calibration of its machine: no calibrated arm")

    kinds = [k.strip() for k in args.models.split(",") if k.strip() and k.strip() != "none"]
    scale = 1.0 / agree["median_ratio_b_over_a"]  # the rescaled arm: B x median A/B
    every = f"mean({','.join(names)})"
    rest = f"mean({','.join(names[:-1])})"
    last_vs_rest = f"re-measured ({names[-1]} as predictions of {rest})"
    arms = ["re-measured (B as predictions of A)", "re-measured, rescaled (B x median A/B)"]
    if calibrated:
        arms.append("re-measured, calibrated (B x estimate A/B)")
    arms += [f"re-measured ({n} as predictions of A)" for n in names[2:]]
    if rest_mean:
        arms.append(last_vs_rest)
    for k in kinds:
        arms += [f"{k} vs {n}" for n in names] + [f"{k} vs {every}"]
        if rest_mean:
            arms.append(f"{k} vs {rest}")
        if args.train_on_mean:
            arms += [f"{k} trained on {every}, vs {every}"]
        if rest_mean and args.train_on_rest:
            arms += [f"{k} trained on {rest}, vs {names[-1]}", f"{k} trained on {rest}, vs {rest}"]
    merged_train = merge_sittings(runs) if args.train_on_mean and kinds else None
    if merged_train is not None:
        log(f"merged sittings for training: {merged_train.merged}")
    rest_train = (merge_sittings(runs[:-1])
                  if args.train_on_rest and rest_mean and kinds else None)
    per: dict[str, dict[str, dict[str, Any]]] = {arm: {} for arm in arms}
    for i, fam in enumerate(fams):
        test = both.filter(lambda s, fam=fam: s.source == fam)
        if not len(test):
            continue
        b_pred = np.array([b_lat[row_key(s)] for s in test])
        per[arms[0]][fam] = evaluate_predictions(test, b_pred)
        per[arms[1]][fam] = evaluate_predictions(test, b_pred * scale)
        if calibrated:
            per[arms[2]][fam] = evaluate_predictions(test, b_pred * np.array([cal[row_key(s)] for s in test]))
        for n, m in zip(names[2:], lat[2:]):
            per[f"re-measured ({n} as predictions of A)"][fam] = evaluate_predictions(
                test, np.array([m[row_key(s)] for s in test]))
        if rest_mean:
            per[last_vs_rest][fam] = evaluate_predictions(with_labels(test, rest_mean),
                                                          np.array([lat[-1][row_key(s)] for s in test]))
        extra_train = extra.filter(lambda s, fam=fam: s.source != fam)
        train = a.filter(lambda s, fam=fam: s.source != fam) + extra_train
        for k in kinds:
            trainings = [] if args.no_base else [("", train)]
            if merged_train is not None:
                trainings.append(("mean", merged_train.filter(lambda s, fam=fam: s.source != fam) + extra_train))
            if rest_train is not None:
                trainings.append(("rest", rest_train.filter(lambda s, fam=fam: s.source != fam) + extra_train))
            for how, rows in trainings:
                log(f"[{i + 1}/{len(fams)}] {fam}: {k}{f' on merged sittings ({how})' if how else ''}, {len(rows)} training "
                    f"rows, {len(test)} scored")
                model = create_model(k)
                model.fit(rows)
                pred = np.asarray(model.predict(test.samples)[0], dtype=np.float64)
                if how == "mean":
                    per[f"{k} trained on {every}, vs {every}"][fam] = evaluate_predictions(with_labels(test, mean_lat), pred)
                    continue
                if how == "rest":
                    per[f"{k} trained on {rest}, vs {names[-1]}"][fam] = evaluate_predictions(with_labels(test, lat[-1]), pred)
                    per[f"{k} trained on {rest}, vs {rest}"][fam] = evaluate_predictions(with_labels(test, rest_mean), pred)
                    continue
                for n, m in zip(names, lat):
                    per[f"{k} vs {n}"][fam] = evaluate_predictions(with_labels(test, m), pred)
                per[f"{k} vs {every}"][fam] = evaluate_predictions(with_labels(test, mean_lat), pred)
                if rest_mean:
                    per[f"{k} vs {rest}"][fam] = evaluate_predictions(with_labels(test, rest_mean), pred)

    arms = [arm for arm in arms if per[arm]]  # --no-base leaves the base model's arms empty
    means = {arm: average_metrics(per[arm]) for arm in arms}
    side_by_side(f"mean over {len(fams)} held-out families, rows in every sitting",
                 {arm: {"": means[arm]} for arm in arms}, [""])
    side_by_side("re-measured, per family (raw / rescaled)", {f: {"raw": per[arms[0]].get(f, {}), "rescaled": per[arms[1]].get(f, {})}
                                                        for f in fams}, ["raw", "rescaled"])
    if args.json:
        out = {"command": " ".join(sys.argv), "db": str(args.db), "rerun": [str(p) for p in args.rerun],
               "extra_train_dbs": [str(p) for p in args.extra_train_db], "agreement": agree,
               "agreement_pairs": pairs, "rows_in_every_sitting": len(both), "families": fams,
               "mean": means, "per_family": per, "seconds": time.perf_counter() - t0}
        write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
