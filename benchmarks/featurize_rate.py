"""How fast are candidates featurized? Target: 2,000 candidates/s for the flat (XGBoost) features.

    .venv/bin/python benchmarks/featurize_rate.py
    .venv/bin/python benchmarks/featurize_rate.py --models resnet50,bert --stored 500

Three measurements, each with the featurize caches cleared first
(``collage_ml.featurize.info._CACHE`` and ``collage_ml.featurize.flat._CACHE``),
so every subgraph is analysed from scratch:

1. **live, flat**: the candidates the placement search enumerates for each
   full-size zoo model at batch 1 (fresh ``SubGraph`` objects, so the
   structural hash is computed too), through ``subgraph_info`` and
   ``flat_matrix``. This is what placement pays; the target applies here.
   Enumeration itself is timed separately and not counted.
2. **stored, flat**: valid rows of a measurement database, from their stored
   ONNX bytes (``info_from_onnx``, once per subgraph) to ``flat_matrix``: what
   training from a database pays.
3. **live, graph**: the same live candidates through ``subgraph_info`` and
   ``graph_data`` (the GNN's ``torch_geometric`` inputs).

A subgraph offered to several backends is analysed once (per hash), so the
rates are per candidate, the unit the search asks for.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from collage_ml.backends import default_backends, get_backend  # noqa: E402
from collage_ml.candidates import enumerate_candidates  # noqa: E402
from collage_ml.featurize import flat as flat_mod  # noqa: E402
from collage_ml.featurize import info as info_mod  # noqa: E402
from collage_ml.featurize.flat import flat_matrix  # noqa: E402
from collage_ml.featurize.graph import graph_data  # noqa: E402
from collage_ml.featurize.hardware import HardwareDesc  # noqa: E402
from collage_ml.featurize.info import info_from_onnx, subgraph_info  # noqa: E402
from collage_ml.ir import zoo  # noqa: E402
from collage_ml.ir.importers import import_model  # noqa: E402

TARGET = 2000.0
DEFAULT_DB = ROOT / "datasets" / "cpu-2core-zen4" / "measurements.db"


def clear() -> None:
    info_mod._CACHE.clear()
    flat_mod._CACHE.clear()


def enumerate_fresh(graph, backends, max_region_size):
    t = time.perf_counter()
    cands = list(enumerate_candidates(graph, backends, max_region_size))
    return cands, time.perf_counter() - t


def live_flat(graph, backends, hw, max_region_size) -> tuple[int, int, float, float]:
    cands, t_enum = enumerate_fresh(graph, backends, max_region_size)
    clear()
    t = time.perf_counter()
    X = flat_matrix([(subgraph_info(c.subgraph), c.backend.name, hw) for c in cands])
    dt = time.perf_counter() - t
    assert X.shape[0] == len(cands)
    return len(cands), len(info_mod._CACHE), dt, t_enum


def live_graph(graph, backends, hw, max_region_size) -> tuple[int, float]:
    cands, _ = enumerate_fresh(graph, backends, max_region_size)
    clear()
    t = time.perf_counter()
    for c in cands:
        graph_data(subgraph_info(c.subgraph), c.backend.name, hw)
    return len(cands), time.perf_counter() - t


def stored_flat(db_path: Path, limit: int) -> tuple[int, int, float]:
    from collage_ml.db import Database

    with Database(db_path, readonly=True) as db:
        rows = []
        want: list[str] = []
        for m in db.measurements(valid=True):
            h = m.key.subgraph_hash
            if h not in want:
                if len(want) >= limit:
                    continue
                want.append(h)
            rows.append((h, m.key.backend, HardwareDesc.from_info(db.hardware_info(m.hardware), m.threads)))
        blobs = {h: db.subgraph_onnx(h) for h in want}
    clear()
    t = time.perf_counter()
    infos = {h: info_from_onnx(b, h) for h, b in blobs.items() if b is not None}
    X = flat_matrix([(infos[h], b, hw) for h, b, hw in rows if h in infos])
    dt = time.perf_counter() - t
    return X.shape[0], len(infos), dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=None, help="zoo models, comma-separated (default: every full-size one)")
    ap.add_argument("--backends", default=None, help="backends (default: the available CPU default set)")
    ap.add_argument("--max-region-size", type=int, default=3)
    ap.add_argument("--db", type=Path, default=DEFAULT_DB, help="database for the stored-ONNX rate")
    ap.add_argument("--stored", type=int, default=1000, metavar="N", help="distinct stored subgraphs to featurize")
    ap.add_argument("--no-graph", action="store_true", help="skip the graph (GNN) featurization rate")
    args = ap.parse_args()

    models = args.models.split(",") if args.models else [e.name for e in zoo.entries(include_tiny=False)]
    backends = [get_backend(b) for b in args.backends.split(",")] if args.backends else default_backends()
    hw = HardwareDesc.current()
    console = Console(width=None if sys.stdout.isatty() else 120)
    t = Table(title=f"featurization rate (caches cleared; backends {', '.join(b.name for b in backends)})")
    for col in ("what", "candidates", "subgraphs", "seconds", "candidates/s", "enumerate s"):
        t.add_column(col, justify="right" if col != "what" else "left")
    # warm up: imports (torch, torch_geometric) and lazy backend setup are not featurization
    wg = import_model("dcgan-tiny")
    w = next(iter(enumerate_candidates(wg, backends, args.max_region_size)))
    if not args.no_graph:
        graph_data(subgraph_info(w.subgraph), w.backend.name, hw)
    tot_n = tot_dt = 0.0
    graph_n = graph_dt = 0.0
    for name in models:
        g = import_model(name, batch=1)
        n, subs, dt, t_enum = live_flat(g, backends, hw, args.max_region_size)
        tot_n += n
        tot_dt += dt
        t.add_row(f"{name}: live, flat", str(n), str(subs), f"{dt:.3f}", f"{n / dt:,.0f}", f"{t_enum:.3f}")
        if not args.no_graph:
            gn, gdt = live_graph(g, backends, hw, args.max_region_size)
            graph_n += gn
            graph_dt += gdt
    live_rate = tot_n / tot_dt if tot_dt else 0.0
    t.add_row("[bold]all models: live, flat[/]", f"{tot_n:.0f}", "", f"{tot_dt:.3f}", f"[bold]{live_rate:,.0f}[/]", "")
    if not args.no_graph and graph_dt:
        t.add_row("all models: live, graph", f"{graph_n:.0f}", "", f"{graph_dt:.3f}", f"{graph_n / graph_dt:,.0f}", "")
    if args.db.exists() and args.stored > 0:
        n, subs, dt = stored_flat(args.db, args.stored)
        t.add_row(f"{args.db.parent.name}: stored ONNX, flat", str(n), str(subs), f"{dt:.3f}", f"{n / dt:,.0f}", "")
    console.print(t)
    ok = live_rate >= TARGET
    console.print(
        f"target {TARGET:,.0f} candidates/s (live, flat): "
        + (f"[green]PASS[/] ({live_rate:,.0f}/s)" if ok else f"[red]FAIL[/] ({live_rate:,.0f}/s)")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
