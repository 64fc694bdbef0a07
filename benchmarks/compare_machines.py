"""How much longer one machine runs the same kernels than others, per backend.

    .venv/bin/python benchmarks/compare_machines.py datasets/cpu-2core-xeon-amx-m5/measurements.db \\
        datasets/cpu-2core-zen4-m5/measurements.db datasets/cpu-2core-zen3-m5/measurements.db [--json OUT]

The first database is the machine under study; each other one is a reference. For every
(subgraph, backend) that both measured validly under the same protocol and version, the ratio of the
medians (study / reference) is taken; the table shows, per backend and over all backends, how many
pairs there are and the median and quartiles of that ratio (above 1: the study machine runs longer).
It also shows, per database, how often each backend is the fastest on the subgraphs measured on
every backend that database holds for it: which backend a machine favours.

Every database must hold a single hardware fingerprint (a shipped dataset does); rows that are
contended (``extra.contended``) are left out, as training leaves them out.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter, defaultdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

from collage_ml.db import Database


def load(path: str) -> tuple[str, dict[tuple[str, str, str, str], float]]:
    """(fingerprint, {(subgraph hash, backend, version, protocol): median seconds}) of a database's valid rows."""
    out: dict[tuple[str, str, str, str], float] = {}
    fps: set[str] = set()
    with Database(path, readonly=True) as db:
        for m in db.measurements(valid=True):
            if m.extra.get("contended") or not m.median or m.median <= 0:
                continue
            fps.add(m.hardware)
            out[(m.key.subgraph_hash, m.key.backend, m.key.backend_version, m.protocol)] = m.median
    if len(fps) != 1:
        raise SystemExit(f"{path}: expected one hardware fingerprint, found {len(fps)}: {sorted(fps)}")
    return fps.pop(), out


def ratios(study: dict, ref: dict) -> dict[str, list[float]]:
    by: dict[str, list[float]] = defaultdict(list)
    for k, v in study.items():
        w = ref.get(k)
        if w:
            by[k[1]].append(v / w)
            by["all"].append(v / w)
    return by


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    if len(xs) < 2:
        return (xs[0],) * 3 if xs else (float("nan"),) * 3
    q = statistics.quantiles(xs, n=4)
    return q[0], statistics.median(xs), q[2]


def fastest(rows: dict) -> Counter:
    """How often each backend is fastest over the subgraphs measured on every backend present in ``rows``."""
    by_sub: dict[str, dict[str, float]] = defaultdict(dict)
    for (h, b, _, _), v in rows.items():
        by_sub[h][b] = min(v, by_sub[h].get(b, v))
    region = {"onnxruntime", "openvino"}  # the two backends that run every candidate region
    wins: Counter = Counter()
    for h, per in by_sub.items():
        if region <= per.keys():
            wins[min(per, key=per.get)] += 1
    return wins


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("study")
    ap.add_argument("references", nargs="+")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args()
    console = Console()
    fp, study = load(args.study)
    result: dict = {"study": {"db": args.study, "fingerprint": fp, "rows": len(study)}, "references": []}
    rows_of = {args.study: study}
    for ref_path in args.references:
        rfp, ref = load(ref_path)
        rows_of[ref_path] = ref
        by = ratios(study, ref)
        t = Table(title=f"{Path(args.study).parent.name} / {Path(ref_path).parent.name}: median latency ratio per pair")
        for c in ("backend", "pairs", "p25", "median", "p75"):
            t.add_column(c, justify="right" if c != "backend" else "left")
        entry = {"db": ref_path, "fingerprint": rfp, "per_backend": {}}
        for b in sorted(by, key=lambda b: (b == "all", b)):
            lo, med, hi = quartiles(by[b])
            entry["per_backend"][b] = {"pairs": len(by[b]), "p25": lo, "median": med, "p75": hi}
            t.add_row(b, str(len(by[b])), f"{lo:.2f}", f"{med:.2f}", f"{hi:.2f}")
        console.print(t)
        result["references"].append(entry)
    t = Table(title="fastest backend per subgraph (subgraphs measured on onnxruntime and openvino at least)")
    t.add_column("database")
    names = ("inductor", "onnxruntime", "openvino", "torch")
    for b in names:
        t.add_column(b, justify="right")
    result["fastest"] = {}
    for p, rows in rows_of.items():
        wins = fastest(rows)
        total = sum(wins.values()) or 1
        result["fastest"][p] = dict(wins)
        t.add_row(Path(p).parent.name, *[f"{wins.get(b, 0) / total:.0%}" for b in names])
    console.print(t)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
