"""Exhaustive placement on the zoo: each single backend against the placed plan, side by side.

    .venv/bin/python benchmarks/e2e.py [--models all|a,b] [--backends ...] [--max-region-size 3]
        [--db .cache/e2e.db] [--out benchmarks/results/e2e.json]

For every model: each backend's native whole-model latency and the same
whole model through collage-ml's executor (both measured in this run), the
op-level DP plan and the chosen plan's end-to-end latency, the speed-up of
the chosen plan over the best single backend (end to end, same executor,
same run), the measurements made and the search time. The database makes
the run resumable; use a fresh --db to count measurements from scratch.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
from pathlib import Path

from rich.console import Console
from rich.table import Table

import collage_ml
from collage_ml.ir import zoo
from collage_ml.search.evolutionary import EvoConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="all")
    ap.add_argument("--backends", default="onnxruntime,openvino,torch,inductor")
    ap.add_argument("--max-region-size", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--generations", type=int, default=4, help="graph-level search generations")
    ap.add_argument("--no-graph-level", action="store_true")
    ap.add_argument("--db", default=".cache/e2e.db")
    ap.add_argument("--stale-after", type=float, default=None, metavar="HOURS",
                    help="rescale cache hits older than this by anchors timed again (place's stale_after_hours)")
    ap.add_argument("--no-in-context", action="store_true",
                    help="the DP prices plans as sums of parts timed alone (place's in_context=False)")
    ap.add_argument("--out", default="benchmarks/results/e2e.json")
    ap.add_argument("--table-only", action="store_true", help="print the table from --out without measuring")
    args = ap.parse_args()
    models = zoo.names(include_tiny=False) if args.models == "all" else args.models.split(",")
    console = Console(width=200)
    out = Path(args.out)
    results = json.loads(out.read_text()) if out.exists() else {}
    Path(args.db).parent.mkdir(parents=True, exist_ok=True)
    for m in [] if args.table_only else models:
        key = f"{m}@b{args.batch}"
        console.print(f"[bold]{key}[/]")
        pm = collage_ml.place(m, backends=args.backends, db=args.db, batch=args.batch,
                              max_region_size=args.max_region_size, threads=args.threads, progress=True,
                              log=lambda s: console.print(f"[dim]{s}[/]"), graph_level=not args.no_graph_level,
                              evo_config=EvoConfig(generations=args.generations),
                              stale_after_hours=args.stale_after, in_context=not args.no_in_context)
        results[key] = dict(pm.report)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1, default=str))
    from rich.markup import escape

    from collage_ml.backends.base import split_backend_names

    backends = split_backend_names(args.backends)
    t = Table(title=f"exhaustive placement, batch {args.batch}, {platform.processor() or platform.machine()}, "
                    f"max region {args.max_region_size}")
    for c in ["model"] + [f"{b} ms" for b in backends] + ["op-level ms", "two-level ms", "placed ms", "chosen",
                                                           "speed-up", "measured", "e2e runs", "search s"]:
        t.add_column(escape(c))
    speedups = []
    for m in models:
        r = results.get(f"{m}@b{args.batch}")
        if not r:
            continue
        e2e = r["baselines_e2e_ms"]
        row = [m] + [_fmt(e2e.get(b)) for b in backends]
        row += [_fmt(r.get("op_level_ms")), _fmt(r.get("graph_level_ms")), _fmt(r["plan_latency_ms"]), r["chosen"],
                f"{r['speedup_vs_best_single']:.3f}x" if r.get("speedup_vs_best_single") else "-",
                str(r["measurements"]), str(r.get("e2e_measurements", "-")), f"{r['search_seconds']:.0f}"]
        if r.get("speedup_vs_best_single"):
            speedups.append(r["speedup_vs_best_single"])
        t.add_row(*row)
    console.print(t)
    if speedups:
        g = math.exp(sum(math.log(s) for s in speedups) / len(speedups))
        console.print(f"geometric-mean speed-up over the best single backend: {g:.3f}x over {len(speedups)} models")


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.3f}"


if __name__ == "__main__":
    main()
