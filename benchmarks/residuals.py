"""Where a cost model's leave-one-family-out errors lie: by backend, latency band, region size and op mix.

    .venv/bin/python benchmarks/cost_model.py ... --save-preds P.npz
    .venv/bin/python benchmarks/residuals.py --preds P.npz --db D.db [--db ...] [--model xgb] [--json OUT]

``--preds`` is what ``benchmarks/cost_model.py --save-preds`` writes: per
model and held-out family, each test row's backend, subgraph hash, label
and prediction. ``--db`` names the databases the rows came from; their
``subgraphs`` tables (read-only) give each hash's op types and node count.
For every slice: rows, the share within +-10% (``|pred / true - 1| <= 0.1``,
as the cost-model metric counts it), the median absolute log error and the
median signed one (positive: predicted slower than measured), and the
slice's share of all rows outside +-10% (``of_misses``). A slice that holds
many misses and a signed bias is a feature the model lacks; a slice whose
errors scatter both ways is noise or missing data.
"""

from __future__ import annotations

import argparse
import math
import sqlite3
import sys
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cost_model import log, write_json  # noqa: E402  (benchmarks/ is not a package)

#: latency bands, upper bounds in seconds
BANDS = (10e-6, 30e-6, 100e-6, 300e-6, 1e-3, 3e-3, math.inf)
#: how many op mixes the table shows (the most frequent)
TOP_MIXES = 15


def band_name(upper: float, lower: float) -> str:
    def us(x: float) -> str:
        return f"{x * 1e6:g} us" if x < 1e-3 else f"{x * 1e3:g} ms"

    return f">= {us(lower)}" if math.isinf(upper) else f"{us(lower)}-{us(upper)}" if lower else f"< {us(upper)}"


def load_preds(path: Path, model: str) -> dict[str, np.ndarray]:
    """The model's rows over every held-out family, as flat arrays (``family`` added)."""
    try:
        z = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise SystemExit(f"residuals: {path}: not a predictions file ({e})") from None
    fams = sorted({k.split("/")[1] for k in z.files if k.startswith(f"{model}/")})
    if not fams:
        models = sorted({k.split("/")[0] for k in z.files})
        raise SystemExit(f"residuals: {path} holds no predictions of {model!r} (it has {', '.join(models) or 'none'})")
    if f"{model}/{fams[0]}/hash" not in z.files:
        raise SystemExit(f"residuals: {path} has no subgraph hashes; write it again with today's cost_model.py")
    cols = ("backend", "hash", "true", "pred")
    out = {c: np.concatenate([z[f"{model}/{f}/{c}"] for f in fams]) for c in cols}
    out["family"] = np.concatenate([np.full(len(z[f"{model}/{f}/true"]), f) for f in fams])
    return out


def subgraph_table(dbs: list[Path]) -> dict[str, tuple[str, int]]:
    """hash -> (ops, n_nodes) from the databases' ``subgraphs`` tables, opened read-only."""
    from collage_ml.db.sql import file_uri

    out: dict[str, tuple[str, int]] = {}
    for p in dbs:
        if not p.is_file():
            raise SystemExit(f"residuals: {p}: no such database")
        try:
            con = sqlite3.connect(file_uri(p, "ro"), uri=True)
            try:
                for h, ops, n in con.execute("SELECT hash, ops, n_nodes FROM subgraphs"):
                    out.setdefault(h, (ops or "", int(n or 0)))
            finally:
                con.close()
        except sqlite3.Error as e:
            raise SystemExit(f"residuals: {p}: cannot read its subgraphs table ({e})") from None
    return out


def mix_of(ops: str) -> str:
    """An op mix: the region's distinct op types, sorted ("Conv+Relu")."""
    return "+".join(sorted(set(o for o in ops.split(",") if o))) or "?"


def summarise(err: np.ndarray, miss: np.ndarray, sel: np.ndarray) -> dict[str, float]:
    n = int(sel.sum())
    if not n:
        return {"n": 0}
    e = err[sel]
    return {"n": n, "within_10pct": float((~miss[sel]).mean()), "median_abs_log_err": float(np.median(np.abs(e))),
            "median_log_err": float(np.median(e)), "of_misses": float(miss[sel].sum() / max(int(miss.sum()), 1))}


def slices(rows: dict[str, np.ndarray], table: dict[str, tuple[str, int]]) -> dict[str, dict[str, dict]]:
    true, pred = rows["true"].astype(np.float64), rows["pred"].astype(np.float64)
    err = np.log(pred / true)
    miss = np.abs(pred / true - 1) > 0.10
    info = [table.get(h, ("", 0)) for h in rows["hash"]]
    nodes = np.array([n for _, n in info])
    mixes = np.array([mix_of(o) if o else "?" for o, _ in info])
    out: dict[str, dict[str, dict]] = {"all": {"all": summarise(err, miss, np.ones(len(true), bool))}}
    out["backend"] = {b: summarise(err, miss, rows["backend"] == b) for b in sorted(set(rows["backend"]))}
    out["family"] = {f: summarise(err, miss, rows["family"] == f) for f in sorted(set(rows["family"]))}
    lo = 0.0
    out["latency"] = {}
    for hi in BANDS:
        out["latency"][band_name(hi, lo)] = summarise(err, miss, (true >= lo) & (true < hi))
        lo = hi
    out["nodes"] = {str(n) if n else "unknown": summarise(err, miss, nodes == n) for n in sorted(set(nodes))}
    common = [m for m, _ in Counter(mixes).most_common(TOP_MIXES)]
    out["op mix"] = {m: summarise(err, miss, mixes == m) for m in common}
    return out


def show(result: dict[str, dict[str, dict]]) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    for name, rows in result.items():
        t = Table(title=f"by {name}" if name != "all" else "all rows", title_justify="left")
        for col in (name, "rows", "within +-10%", "median |log err|", "median log err", "share of misses"):
            t.add_column(col, justify="left" if col == name else "right")
        for key, m in rows.items():
            if not m.get("n"):
                continue
            t.add_row(key, f"{m['n']:,}", f"{m['within_10pct']:.1%}", f"{m['median_abs_log_err']:.3f}",
                      f"{m['median_log_err']:+.3f}", f"{m['of_misses']:.1%}")
        con.print(t)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preds", type=Path, required=True, help="cost_model.py --save-preds output (.npz)")
    ap.add_argument("--db", type=Path, action="append", default=[], help="a database the rows came from")
    ap.add_argument("--model", default="xgb", help="which model's predictions (default: xgb)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    rows = load_preds(args.preds, args.model)
    table = subgraph_table(args.db)
    unknown = sum(h not in table for h in rows["hash"])
    log(f"{len(rows['true']):,} rows of {args.model}; {unknown:,} with no subgraph in the databases given")
    result = slices(rows, table)
    show(result)
    if args.json:
        write_json(args.json, {"preds": str(args.preds), "dbs": [str(p) for p in args.db], "model": args.model,
                               "slices": result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
