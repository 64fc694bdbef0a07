"""Does it matter which backends a machine was probed on? The relative columns against a subset's mean.

    .venv/bin/python benchmarks/probe_subsets.py [--hold zen3] [--json OUT]

The relative hardware columns (feature schema 3) compare a candidate's backend
with the mean over the machine's probed backends. Every dataset probes four
(onnxruntime, openvino, torch, inductor); ``place --backends a,b`` probes only
the two it places on, so the mean is over two. This benchmark trains XGBoost
(default parameters) on every dataset except those whose directory name
contains ``--hold`` (a CPU kind the model never saw), then scores the held-out
rows of each pair of backends three ways:

- ``all``: the machine's probes of all four backends (as in training);
- ``pair``: the probes of the pair only (what ``place --backends a,b`` gives);
- ``pair+imputed``: the pair's probes, plus the other backends' imputed from
  the training machines (each backend's mean offset from its machine's mean,
  per probe; the machine's mean estimated from the probed pair). An
  experiment arm, not in the library.

Scores are the cost-model metrics of ``collage_ml.models.evaluate``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from collage_ml.featurize.hardware import HardwareDesc  # noqa: E402
from collage_ml.featurize.roofline import PROBE_NAMES  # noqa: E402
from collage_ml.measure.hardware import hardware_info  # noqa: E402
from collage_ml.models.base import create_model  # noqa: E402
from collage_ml.models.dataset import Dataset  # noqa: E402
from collage_ml.models.evaluate import evaluate  # noqa: E402
from guided_vs_exhaustive import DATASETS  # noqa: E402  (every dataset the shipped models train on)

PAIRS = (("onnxruntime", "torch"), ("onnxruntime", "openvino"), ("openvino", "torch"), ("inductor", "onnxruntime"))
KEYS = ("pairwise_accuracy", "backend_choice_regret", "backend_pairwise_accuracy", "top1_regret", "mape", "within_10pct")


def log_row(vals) -> np.ndarray:
    """One backend's probe latencies as logs, NaN where a probe did not run."""
    return np.log(np.array([np.nan if v is None else v for v in vals], dtype=float))


def offsets(hws) -> dict[str, np.ndarray]:
    """Per backend: the mean over machines of log(probe) minus the machine's mean over its backends."""
    rows: dict[str, list[np.ndarray]] = {}
    for hw in hws:
        table = {b: log_row(vals) for b, vals in hw.probes}
        if len(table) < 2:
            continue
        mean = np.mean(list(table.values()), axis=0)
        for b, v in table.items():
            rows.setdefault(b, []).append(v - mean)
    return {b: np.nanmean(v, axis=0) for b, v in rows.items()}


def with_only(hw: HardwareDesc, keep, off: dict[str, np.ndarray] | None) -> HardwareDesc:
    table = dict(hw.probes)
    out = {b: dict(zip(PROBE_NAMES, table[b])) for b in keep if b in table}
    if off is not None:
        est = np.nanmean([log_row(table[b]) - off[b] for b in keep if b in table], axis=0)
        for b in off:
            if b not in out:
                out[b] = dict(zip(PROBE_NAMES, (float(x) if np.isfinite(x) else None for x in np.exp(est + off[b]))))
    return hw.with_probes(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hold", default="zen3", help="hold out the datasets whose directory name contains this")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    t0 = time.perf_counter()
    train, test = Dataset(), Dataset()
    for p in DATASETS:
        d = Dataset.from_db(p)
        if args.hold in p.parent.name:
            test = test + d
        else:
            train = train + d
    if not len(test):
        raise SystemExit(f"probe_subsets: no dataset directory contains {args.hold!r}")
    print(f"training on {len(train)} rows, scoring {len(test)} held-out rows ({args.hold})", flush=True)
    model = create_model("xgb").fit(train)
    off = offsets({s.hw for s in train if s.hw.probes})
    here = {k: v for k, v in hardware_info(2).items() if k in ("cpu_model", "cpu_id", "isa", "fingerprint")}
    results: dict = {"hold": args.hold, "n_train": len(train), "ran_on": here, "pairs": {}}
    for pair in PAIRS:
        rows = [s for s in test if s.backend in pair]
        arms = {}
        for arm, keep, o in (("all", None, None), ("pair", pair, None), ("pair+imputed", pair, off)):
            if keep is None:
                samples = rows
            else:
                cache: dict = {}
                for s in rows:
                    if s.hw not in cache:
                        cache[s.hw] = with_only(s.hw, keep, o)
                samples = [dataclasses.replace(s, hw=cache[s.hw]) for s in rows]
            m = evaluate(model, samples)
            arms[arm] = {k: m.get(k) for k in KEYS}
        results["pairs"]["+".join(pair)] = {"n": len(rows), **arms}
        print(f"\n{' + '.join(pair)} ({len(rows)} rows)")
        print(f"{'':16}" + "".join(f"{k[:18]:>20}" for k in KEYS))
        for arm, m in arms.items():
            print(f"{arm:16}" + "".join(f"{m[k]:>20.4f}" for k in KEYS))
    results["seconds"] = time.perf_counter() - t0
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1, default=str))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    from collage_ml.errors import CollageError

    try:
        sys.exit(main())
    except CollageError as e:  # a missing or corrupt database: one line
        raise SystemExit(f"probe_subsets: {e}")
