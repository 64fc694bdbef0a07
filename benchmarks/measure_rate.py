"""Candidates measured per minute, per backend, on a -tiny zoo model; and the boundary-cost table.

    .venv/bin/python benchmarks/measure_rate.py [--model resnet50-tiny] [--count 30] [--backends ...]

Every candidate is measured for real (fresh, in-memory cache only): compile,
correctness check against the reference, timing. The boundary table gives,
per ordered backend pair, the extra time of a hand-off in an executed chain
(measure/boundary.py), in microseconds, at 1 KiB, 64 KiB, 1 MiB and 4 MiB.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from collage_ml.backends import resolve_backends
from collage_ml.db import Database
from collage_ml.ir import import_model
from collage_ml.measure.boundary import BoundaryTable, measure_boundaries
from collage_ml.measure.runner import Runner

from measure_noise import pick  # noqa: E402  (benchmarks/ is the script's directory)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50-tiny")
    ap.add_argument("--count", type=int, default=30)
    ap.add_argument("--max-size", type=int, default=6)
    ap.add_argument("--backends", default="onnxruntime,openvino,torch,inductor")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-boundary", action="store_true")
    args = ap.parse_args()

    graph = import_model(args.model)
    ref = graph.reference()
    backends = resolve_backends(args.backends)
    console = Console()
    rate = Table(title=f"candidates per minute, {args.model}")
    for col in ("backend", "measured", "invalid", "per minute", "median compile s", "median latency ms"):
        rate.add_column(col)
    with tempfile.TemporaryDirectory() as tmp, Database(Path(tmp) / "m.db") as db:
        with Runner(db=db, threads=args.threads) as runner:
            for b in backends:
                cands = pick(graph, b, args.count, args.max_size)
                t0 = time.perf_counter()
                ms = runner.measure(cands, ref)
                dt = time.perf_counter() - t0
                valid = [m for m in ms if m.valid]
                comp = sorted(m.compile_seconds for m in ms if m.compile_seconds is not None)
                lat = sorted(m.median for m in valid)
                rate.add_row(
                    b.name, str(len(ms)), str(len(ms) - len(valid)), f"{60 * len(ms) / dt:.0f}",
                    f"{comp[len(comp) // 2]:.3f}" if comp else "-", f"{lat[len(lat) // 2] * 1e3:.3f}" if lat else "-",
                )
            console.print(rate)
            if not args.no_boundary:
                table = BoundaryTable(measure_boundaries(runner, backends))
                bt = Table(title="boundary cost per hand-off, microseconds (chain - first alone - second alone)")
                rows = table.rows()
                cols = ["from", "to"] + [k for k in rows[0] if k not in ("from", "to")] if rows else ["from", "to"]
                for c in cols:
                    bt.add_column(c)
                for r in rows:
                    bt.add_row(*(str(r.get(c, "")) for c in cols))
                console.print(bt)


if __name__ == "__main__":
    main()
