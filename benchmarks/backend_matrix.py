"""Backend-configuration matrix: each configuration's latency relative to the best, per op type and region kind.

    .venv/bin/python benchmarks/backend_matrix.py                      # read datasets/cpu-2core-zen4/measurements.db
    .venv/bin/python benchmarks/backend_matrix.py --measure --budget-minutes 90 --plot matrix.png
    .venv/bin/python benchmarks/backend_matrix.py --measure --quick --db /tmp/m.db   # smoke test

Configurations are backends (``onnxruntime[spin=on]``, ``openvino[streams=2]``;
see :mod:`collage_ml.backends.configs`), so each has its own rows in the
measurement database. For every subgraph measured validly by at least two of
the selected backend-configurations (same hardware fingerprint), each one's
median latency is divided by the best one's. The tables print, at batch 1 and
batch 16, the median of that ratio over the subgraphs of each group: single
nodes grouped by op type, larger subgraphs as 2-node, 3-node and 4+-node
regions. 1.00 means "always the best"; a cell's value is over the subgraphs
that configuration ran (``n`` is the group's size; ``-`` none).

The batch of a row comes from its pattern: ``random:<model>@b<batch>`` (no
``@`` is batch 1); rows of the enumerate sampler are batch 1.

``--measure`` first collects the named configurations (random sampler, batch
1 and 16) into ``--db`` with :func:`collage_ml.collector.collect`; rows that
exist already are cache hits. ``--plot`` writes a heat map (log2 of the ratio).
"""

from __future__ import annotations

import argparse
import math
import sqlite3
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DB = ROOT / "datasets" / "cpu-2core-zen4" / "measurements.db"
REGION_GROUPS = ("2-node regions", "3-node regions", "4+-node regions")


def batch_of(pattern: str) -> int:
    """``random:resnet50@b16`` -> 16; ``random:bert`` and enumerate patterns -> 1."""
    if pattern.startswith("random:") and "@b" in pattern:
        try:
            return int(pattern.rsplit("@b", 1)[1])
        except ValueError:
            return 1
    return 1


def group_of(nodes: int, ops: str | None) -> str:
    if nodes == 1 and ops:
        return ops.split(",")[0]
    if nodes <= 1:
        return "other ops"
    return REGION_GROUPS[min(nodes, 4) - 2]


def load_rows(db_path: Path, backends: list[str] | None, hardware: str | None):
    """{(hardware, hash): {backend: median}}, {hash: batch}, {hash: nodes}, the hardware used, invalid counts."""
    from collage_ml.db import Database

    lat: dict[str, dict[str, float]] = defaultdict(dict)
    batch: dict[str, int] = {}
    nodes: dict[str, int] = {}
    invalid: dict[str, int] = defaultdict(int)
    per_hw: dict[str, int] = defaultdict(int)
    with Database(db_path, readonly=True) as db:
        rows = [m for m in db.measurements() if backends is None or m.key.backend in backends]
    for m in rows:
        per_hw[m.hardware] += 1
    if not rows:
        return {}, {}, {}, hardware, invalid
    hw = hardware or max(per_hw, key=per_hw.get)
    for m in rows:
        if m.hardware != hw:
            continue
        h = m.key.subgraph_hash
        if not m.valid or m.median is None:
            invalid[m.key.backend] += 1
            continue
        lat[h][m.key.backend] = m.median
        batch[h] = batch_of(str(m.extra.get("pattern", "")))
        nodes[h] = int(m.extra.get("nodes", 0) or 0)
    return lat, batch, nodes, hw, invalid


def load_ops(db_path: Path, hashes: set[str]) -> dict[str, str]:
    """hash -> comma-separated op types, from the ``subgraphs`` table."""
    uri = f"file:{db_path}?mode=ro"
    con = sqlite3.connect(uri, uri=True)
    try:
        out = {h: ops for h, ops in con.execute("SELECT hash, ops FROM subgraphs") if h in hashes and ops}
    finally:
        con.close()
    return out


def matrix(lat, batch, nodes, ops, batches, min_count):
    """{batch: {group: {"n": count, backend: median ratio}}} and the backends seen."""
    cells: dict[int, dict[str, dict[str, list[float]]]] = {b: defaultdict(lambda: defaultdict(list)) for b in batches}
    counts: dict[int, dict[str, int]] = {b: defaultdict(int) for b in batches}
    backends: set[str] = set()
    for h, by in lat.items():
        b = batch.get(h, 1)
        if b not in cells or len(by) < 2:
            continue
        best = min(by.values())
        if not best > 0:
            continue
        g = group_of(nodes.get(h, 0), ops.get(h))
        counts[b][g] += 1
        for name, v in by.items():
            cells[b][g][name].append(v / best)
            backends.add(name)
    out: dict[int, dict[str, dict]] = {}
    for b in batches:
        groups: dict[str, dict] = {}
        small: dict[str, list[float]] = defaultdict(list)
        n_small = 0
        for g, per in cells[b].items():
            if g not in REGION_GROUPS and counts[b][g] < min_count:
                n_small += counts[b][g]
                for name, rs in per.items():
                    small[name].extend(rs)
                continue
            groups[g] = {"n": counts[b][g], **{name: statistics.median(rs) for name, rs in per.items()}}
        if n_small:
            groups[f"other ops (<{min_count} each)"] = {"n": n_small, **{k: statistics.median(v) for k, v in small.items()}}
        ordered = sorted((g for g in groups if g not in REGION_GROUPS), key=lambda g: (g.startswith("other"), -groups[g]["n"], g))
        ordered += [g for g in REGION_GROUPS if g in groups]
        out[b] = {g: groups[g] for g in ordered}
    return out, _order_backends(backends)


def _order_backends(names) -> list[str]:
    """Plain backends first, each followed by its configurations."""
    return sorted(names, key=lambda n: (n.split("[", 1)[0], "[" in n, n))


def print_tables(mat, backends, title: str) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(width=max(120, 24 + 14 * len(backends)))
    for b, groups in mat.items():
        t = Table(title=f"batch {b}: median latency / best backend-configuration per subgraph ({title})")
        t.add_column("group")
        t.add_column("n", justify="right")
        for name in backends:
            t.add_column(escape(name.replace("[", "\n[")), justify="right")
        for g, row in groups.items():
            cells = []
            for name in backends:
                v = row.get(name)
                cells.append("-" if v is None else (f"[bold]{v:.2f}[/bold]" if v == min(
                    (row[k] for k in backends if k in row), default=v) else f"{v:.2f}"))
            t.add_row(escape(g), str(row["n"]), *cells)
        if not groups:
            t.add_row("(no subgraph measured by two or more of these)", "0", *["-"] * len(backends))
        console.print(t)


def plot(mat, backends, path: str, title: str) -> None:
    """One heat map per batch: rows are groups, columns backend-configurations, colour log2(ratio)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
    except ImportError:
        raise SystemExit("the plot needs matplotlib: pip install 'collage-ml[plots]'") from None
    batches = list(mat)
    nrows = max([len(g) for g in mat.values()] + [1])
    fig, axes = plt.subplots(1, len(batches), figsize=(3.0 + 1.3 * (0.8 + 0.55 * len(backends)) * len(batches),
                                                       1.6 + 0.32 * nrows), squeeze=False, layout="constrained")
    vmax = 2.0  # log2: 4x slower than the best is the darkest
    im = None
    for ax, b in zip(axes[0], batches):
        groups = list(mat[b])
        data = np.full((len(groups), len(backends)), np.nan)
        for i, g in enumerate(groups):
            for j, name in enumerate(backends):
                v = mat[b][g].get(name)
                if v is not None:
                    data[i, j] = math.log2(v)
        im = ax.imshow(np.clip(data, 0, vmax), cmap="viridis_r", vmin=0, vmax=vmax, aspect="auto")
        for i in range(len(groups)):
            for j in range(len(backends)):
                if not np.isnan(data[i, j]):
                    ax.text(j, i, f"{2 ** data[i, j]:.2f}", ha="center", va="center", fontsize=6,
                            color="white" if data[i, j] > vmax * 0.6 else "black")
        ax.set_xticks(range(len(backends)))
        ax.set_xticklabels(backends, rotation=60, ha="right", fontsize=7)
        ax.set_yticks(range(len(groups)))
        ax.set_yticklabels([f"{g} ({mat[b][g]['n']})" for g in groups], fontsize=7)
        ax.set_title(f"batch {b}", fontsize=9)
    if im is not None:
        cb = fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, pad=0.02)
        cb.set_label("median latency / best (log2; 0 = best)", fontsize=8)
    fig.suptitle(f"backend-configurations relative to the best: {title}", fontsize=9)
    fig.savefig(path, dpi=130, bbox_inches="tight")


def measure(args, names: list[str]) -> None:
    from collage_ml.backends.base import resolve_backends
    from collage_ml.backends.onnxruntime_backend import check_pool_compatible
    from collage_ml.collector import collect
    from collage_ml.measure.timing import TimingConfig

    bs = resolve_backends(names)
    # the runner's one worker process measures every backend: pool=shared cannot share it with pool=own
    check_pool_compatible(bs)
    timing = TimingConfig(warmup=1, warmup_seconds=0.0, min_repeats=3, max_repeats=10, time_cap=0.3) if args.quick else None
    s = collect(
        models=args.models, backends=names, db=str(args.db), budget_minutes=args.budget_minutes,
        sampler="random", batch_sizes=args.batches, max_region_size=4, samples_per_graph=args.samples_per_graph,
        threads=args.threads, seed=args.seed, timing=timing, progress=not args.quiet,
    )
    print(f"measured {s.measured} new candidates ({s.cache_hits} cache hits) into {args.db}; stopped: {s.stopped}",
          file=sys.stderr)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path, default=DEFAULT_DB, help=f"measurement database (default {DEFAULT_DB.relative_to(ROOT)})")
    ap.add_argument("--backends", default=None,
                    help="backend-configurations, comma-separated (default: collage_ml.backends.configs' named "
                         "configurations of onnxruntime and openvino, plus torch and inductor when reading)")
    ap.add_argument("--batches", default="1,16", help="batch sizes to report (and measure); default 1,16")
    ap.add_argument("--hardware", default=None, help="hardware fingerprint (default: the one with most rows)")
    ap.add_argument("--min-count", type=int, default=3, help="op types with fewer subgraphs go to 'other ops'")
    ap.add_argument("--plot", metavar="PATH", help="write a heat map here (PNG/PDF/SVG)")
    ap.add_argument("--measure", action="store_true", help="collect the configurations into --db first")
    ap.add_argument("--models", default="all", help="models to sample with --measure (default: all full-size zoo models)")
    ap.add_argument("--budget-minutes", type=float, default=None, help="stop measuring after this long")
    ap.add_argument("--samples-per-graph", type=int, default=40, help="random subgraphs per (model, batch) with --measure")
    ap.add_argument("--threads", type=int, default=None, help="intra-op threads (default: physical cores)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: with --measure, resnet50-tiny, 6 subgraphs per batch, short timing, 2 minutes")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)

    from collage_ml.backends.base import split_backend_names
    from collage_ml.backends.configs import configured_names

    args.batches = [int(b) for b in args.batches.split(",") if b.strip()]
    if args.quick:
        if args.models == "all":
            args.models = "resnet50-tiny"
        args.samples_per_graph = min(args.samples_per_graph, 6)
        args.budget_minutes = args.budget_minutes if args.budget_minutes is not None else 2.0
    if args.backends:
        names = split_backend_names(args.backends)
    else:
        names = configured_names()
    if args.measure:
        measure(args, names)
        selected = names
    else:
        selected = names if args.backends else names + ["torch", "inductor"]
    from collage_ml.backends.base import get_backend

    selected = [get_backend(n).name for n in selected]  # canonical spellings, as stored
    if not args.db.exists():
        raise SystemExit(f"{args.db}: no such database (use --measure to make one)")
    lat, batch, nodes, hw, invalid = load_rows(args.db, selected, args.hardware)
    multi = {h for h, by in lat.items() if len(by) >= 2}
    ops = load_ops(args.db, {h for h in multi if nodes.get(h) == 1})
    mat, backends = matrix(lat, batch, nodes, ops, args.batches, args.min_count)
    title = f"{args.db.name}, {hw}"
    print_tables(mat, backends or selected, title)
    if invalid:
        print("invalid rows (left out): " + ", ".join(f"{k}: {v}" for k, v in sorted(invalid.items())))
    missing = [n for n in selected if n not in backends]
    if missing:
        print("no comparable rows for: " + ", ".join(missing) + (" (run with --measure)" if not args.measure else ""))
    if args.plot:
        plot(mat, backends or selected, args.plot, title)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
