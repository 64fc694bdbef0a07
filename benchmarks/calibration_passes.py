"""One pass or a checked calibration: how far two calibrations of one machine, minutes apart, disagree.

    .venv/bin/python benchmarks/calibration_passes.py [--rounds 4] [--backends onnxruntime,openvino,torch,inductor]
        [--threads N] [--rows-db datasets/cpu-2core-zen4-m5/measurements.db] [--rows 3000] [--json OUT]

Every row a cost model reads on a machine is read through that machine's calibration (``measure.probes``): the
probe results are features, and the ``roofline-mean`` target divides each label by the roofline estimate the
probes give. So two calibrations of the same machine should tell the same story. This benchmark calibrates
this machine ``--rounds`` times in each of ``--kinds`` ways, alternating, each into a fresh database:

- ``single``: one pass over the probe set (``measure.probes.PASSES = 1``, the calibration before 2026-12-06);
- ``checked``: a pass, a second over every third probe (``CHECK_EVERY``), and for a backend whose two differ by
  over ``AGREE`` the rest of the second and a third whole pass (the default since 2026-12-06, 19:00 UTC);
- ``checked-full``: two whole passes, and a third where they differ (``CHECK_EVERY = 1``, 2026-12-06 before that).

For consecutive calibrations of one kind it reports how the two agree:

- ``probes_within_10pct``: the share of probe results within ±10% of the other calibration's;
- ``estimate_abs_log_median`` / ``_p95``: how far the machine's mean roofline estimate
  (``featurize.roofline.machine_log_estimate``) moves between them, over ``--rows`` candidates of
  ``--rows-db`` (any dataset: only the candidates' shapes are read), as |log(estimate B / estimate A)|;
- ``estimate_within_10pct``: the share of those candidates whose estimate moved by 10% or less.

The kinds alternate, so a slow quarter hour of the host falls on both. Nothing else should run meanwhile.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from collage_ml.backends.base import resolve_backends
from collage_ml.db import Database
from collage_ml.featurize.roofline import machine_log_estimate
from collage_ml.measure import probes
from collage_ml.measure.hardware import fingerprint, hardware_info
from collage_ml.measure.runner import Runner, default_threads
from collage_ml.models.dataset import Dataset

KINDS = {"single": (1, 1), "checked": (2, 3), "checked-full": (2, 1)}  # (PASSES, CHECK_EVERY)


def calibrate_once(backends, threads, kind: tuple[int, int], work: Path) -> tuple[dict, float, list[dict], int]:
    """({backend: {probe: seconds}}, seconds taken, the checks recorded, probe runs) of one calibration into a
    fresh database."""
    before = probes.PASSES, probes.CHECK_EVERY
    probes.PASSES, probes.CHECK_EVERY = kind
    try:
        with Database(work / "cal.db") as db, Runner(db=db, threads=threads) as r:
            t = time.perf_counter()
            table = probes.ensure_probes(r, backends)
            return table, time.perf_counter() - t, db.probe_checks(), r.measured
    finally:
        probes.PASSES, probes.CHECK_EVERY = before


def estimates(rows: Dataset, table: dict) -> np.ndarray:
    """The machine's mean roofline estimate (log seconds) of each row's candidate through ``table``."""
    order = probes.probe_names()
    per = [[table[b].get(n) for n in order] for b in sorted(table)]
    return np.array([machine_log_estimate(s.info, per) for s in rows])


def compare(a: dict, b: dict, rows: Dataset) -> dict:
    pa = {(bk, n): v for bk, t in a.items() for n, v in t.items() if v}
    pb = {(bk, n): v for bk, t in b.items() for n, v in t.items() if v}
    both = [k for k in pa if k in pb]
    r = np.abs(np.log([pb[k] / pa[k] for k in both]))
    ea, eb = estimates(rows, a), estimates(rows, b)
    ok = np.isfinite(ea) & np.isfinite(eb)
    d = np.abs(eb[ok] - ea[ok])
    return {"probes": len(both), "probes_within_10pct": float((r <= math.log(1.1)).mean()),
            "probe_abs_log_median": float(np.median(r)),
            "estimate_abs_log_median": float(np.median(d)), "estimate_abs_log_p95": float(np.quantile(d, 0.95)),
            "estimate_within_10pct": float((d <= math.log(1.1)).mean()), "rows": int(ok.sum())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4, help="calibrations of each kind (default 4)")
    ap.add_argument("--backends", default="onnxruntime,openvino,torch,inductor")
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"calibrations compared (default: {','.join(KINDS)})")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--rows-db", type=Path, default=Path("datasets/cpu-2core-zen4-m5/measurements.db"))
    ap.add_argument("--rows", type=int, default=3000)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.rounds < 2:
        raise SystemExit("calibration_passes: --rounds must be at least 2 (pairs of consecutive calibrations)")
    if not args.rows_db.exists():
        raise SystemExit(f"calibration_passes: no database at {args.rows_db}")
    kinds = {k: KINDS[k] for k in args.kinds.split(",") if k in KINDS}
    if len(kinds) != len(args.kinds.split(",")):
        raise SystemExit(f"calibration_passes: --kinds takes some of {', '.join(KINDS)}, not {args.kinds!r}")
    console = Console()
    backends = resolve_backends(args.backends)
    rows = Dataset.from_db(args.rows_db)
    rows = Dataset([rows.samples[i] for i in np.random.default_rng(0).permutation(len(rows))[: args.rows]])
    runs: dict[str, list[dict]] = {k: [] for k in kinds}
    for i in range(args.rounds):
        for kind, setting in kinds.items():
            with tempfile.TemporaryDirectory() as tmp:
                table, secs, checks, n_runs = calibrate_once(backends, args.threads, setting, Path(tmp))
            runs[kind].append({"started": time.strftime("%H:%M:%S", time.gmtime()), "seconds": secs,
                               "probe_runs": n_runs, "table": table,
                               "checks": [{k: c[k] for k in ("backend", "passes", "ratio")} for c in checks]})
            third = [c["backend"] for c in checks if c["passes"] >= 3]
            console.print(f"[dim]{kind} {i + 1}/{args.rounds}: {secs:.0f} s, {n_runs} probe runs"
                          + (f", a third pass on {', '.join(third)}" if third else "") + "[/]")
    pairs = {k: [compare(v[i]["table"], v[i + 1]["table"], rows) for i in range(len(v) - 1)] for k, v in runs.items()}
    t = Table(title="consecutive calibrations of one kind: how far they agree (mean over pairs)")
    cols = ("probes_within_10pct", "estimate_within_10pct", "estimate_abs_log_median", "estimate_abs_log_p95")
    heads = ("probes ±10%", "estimates ±10%", "estimate |log|, median", "p95")
    for c in ("kind", "seconds", "probe runs", *heads):
        t.add_column(c, justify="right")
    summary = {}
    for k, ps in pairs.items():
        summary[k] = {c: float(np.mean([p[c] for p in ps])) for c in cols}
        summary[k]["seconds"] = float(np.mean([r["seconds"] for r in runs[k]]))
        summary[k]["probe_runs"] = float(np.mean([r["probe_runs"] for r in runs[k]]))
        summary[k]["third_passes"] = sum(c["passes"] >= 3 for r in runs[k] for c in r["checks"])
        t.add_row(k, f"{summary[k]['seconds']:.0f}", f"{summary[k]['probe_runs']:.0f}",
                  *(f"{summary[k][c]:.3f}" for c in cols))
    console.print(t)
    threads = args.threads or default_threads()
    out = {"machine": hardware_info(threads), "fingerprint": fingerprint(threads), "backends": [b.name for b in backends],
           "rows_db": str(args.rows_db), "rows": len(rows), "agree": probes.AGREE, "kinds": kinds, "summary": summary,
           "pairs": pairs, "runs": runs}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))
        console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
