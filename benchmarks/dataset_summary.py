"""Which backend wins which op types, from a measurement database.

    .venv/bin/python benchmarks/dataset_summary.py datasets/cpu-2core-zen4/measurements.db

For every subgraph measured validly on onnxruntime and at least one other
backend (same hardware fingerprint), compares the medians. Single-node
subgraphs are grouped by op type, larger ones as "k-node regions". Prints,
per group: how many subgraphs, how often each backend is fastest, and the
geometric mean of each backend's latency over onnxruntime's (below 1 is
faster).
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict

from rich.console import Console
from rich.table import Table

from collage_ml.db import Database


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("db")
    ap.add_argument("--reference", default="onnxruntime")
    ap.add_argument("--plot", metavar="PNG", help="also write a bar chart of the geomean ratios here")
    ap.add_argument("--min-count", type=int, default=5, help="groups with fewer subgraphs are left out of the plot")
    args = ap.parse_args()
    with Database(args.db, readonly=True) as db:
        by_key: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
        nodes: dict[str, int] = {}
        ops: dict[str, str] = {}
        for m in db.measurements(valid=True):  # boundary costs live in their own table, never here
            by_key[(m.key.subgraph_hash, m.hardware)][m.key.backend] = m.median
            nodes[m.key.subgraph_hash] = int(m.extra.get("nodes", 0))
        for h in {h for h, _ in by_key}:
            if nodes.get(h) == 1:
                ops[h] = _single_op(db, h)
    groups: dict[str, list[dict[str, float]]] = defaultdict(list)
    for (h, _), lat in by_key.items():
        if args.reference not in lat or len(lat) < 2:
            continue
        n = nodes.get(h, 0)
        name = ops.get(h) or (f"{n}-node regions" if n <= 3 else "4+-node regions")
        groups[name].append(lat)
    backends = sorted({b for g in groups.values() for lat in g for b in lat})
    t = Table(title=f"fastest backend per subgraph, and geomean latency / {args.reference}")
    t.add_column("group")
    t.add_column("n")
    for b in backends:
        t.add_column(f"{b} wins")
    for b in backends:
        if b != args.reference:
            t.add_column(f"{b}/{args.reference}")
    ratios: dict[str, dict[str, float]] = {}
    for name, lats in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        wins = defaultdict(int)
        for lat in lats:
            wins[min(lat, key=lat.get)] += 1
        row = [name, str(len(lats))] + [str(wins[b]) for b in backends]
        for b in backends:
            if b == args.reference:
                continue
            r = [lat[b] / lat[args.reference] for lat in lats if b in lat]
            row.append(f"{math.exp(sum(map(math.log, r)) / len(r)):.2f} ({len(r)})" if r else "-")
            if r and len(lats) >= args.min_count:
                ratios.setdefault(name, {})[b] = math.exp(sum(map(math.log, r)) / len(r))
        t.add_row(*row)
    Console(width=200).print(t)
    if args.plot:
        plot(ratios, [b for b in backends if b != args.reference], args.reference, args.plot, args.db)
        print(f"wrote {args.plot}")


def plot(ratios: dict[str, dict[str, float]], backends: list[str], reference: str, path: str, title: str) -> None:
    """Grouped bars of geomean latency / reference per group (log scale; below 1 is faster)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("the plot needs matplotlib: pip install 'collage-ml[plots]'") from None
    groups = list(ratios)
    width = 0.8 / max(len(backends), 1)
    fig, ax = plt.subplots(figsize=(max(8, 0.7 * len(groups)), 4.5))
    for k, b in enumerate(backends):
        xs = [i + (k - (len(backends) - 1) / 2) * width for i in range(len(groups))]
        ys = [ratios[g].get(b, float("nan")) for g in groups]
        ax.bar(xs, ys, width, label=b)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=35, ha="right")
    ax.set_ylabel(f"geomean latency / {reference} (log)")
    ax.set_title(f"who wins what: {title}", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _single_op(db: Database, h: str) -> str | None:
    import onnx

    data = db.subgraph_onnx(h)
    if not data:
        return None
    m = onnx.load_from_string(data)
    return m.graph.node[0].op_type if len(m.graph.node) == 1 else None


if __name__ == "__main__":
    main()
